"""Routing rules, the pure part: does a rule match a request, and why (or why not).

The explanation is kept with each input request so the call page can show which rule matched and why the
ones before it did not. Tool annotations are the server's claims (read from tools/list), never facts.

A condition on the arguments is read for what its rule does (`holds`): a gate rule's stops any value a lenient
server may read as the one it names (``"Production "`` for ``"production"``, ``"yes"`` for ``true``), a
grant's lets through no value a lenient server may read as one it excludes, and a routing rule's compares as
JSON does.
"""

from __future__ import annotations

import contextlib
import fnmatch
import functools
import json
import math
import re
import reprlib
import unicodedata
from dataclasses import dataclass, field
from typing import Any

OPS = ("==", "!=", "in", "not in", "exists")
# How a condition is read: a gate rule's stops what it matches, a grant's lets it through, a routing rule's
# picks a team (`holds`).
ROLES = ("stop", "allow", "route")
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


def argument(arguments: dict[str, Any], path: str, *, decode: bool = False) -> Any:
    """A top-level or dotted argument (``target.environment``); _MISSING when absent. With `decode`, an
    object given as JSON text (``"target": "{\\"environment\\": ...}"``) is looked into, as a lenient
    server reads it (`alike`)."""
    value: Any = arguments
    for part in path.split("."):
        if decode and isinstance(value, str):
            value = _decoded(value)
        if not isinstance(value, dict) or part not in value:
            return _MISSING
        value = value[part]
    return value


KEYS = ("argument", "op", "value")


def check_condition(condition: Any) -> str:
    """Why a condition is malformed, or "". A key it does not know (``"val"``, ``"values"``), a value
    missing where its op compares one (not ``== null``) or given to ``exists`` (not ``exists: false``) is
    malformed: a rule written so would never match what its author meant."""
    if not isinstance(condition, dict):
        return "a condition must be an object"
    if not isinstance(condition.get("argument"), str) or not condition["argument"]:
        return "a condition needs an argument name"
    if any(not part or part != part.strip() for part in condition["argument"].split(".")):
        # ``"environment "`` or ``"target..environment"`` names no argument a call gives: a gate rule
        # written so would never stop anything.
        return (
            f"argument {_SHOWN.repr(shown(condition['argument']))} is not a name, or names joined by dots, "
            "without spaces around them"
        )
    op = condition.get("op", "==")
    if op not in OPS:
        return f"unknown op {condition.get('op')!r}; use one of {', '.join(OPS)}"
    unknown = sorted(str(key) for key in condition if key not in KEYS)
    if unknown:
        return f"unknown keys {', '.join(unknown)}; a condition has {', '.join(KEYS)}"
    if op != "exists" and "value" not in condition:
        return f"{op} needs a value"
    if op == "exists" and "value" in condition:
        # ``{"op": "exists", "value": false}`` reads as "not given" to its author, and held for a given one.
        return "exists takes no value: it holds when the argument is given"
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


# What a lenient server reads (the MCP Python SDK's, with pydantic's lax mode, is one): a number or a boolean
# written as a string, 1 and 0 as true and false, JSON text given for an object or a list, and strings
# whatever their case, spacing, Unicode form or invisible format characters (many servers lower-case or
# strip a name before they use it).
_TRUE = frozenset({"true", "1", "yes", "on", "t", "y"})
_FALSE = frozenset({"false", "0", "no", "off", "f", "n"})
_NUMBER = re.compile(r"[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?")
_DEEPEST = 32  # values are not alike below this depth (a condition's value is at most 16 deep)


def _fold(text: str) -> str:
    """A string as a lenient server may compare it: NFKC, format characters (zero-width, direction marks)
    dropped, case folded, whitespace trimmed and each run of it one space."""
    text = unicodedata.normalize("NFKC", text)
    text = "".join(char for char in text if unicodedata.category(char) != "Cf")
    return " ".join(text.casefold().split())


@functools.lru_cache(maxsize=8)
def _decoded(text: str) -> Any:
    """JSON text holding an object or a list, decoded; anything else as it is. Kept for the few last ones, as
    each rule checked reads the same arguments (only read, never changed)."""
    if not text.lstrip().startswith(("{", "[")):
        return text
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return text


def _number_tokens(number: int | float) -> set[tuple[str, Any]]:
    """A number by its value, and as a server parsing JSON numbers into doubles reads it (``2**53 + 1`` is
    then ``2**53``); not a number (NaN, infinities) reads as nothing."""
    if isinstance(number, float) and not math.isfinite(number):
        return set()
    tokens: set[tuple[str, Any]] = {("n", number)}
    with contextlib.suppress(OverflowError):
        tokens.add(("n", float(number)))
    if number in (0, 1):
        tokens.add(("b", bool(number)))
    return tokens


