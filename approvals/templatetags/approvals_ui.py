"""Template helpers for text that comes from servers and agents: shown in full, escaped, never linked."""

from __future__ import annotations

import html
import json
from datetime import datetime
from typing import Any

from django import template
from django.urls import NoReverseMatch, reverse
from django.utils.html import json_script
from django.utils.safestring import SafeString, mark_safe
from django.utils.translation import gettext as _

from approvals import schema_forms
from approvals.visible import SHOWN_AS_CODE, run_shown

register = template.Library()

FOLD_LINES = 12
FOLD_CHARS = 1200


def _reveal(text: str, plain: bool) -> str:
    """The text escaped as Django's ``escape`` does, run by run; each character to show as a code, coded.
    (Every string from a server or an agent passes here, on every page and queue card.)"""
    out, start = [], 0
    for found in SHOWN_AS_CODE.finditer(text):
        out.append(html.escape(text[start : found.start()]))
        out.append(run_shown(found.group(), plain))
        start = found.end()
    out.append(html.escape(text[start:]))
    return "".join(out)


@register.filter
def reveal(value: Any, where: str = "") -> SafeString:
    """Escape the text and show invisible and direction-changing characters as visible codes.

    Every string from a server or an agent goes through this filter wherever it is shown. ``reveal:"text"``
    is for places that hold text only (``<title>``, ``<option>``): the code is plain text, ``⟨U+202E⟩``.
    """
    text = "" if value is None else str(value)
    return mark_safe(_reveal(text, plain=where == "text"))  # noqa: S308  (every char escaped)


@register.filter
def pretty_json(value: Any) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=False)


@register.filter
def is_long(text: str) -> bool:
    return text.count("\n") >= FOLD_LINES or len(text) > FOLD_CHARS


@register.filter
def head(text: str) -> str:
    """The first lines of a long text, for the folded view (the full text is one click away)."""
    return "\n".join(text.splitlines()[:FOLD_LINES])[:FOLD_CHARS]


@register.filter
def get_item(mapping: Any, key: Any) -> Any:
    return mapping.get(str(key), []) if isinstance(mapping, dict) else []


@register.simple_tag
def optional_url(name: str, fallback: str) -> str:
    """reverse(name), or `fallback` while the page it names does not exist yet."""
    try:
        return reverse(name)
    except NoReverseMatch:
        return fallback


@register.filter
def excerpt(value: Any, length: int = 140) -> str:
    """The first line of a server's message, cut to `length` characters."""
    text = ("" if value is None else str(value)).strip()
    first = text.splitlines()[0] if text else ""
    if len(first) > length or first != text:
        return first[:length].rstrip() + "…"
    return first


@register.filter
def without(names: Any, name: str) -> list[str]:
    return [item for item in names or [] if item != name]


@register.filter
def suggested(field: Any) -> str:
    """The server's default as a reviewer reads it ("" when there is none worth showing)."""
    default = field.default
    if default is None or default == "" or default == []:
        return ""
    if isinstance(default, bool):
        return str(_("yes") if default else _("no"))
    labels = dict(field.choices)
    if isinstance(default, list):
        return ", ".join(str(labels.get(item, item)) for item in default)
    return str(labels.get(default, default))


@register.filter
def suggested_moment(field: Any) -> str:
    """A date-time field's suggested value as an instant (ISO 8601 with its offset), for the page to show on
    the reader's clock as the field itself does; "" when it is not one (no offset: no instant to move)."""
    if getattr(field, "kind", "") != "datetime" or not isinstance(field.default, str):
        return ""
    try:
        moment = datetime.fromisoformat(field.default.strip().upper())
    except ValueError:
        return ""
    return moment.isoformat() if moment.tzinfo is not None else ""


@register.filter
def answer_items(ir: Any) -> list[tuple[str, Any]]:
    """(key, value) pairs of an accepted answer, with values of credential-like fields hidden."""
    if not isinstance(ir.content, dict):
        return []
    secret = set(schema_forms.sensitive_fields(ir.form_schema))
    return [(key, _("(hidden)") if key in secret else value) for key, value in ir.content.items()]


