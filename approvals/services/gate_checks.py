"""What a gate's decision may be, checked before it is recorded (below `gates` and `answers`, which use it).

A gate's InputRequest has method ``tools/call`` (`GATE_METHOD`) and key ``gate``; its schema is the tool's
``inputSchema``. A decision approves the arguments as asked, approves edited arguments (a JSON object, at
most `MAX_ARGUMENTS` bytes, canonicalisable, valid against ``inputSchema``) or declines, before the gate's
deadline: beat expires overdue gates only every few seconds, and a decision in between comes too late.
"""

from __future__ import annotations

import logging
from typing import Any

from django.utils import timezone
from jsonschema.exceptions import SchemaError
from jsonschema.validators import Draft202012Validator, validator_for
from referencing import Registry
from referencing.exceptions import Unresolvable

from approvals import canonical, safejson
from approvals.models import InputRequest
from approvals.services.errors import AnswerInvalid, Conflict, Invalid, moment

logger = logging.getLogger(__name__)

GATE_KEY = "gate"
GATE_METHOD = "tools/call"  # the InputRequest.method of a gate: what it asks about
MAX_ARGUMENTS = 256 * 1024  # bytes of JSON: edited arguments larger than this are refused


def is_gate(ir: InputRequest) -> bool:
    return ir.method == GATE_METHOD


def validate_decision(ir: InputRequest, action: str, content: Any) -> dict[str, Any] | None:
    """A reviewer's answer to a gate: approve (content None: the arguments as asked; an object: edited
    arguments, checked against the tool's inputSchema) or decline. Cancel is not a decision on a gate.

    Past the gate's deadline nothing is decided (a Conflict first, as for any answer that comes too late):
    "if nobody decides by then, the call is not sent" holds even before beat's sweep expires the gate."""
    check_deadline(ir)
    if action == InputRequest.Action.DECLINE:
        if content not in (None, {}):
            raise Invalid(
                "A decline carries no arguments.", code="invalid_body", fields={"content": "not allowed"}
            )
        return None
    if action != InputRequest.Action.ACCEPT:
        raise Invalid(
            "A gate is approved (with the arguments as asked, or edited) or declined.",
            code="invalid_body",
            fields={"action": "must be accept (approve) or decline"},
        )
    if content is None:
        asked = (ir.params or {}).get("arguments")
        return dict(asked) if isinstance(asked, dict) else {}
    if not isinstance(content, dict):
        raise AnswerInvalid("The arguments must be a JSON object.", fields={"arguments": "not an object"})
    if safejson.size(content) > MAX_ARGUMENTS:
        raise AnswerInvalid(
            f"The arguments are over {MAX_ARGUMENTS // 1024} KiB.", fields={"arguments": "too large"}
        )
    try:
        canonical.canonical_json(content)
    except canonical.CanonicalError as exc:
        raise AnswerInvalid(
            f"The arguments cannot be approved: {exc}.", fields={"arguments": "not canonical JSON"}
        ) from None
    errors = schema_errors(ir.requested_schema or {}, content)
    if errors:
        raise AnswerInvalid("The arguments do not match the tool's inputSchema.", fields=errors)
    return content


def check_deadline(ir: InputRequest) -> None:
    """Raise Conflict when the gate's deadline has passed: nothing is decided after it."""
    deadline = ir.round.deadline
    if deadline <= timezone.now():
        raise Conflict(
            f"This gate expired at {moment(deadline)}: no one decided it before its deadline, so the call is "
            "not sent.",
            code="already_answered",
        )


def schema_errors(schema: dict[str, Any], arguments: dict[str, Any]) -> dict[str, str]:
    """jsonschema's verdict on edited arguments, one message per argument path ("" for the whole).

    A schema the hub cannot check against counts as broken, as one the metaschema refuses: a `$ref` it
    cannot resolve (the hub fetches no schema from the network, and a pointer may name nothing) or one that
    refers to itself without end. Only "an object" is checked then (the server checks its own arguments);
    before, the reviewer's edit ended in a server error.

    An empty registry: a ``$ref`` resolves only within the schema. jsonschema's default one fetches any URL a
    ``$ref`` names (a server's schema could make the hub request an address of the server's choosing, past
    approvals.netguard, with no timeout)."""
    try:
        cls = validator_for(schema, default=Draft202012Validator)
        cls.check_schema(schema)
    except SchemaError:
        return {}  # the server's schema itself is broken: only "an object" can be checked, and it is
    errors: dict[str, str] = {}
    try:
        for error in cls(schema, registry=Registry()).iter_errors(arguments):
            path = ".".join(str(part) for part in error.absolute_path) or "arguments"
            errors.setdefault(path, error.message[:300])
    except (Unresolvable, RecursionError) as exc:
        logger.warning("a gate's inputSchema cannot be checked against: %s", type(exc).__name__)
        return {}
    return errors
