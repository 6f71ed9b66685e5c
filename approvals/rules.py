"""Routing rules, the pure part: does a rule match a request, and why (or why not).

The explanation is kept with each input request so the call page can show which rule matched and why the
ones before it did not. Tool annotations are the server's claims (read from tools/list), never facts.
"""

from __future__ import annotations

import fnmatch
import reprlib
from dataclasses import dataclass, field
from typing import Any

OPS = ("==", "!=", "in", "not in", "exists")
_MISSING = object()

# How an explanation quotes a value: an agent's argument may be as large as a body allows, and the explanation
# (one line per rule checked, kept with every request of the round) quoted it whole for each rule.
_SHOWN = reprlib.Repr()
_SHOWN.maxlevel, _SHOWN.maxdict, _SHOWN.maxlist, _SHOWN.maxstring, _SHOWN.maxlong = 3, 8, 8, 120, 60


@dataclass(frozen=True)
class Subject:
    """What a rule is matched against."""

    server_slug: str
    tool: str
    mode: str
    arguments: dict[str, Any]
    annotations: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Verdict:
    matched: bool
    why: str


def argument(arguments: dict[str, Any], path: str) -> Any:
    """A top-level or dotted argument (``target.environment``); _MISSING when absent."""
    value: Any = arguments
    for part in path.split("."):
        if not isinstance(value, dict) or part not in value:
            return _MISSING
        value = value[part]
    return value


KEYS = ("argument", "op", "value")


def check_condition(condition: Any) -> str:
    """Why a condition is malformed, or "". A key it does not know (``"val"``, ``"values"``) or a value
    missing where its op compares one is malformed, not ``== null``: a rule written so would never match
    what its author meant."""
    if not isinstance(condition, dict):
        return "a condition must be an object"
    if not isinstance(condition.get("argument"), str) or not condition["argument"]:
        return "a condition needs an argument name"
    op = condition.get("op", "==")
    if op not in OPS:
        return f"unknown op {condition.get('op')!r}; use one of {', '.join(OPS)}"
    unknown = sorted(str(key) for key in condition if key not in KEYS)
    if unknown:
        return f"unknown keys {', '.join(unknown)}; a condition has {', '.join(KEYS)}"
    if op != "exists" and "value" not in condition:
        return f"{op} needs a value"
    if op in ("in", "not in") and not isinstance(condition.get("value"), list):
        return f"{op} needs a list value"
    return ""