@register.filter
def show_value(value: Any) -> str:
    if isinstance(value, bool):
        return str(_("yes") if value else _("no"))
    if isinstance(value, list):
        return ", ".join(str(item) for item in value)
    return str(value)


@register.filter
def grant_state(grant: Any, now: Any = None) -> str:
    return str(grant.state(now))


@register.filter
def condition_text(condition: Any) -> str:
    """A grant's condition as a reviewer reads it: ``environment == "production"``."""
    if not isinstance(condition, dict):
        return str(condition)
    name, op = condition.get("argument", "?"), condition.get("op", "==")
    if op == "exists":
        return f"{name} is given"
    return f"{name} {op} {json.dumps(condition.get('value'), ensure_ascii=False)}"


@register.filter
def grant_conditions(arguments: Any) -> list[dict[str, str]]:
    """The conditions the approve form offers for a grant: each top-level argument equal to its value now,
    as the text shown and the JSON the form posts (``grants.parse_choice`` reads it back). A name with a dot
    is left out: a condition reads ``a.b`` as the argument ``b`` inside ``a`` (`rules.argument`), so it could
    never hold."""
    if not isinstance(arguments, dict):
        return []
    offered = []
    for name, value in arguments.items():
        if "." in str(name):
            continue
        condition = {"argument": str(name), "op": "==", "value": value}
        offered.append({"name": str(name), "text": condition_text(condition), "json": json.dumps(condition)})
    return offered


@register.filter
def server_claims(call: Any) -> list[str]:
    """What the server says about its tool (annotations) in its list as the hub holds it: claims, not
    facts."""
    return annotation_claims(call.tool_annotations)


@register.filter
def annotation_claims(hints: Any) -> list[str]:
    """What these annotations claim of a tool (a gate's: the definition its approval is bound to)."""
    if not isinstance(hints, dict):
        return []
    claims = []
    if hints.get("destructiveHint"):
        claims.append(str(_("may make destructive changes")))
    if hints.get("readOnlyHint"):
        claims.append(str(_("only reads")))
    if hints.get("idempotentHint"):
        claims.append(str(_("is safe to repeat")))
    if hints.get("openWorldHint"):
        claims.append(str(_("reaches outside systems")))
    return claims


def _ui_strings() -> dict[str, str]:
    return {
        "live": _("Live"),
        "reconnecting": _("Reconnecting…"),
        "updated": _("Updated %(ago)s ago"),
        "left": _("%(time)s left"),
        "expired": _("Deadline passed"),
        "deadlineClose": _("%(time)s left to answer this request"),
        "deadlinePassed": _("The deadline passed: this request can no longer be answered."),
        "waiting": _("waiting %(time)s"),
        "newRequest": _("New request from %(server)s: %(tool)s"),
        "newBehind": _("New request from %(server)s: %(tool)s, waiting behind the ones due sooner"),
        "decided": _("A request was answered"),
        "problem": _("There is a problem"),
        "required": _("This field is required"),
        "wholeNumber": _("Enter a whole number"),
        "number": _("Enter a number"),
        "atLeast": _("Must be at least %(limit)s"),
        "atMost": _("Must be at most %(limit)s"),
        "minLength": _("Enter at least %(count)s characters"),
        "maxLength": _("Enter at most %(count)s characters"),
        "minItems": _("Choose at least %(count)s options"),
        "maxItems": _("Choose at most %(count)s options"),
        "email": _("Enter an email address like name@example.com"),
        "url": _("Enter a full web address like https://example.com"),
        "date": _("Enter a real date as YYYY-MM-DD"),
        "datetime": _("Enter a date and time, like 2026-12-02 10:30"),
        "sending": _("Sending…"),
        "opened": _("Opened in a new tab. Waiting for the server…"),
        "locked": _("This request was answered elsewhere; the form is locked. What you typed is kept."),
        "newCount": _("%(count)s new"),
    }


@register.simple_tag
def ui_strings() -> str:
    """The page script's own words, translated like every other hub string."""
    return json_script(_ui_strings(), "ui-strings")