@functools.lru_cache(maxsize=16)
def _string_tokens(text: str) -> frozenset[tuple[str, Any]]:
    """`_tokens` of a string; kept for the few last ones, as each rule checked reads the same arguments."""
    folded = _fold(text)
    tokens: set[tuple[str, Any]] = {("s", folded)}
    if folded in _TRUE or folded in _FALSE:
        tokens.add(("b", folded in _TRUE))
    if folded == "null":
        tokens.add(("null", None))
    if _NUMBER.fullmatch(folded):
        try:
            tokens |= _number_tokens(int(folded) if folded.lstrip("+-").isdigit() else float(folded))
        except ValueError:  # more digits than Python reads as an int
            tokens |= _number_tokens(float(folded))
    return frozenset(tokens)


def _tokens(value: Any) -> frozenset[tuple[str, Any]]:
    """Each reading of a scalar value, as hashable tokens: two scalars are alike when they share one."""
    if value is None:
        return frozenset({("null", None)})
    if isinstance(value, bool):
        return frozenset({("b", value), ("n", int(value))})
    if isinstance(value, int | float):
        return frozenset(_number_tokens(value))
    if isinstance(value, str):
        return _string_tokens(value)
    return frozenset()


def _alike(a: Any, b: Any, depth: int) -> bool:
    """`alike`, lazily: JSON text is decoded only when compared with a list or an object, and lists of
    another length or objects with other keys are told apart before their members are read."""
    if depth > _DEEPEST:
        return False  # deeper than any condition's value
    if isinstance(a, str) and isinstance(b, list | dict):
        a = _decoded(a)
    elif isinstance(b, str) and isinstance(a, list | dict):
        b = _decoded(b)
    if isinstance(a, list) or isinstance(b, list):
        if not (isinstance(a, list) and isinstance(b, list)) or len(a) != len(b):
            return False
        return all(_alike(x, y, depth + 1) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) or isinstance(b, dict):
        if not (isinstance(a, dict) and isinstance(b, dict)) or a.keys() != b.keys():
            return False
        return all(_alike(a[key], b[key], depth + 1) for key in a)
    return bool(_tokens(a) & _tokens(b))


def alike(a: Any, b: Any) -> bool:
    """Whether a lenient server may read `a` and `b` as the same value (see above): ``"Production "`` is
    ``"production"``, ``1`` and ``"yes"`` are ``true``, ``"0"`` is ``0``, ``'{"env": "prod"}'`` is
    ``{"env": "prod"}``. Object keys are matched exactly. `same` values are always alike."""
    return same(a, b) or _alike(a, b, 0)


def holds(condition: dict[str, Any], arguments: dict[str, Any], *, role: str = "allow") -> Verdict:
    """Whether one condition holds for the arguments, read for its `role` (`ROLES`), so that a value written
    another way never slips past what the condition means:

    ``stop`` (a gate rule's: what it matches waits for a person): ``==``, ``in`` and ``exists`` hold for any
    value a lenient server may read as one named (`alike`: ``"Production "`` for ``"production"``, ``1`` or
    ``"yes"`` for ``true``, an object given as JSON text); ``!=`` and ``not in`` for any value that is not
    one named as JSON, and for an argument not given, since the server's own default, which the hub cannot
    see, may be any value. ``allow`` (a grant's: what it matches goes without a person): ``==`` and ``in`` as
    JSON does (`same`), ``!=`` and ``not in`` only for a value no lenient server reads as one named, and an
    argument not given meets none. ``route`` (a routing rule's: it picks a team): JSON equality both ways,
    and an argument not given meets no op but ``exists``."""
    if role not in ROLES:
        raise ValueError(f"unknown role {role!r}")
    name, op = condition["argument"], condition.get("op", "==")
    expected: Any = condition.get("value")  # any JSON value; a list for in / not in (see check_condition)
    actual = argument(arguments, name, decode=role == "stop")
    if op == "exists":
        return Verdict(actual is not _MISSING, f"{name} {'is' if actual is not _MISSING else 'is not'} given")
    if actual is _MISSING:
        if role == "stop" and op in ("!=", "not in"):
            return Verdict(
                True, f"{name} is not given ({op} {_SHOWN.repr(expected)}: the server's default is unseen)"
            )
        return Verdict(False, f"{name} is not given")
    choices = expected if op in ("in", "not in") else [expected]
    equal = any(same(actual, choice) for choice in choices)
    shown = f"{name} is {_SHOWN.repr(actual)}"
    # The careful side of each role: a gate's "is" and a grant's "is not" read the value as a server may.
    careful = (role == "stop" and op in ("==", "in")) or (role == "allow" and op in ("!=", "not in"))
    if careful and not equal:
        read = actual
        if isinstance(read, str) and any(isinstance(choice, list | dict) for choice in choices):
            read = _decoded(read)  # once, whatever the number of choices
        if any(_alike(read, choice, 0) for choice in choices):
            if role == "stop":
                return Verdict(True, f"{shown} ({op} {_SHOWN.repr(expected)}, as a lenient server reads it)")
            named = f"one of {_SHOWN.repr(expected)}" if op == "not in" else _SHOWN.repr(expected)
            return Verdict(False, f"{shown} (a lenient server may read it as {named})")
    ok = equal == (op in ("==", "in"))
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
        verdict = holds(condition, subject.arguments, role="stop" if gate else "route")
        if not verdict.matched:
            return verdict
        reasons.append(verdict.why)
    return Verdict(True, "; ".join(reasons))