def same(a: Any, b: Any) -> bool:
    """JSON equality: Python's ``==`` but a boolean is never a number (``true`` is not ``1``, ``false`` not
    ``0``), at any depth. Numbers compare by value (``1`` is ``1.0``), as JSON Schema's ``const`` does."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[key], b[key]) for key in a)
    return bool(a == b)


def holds(condition: dict[str, Any], arguments: dict[str, Any], *, absent_differs: bool = False) -> Verdict:
    """Whether one condition holds for the arguments. An argument not given matches no value, so ``==`` and
    ``in`` fail for it; ``!=`` and ``not in`` fail too (a grant's and a routing rule's conditions: what the
    hub cannot see, a grant does not allow), unless `absent_differs` (a gate rule's: a rule that stops every
    value but some stops a call that names none, since the server's own default, which the hub cannot see,
    may be any of them)."""
    name, op = condition["argument"], condition.get("op", "==")
    expected: Any = condition.get("value")  # any JSON value; a list for in / not in (see check_condition)
    actual = argument(arguments, name)
    if op == "exists":
        return Verdict(actual is not _MISSING, f"{name} {'is' if actual is not _MISSING else 'is not'} given")
    if actual is _MISSING:
        if absent_differs and op in ("!=", "not in"):
            return Verdict(
                True, f"{name} is not given ({op} {_SHOWN.repr(expected)}: the server's default is unseen)"
            )
        return Verdict(False, f"{name} is not given")
    if op in ("==", "!="):
        ok = same(actual, expected) == (op == "==")
    else:
        ok = any(same(actual, choice) for choice in expected) == (op == "in")
    shown = f"{name} is {_SHOWN.repr(actual)}"
    return Verdict(ok, f"{shown} ({'' if ok else 'not '}{op} {_SHOWN.repr(expected)})")


def shown(text: str) -> str:
    """An agent's or a server's name as an explanation quotes it: each character that is not printable
    (direction overrides, zero-width and control characters) as a visible code, ``⟨U+202E⟩``, so that the
    line reads as the hub wrote it wherever it is shown."""
    return "".join(char if char.isprintable() else f"\u27e8U+{ord(char):04X}\u27e9" for char in str(text))


def _said(annotations: dict[str, Any], hint: str) -> bool | None:
    """What the server says of `hint`: a JSON boolean, or None (not said; ``"false"``, ``0`` say nothing)."""
    value = annotations.get(hint)
    return value if isinstance(value, bool) else None


def _word(value: bool) -> str:
    return str(value).lower()


def read_hints(annotations: Any) -> dict[str, tuple[bool, str]]:
    """The tool's hints as rules match them, each with why: the server's claims, read so that they only ever
    ask for more care. A hint not said (or not a boolean) takes MCP's default, the careful one: not
    read-only, destructive, open world. A tool is read-only only when its server says so and does not also
    say it is destructive; it is destructive unless its server says it is not, or says it is read-only."""
    said = annotations if isinstance(annotations, dict) else {}
    read_only, destructive = _said(said, "readOnlyHint"), _said(said, "destructiveHint")
    open_world = _said(said, "openWorldHint")
    out: dict[str, tuple[bool, str]] = {}
    if read_only is None:
        out["readOnlyHint"] = (False, "the server does not say readOnlyHint: taken as false")
    elif read_only and destructive:
        out["readOnlyHint"] = (False, "server says readOnlyHint=true and destructiveHint=true: not read-only")
    else:
        out["readOnlyHint"] = (read_only, f"server says readOnlyHint={_word(read_only)}")
    if destructive is not None:
        out["destructiveHint"] = (destructive, f"server says destructiveHint={_word(destructive)}")
    elif read_only:
        out["destructiveHint"] = (False, "server says readOnlyHint=true: not destructive")
    else:
        out["destructiveHint"] = (True, "the server does not say destructiveHint: taken as true")
    if open_world is None:
        out["openWorldHint"] = (True, "the server does not say openWorldHint: taken as true")
    else:
        out["openWorldHint"] = (open_world, f"server says openWorldHint={_word(open_world)}")
    return out


def evaluate(rule: Any, subject: Subject) -> Verdict:
    """Match one rule (a RoutingRule or anything with the same attributes) against a request."""
    if not rule.enabled:
        return Verdict(False, "disabled")
    if rule.server_id is not None and rule.server.slug != subject.server_slug:
        return Verdict(False, f"server is {shown(subject.server_slug)}, not {rule.server.slug}")
    if not fnmatch.fnmatchcase(subject.tool, rule.tool_pattern or "*"):
        return Verdict(False, f"tool {shown(subject.tool)} does not match {rule.tool_pattern}")
    if rule.mode and rule.mode != subject.mode:
        return Verdict(False, f"mode is {shown(subject.mode)}, not {rule.mode}")
    reasons = [f"tool {shown(subject.tool)} matches {rule.tool_pattern or '*'}"]
    hints = read_hints(subject.annotations)
    for attribute, hint in (
        ("destructive", "destructiveHint"),
        ("read_only", "readOnlyHint"),
        ("open_world", "openWorldHint"),
    ):
        wanted = getattr(rule, attribute)
        if wanted is None:
            continue
        value, why = hints[hint]
        if value != wanted:
            return Verdict(False, why)
        reasons.append(why)
    gate = bool(getattr(rule, "gate", False))
    for condition in rule.conditions or []:
        problem = check_condition(condition)
        if problem and gate:
            # What a gate stops cannot be read: it stops the call (a person decides), never lets it go.
            reasons.append(
                f"malformed condition ({problem}): the gate stops the call until the rule is fixed"
            )
            continue
        if problem:
            return Verdict(False, f"malformed condition: {problem}")
        verdict = holds(condition, subject.arguments, absent_differs=gate)
        if not verdict.matched:
            return verdict
        reasons.append(verdict.why)
    return Verdict(True, "; ".join(reasons))
