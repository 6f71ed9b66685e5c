"""A second look before a risky approval, in the browser.

UX.md: production or destructive requests get a second step that restates the effect before the final
button. A request needs one when the hub's own policy rates it high risk, or when the server says its
tool may make destructive changes (a claim the hub cannot check, but one that only ever asks for more
care, never less).

The browser's first "Approve and send" of such a request is answered with the same page: the values read
back as they will be sent, the effect restated, and a signed token in the form, bound to the request, the
reviewer and the exact values (their canonical JSON's digest). Only a submit whose values match its
token's is sent on; a value changed after the review is shown for review again. A token lasts MAX_AGE
seconds. The REST API asks for no second step: its callers are programs, which a restated sentence does
not protect.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import json
from dataclasses import dataclass
from typing import Any

from django.core import signing
from django.utils.translation import gettext as _

from approvals import canonical, safejson
from approvals.models import Gate, InputRequest, Policy, ToolCall
from approvals.services.gate_checks import GATE_METHOD

FIELD = "reviewed"
MAX_AGE = 15 * 60
_SALT = "approvals.second_look"


def _bound_tool(ir: InputRequest) -> dict[str, Any] | None:
    """The tool definition a gate's approval is bound to (its gate's, as the hub held it when the gate
    opened), or None for a request that is no gate."""
    if ir.method != GATE_METHOD:
        return None
    tool = Gate.objects.filter(round_id=ir.round_id).values_list("tool", flat=True).first()
    return tool if isinstance(tool, dict) else None


def reasons(ir: InputRequest, call: ToolCall, tool: dict[str, Any] | None = None) -> list[str]:
    """Why this request needs a second look (empty when it does not), in the reviewer's words. `tool`: a
    gate's tool definition, the one its approval is bound to; else the server's tool list as the hub holds
    it now. A gate is judged by its own tool definition whichever way it is answered: the server's list
    may have changed since, and a claim it made when the call was stopped still asks for care."""
    if tool is None:
        tool = _bound_tool(ir)
    why = []
    policy = ir.policy
    if policy is not None and policy.risk == Policy.Risk.HIGH:
        why.append(_("the hub's policy “%(policy)s” rates it high risk") % {"policy": policy.name})
    annotations = (tool.get("annotations") or {}) if tool is not None else call.tool_annotations
    if isinstance(annotations, dict) and annotations.get("destructiveHint") is True:
        why.append(_("the server says this tool may make destructive changes"))
    return why


def _digest(values: Any) -> str:
    try:
        return canonical.digest(values)
    except canonical.CanonicalError:  # no canonical form (an integer beyond 2**53): a stable one instead
        return hashlib.sha256(json.dumps(values, sort_keys=True, default=str).encode()).hexdigest()


def token(ir: InputRequest, user: Any, values: Any) -> str:
    """The token a reviewed answer carries: this request, this reviewer, these values."""
    return signing.dumps({"r": str(ir.pk), "u": str(user.pk), "d": _digest(values)}, salt=_SALT)


def confirmed(given: str, ir: InputRequest, user: Any, values: Any) -> bool:
    """Whether `given` is a token, not expired, for this request, this reviewer and exactly these values."""
    if not given or len(given) > 512:
        return False
    try:
        data = signing.loads(given, salt=_SALT, max_age=MAX_AGE)
    except signing.BadSignature:  # SignatureExpired included
        return False
    if not isinstance(data, dict):
        return False
    return (
        data.get("r") == str(ir.pk)
        and data.get("u") == str(user.pk)
        and hmac.compare_digest(str(data.get("d", "")), _digest(values))
    )


@dataclass(frozen=True)
class Row:
    label: str
    value: str  # as it will be sent (a JSON value, strings as they are)
    choice: str  # the option's label, for a select whose label differs from its value
    sent: bool  # False: an optional field left empty, which is not sent


@dataclass(frozen=True)
class Review:
    """What the second step shows: why, the values as they will be sent, and the token for the form."""

    reasons: list[str]
    rows: list[Row]
    token: str

    @property
    def count(self) -> int:
        return sum(1 for row in self.rows if row.sent)


def _shown(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def review(ir: InputRequest, call: ToolCall, user: Any, fields: list[Any], values: dict[str, Any]) -> Review:
    """The second step for `values` (cleaned, as they will be sent), in the order of the form's `fields`
    (``schema_forms.Field``)."""
    rows = []
    for field in fields:
        sent = field.name in values
        value = values.get(field.name)
        labels = dict(field.choices)
        chosen = value if isinstance(value, list) else [value]
        choice = ", ".join(
            labels[str(item)] for item in chosen if str(item) in labels and labels[str(item)] != str(item)
        )
        rows.append(Row(field.label, _shown(value) if sent else "", choice, sent))
    return Review(reasons(ir, call), rows, token(ir, user, values))


@dataclass(frozen=True)
class GateReview:
    """A gate's second step: why, the arguments as they will be sent, the grant asked for (its duration, or
    ""; which later calls it lets through: ``grant_arguments`` "exact", or "conditions" with
    ``grant_conditions``), and the decision's own fields to post again with the token."""

    reasons: list[str]
    arguments: Any
    grant: str
    fields: list[tuple[str, str]]
    token: str
    grant_arguments: str = ""
    grant_conditions: list[Any] = dataclasses.field(default_factory=list)


def _conditions(texts: list[str]) -> list[Any]:
    """The grant's conditions as the form posted them (JSON text each), read for the review. The decision
    checks them (``grants.parse_choice``) before the review is shown; one that is not JSON is shown as is."""
    read = []
    for text in texts:
        try:
            read.append(safejson.loads(text.encode(), max_depth=8))
        except ValueError:
            read.append(text)
    return read


def gate_review(
    ir: InputRequest, call: ToolCall, user: Any, values: dict[str, Any], posted: Any, tool: dict[str, Any]
) -> GateReview:
    """The second step of a gate's approval of `values` ({"decision", "arguments", "grant"}), `posted` being
    the decision's POST (a QueryDict), whose fields the confirming form sends again."""
    fields = [
        (name, value)
        for name, given in posted.lists()
        if name not in ("csrfmiddlewaretoken", FIELD)
        for value in given
    ]
    duration, mode, conditions = values.get("grant") or ("", "", [])
    mode = (mode or "exact") if duration else ""
    return GateReview(
        reasons(ir, call, tool),
        values["arguments"],
        duration,
        fields,
        token(ir, user, values),
        grant_arguments=mode,
        grant_conditions=_conditions(conditions) if mode == "conditions" else [],
    )
