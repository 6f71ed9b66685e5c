"""The audit log: the one place that writes AuditEvent rows.

Every row carries ``hash = sha256(prev_hash + canonical(row))``. Appends take a transaction-scoped advisory
lock, so the chain order is the id order even with many writers, and the lock is held only until the
surrounding transaction commits. Secrets are redacted before anything is recorded, and the data is made
exactly what the jsonb column gives back (``storable``), or refused: a row hashed over anything else would
never verify.

The canonical form and the hashing live in ``approvals.audit.verify`` (pure Python), which the offline
verifier of exports runs too. Retention (``prune``) removes the oldest part of the chain and records an
``audit.pruned`` event holding the hash of the last removed row: the first kept row links to that hash, so
``verify`` of what remains still passes and still names any altered or removed row. The table's triggers
refuse every other removal (migration 0007), and ``check_chain`` compares the chain with the head the previous
check recorded outside it (``AuditHead``), so a tail cut behind the triggers' back is reported too.
"""

from __future__ import annotations

import json
import logging
import math
import re
import threading
import unicodedata
import urllib.parse
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import redis.exceptions
from django.core.cache import cache
from django.db import connection, transaction
from django.db.models import Case, Func, IntegerField, QuerySet, TextField, When
from django.db.models.functions import Cast
from django.utils import timezone

from approvals import safejson
from approvals.audit import verbs
from approvals.audit import verify as audit_verify
from approvals.audit.verify import GENESIS, derive_action_outcome, event_hash
from approvals.models import AgentClient, AuditEvent, AuditHead, InputRequest, ToolCall

logger = logging.getLogger(__name__)

_CHAIN_LOCK = 0x6175646974  # "audit": any constant shared by every writer
# Takes the chain lock, then reserves the next N ids (the last is returned) and reads the chain's head hash,
# in one round trip (migration 0015: the read is a statement of its own inside the function, so its snapshot
# sees every append committed before the lock was granted). Every allocation of ids goes through it.
_RESERVE = "SELECT last_id, head_hash FROM approvals_audit_reserve(%s, %s)"
REDACTED = "[redacted]"
# Words of a compound key may be joined by nothing, "_", "-", "." or a space: api_key, X-Api-Key, apiKey.
_SECRET_KEY = re.compile(
    r"(request[-_. ]?state|pass[-_. ]?w(or)?d|pass[-_. ]?phrase|secret|token|api[-_. ]?key|private[-_. ]?key"
    r"|authorization|cookie|credential|headers|card[-_. ]?number|cvv"
    # a short word at the key's end: smtp_pass, DB_PASS, smtpPass, pwd, pin1 (not pass_rate, passed, spin)
    r"|(^|[^a-z])(pass|pw|pwd|pin)\d*$|(?-i:[a-z0-9](Pass|Pw|Pwd|Pin)\d*$))",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class Actor:
    type: str
    id: str = ""
    label: str = ""

    @classmethod
    def user(cls, user: Any) -> Actor:
        return cls(AuditEvent.ActorType.USER, str(user.pk), user.get_username())

    @classmethod
    def agent(cls, agent: AgentClient) -> Actor:
        return cls(AuditEvent.ActorType.AGENT, str(agent.pk), agent.name)

    @classmethod
    def system(cls, label: str = "hub") -> Actor:
        return cls(AuditEvent.ActorType.SYSTEM, "", label)


# A value that is a credential whatever its key is called: the hub's own tokens (a prefix and 43 URL-safe
# characters, ``approvals.services.tokens``), anywhere in a text, and an Authorization header's value.
_HUB_TOKEN = re.compile(r"\beh[ap]_[A-Za-z0-9_-]{43}")
# "Basic internationalization" is words: a credential is one long run of token characters with a digit.
_AUTH_VALUE = re.compile(r"\s*(bearer|basic)\s+(?=\S*\d)[A-Za-z0-9._~+/=-]{16,}\s*", re.IGNORECASE)
# The password of an address that carries one (postgres://app:PASSWORD@db/app, redis://:PASSWORD@cache),
# anywhere in a text: up to the authority's last "@", as a password may hold an unencoded "@". Found from
# "://" on, not from the scheme: a search that starts at every word would take seconds on a megabyte. One
# already masked as the admin shows it (``urlsafety.shown``: user:***@) stays as it is.
_URL_PASSWORD = re.compile(r"://([^\s/?#@:]*):(?!\*\*\*@)[^\s/?#]*@")
# The value of a parameter named as a secret (``?access_token=...``, ``&api_key=...``, ``#id_token=...``, a
# form body's ``password=...``), in a URL's query or fragment or anywhere a parameter starts (after ``?``,
# ``&``, ``#``, ``;`` or at the text's start): the same names as a key's (``_SECRET_KEY``), read decoded.
_PARAMETER = re.compile(r"(?:^|(?<=[?&#;]))([A-Za-z0-9_.~%+-]{1,100})=([^&#\s]+)")


def redact(value: Any) -> Any:
    """Drop the values of secret-looking keys, and credentials in any text, at any depth.

    A secret's name may also be data: ``{"name": "DB_PASSWORD", "value": "..."}`` (a Kubernetes env var, an
    HTTP header in a list, a HAR entry) keeps its secret under ``value``, which goes too."""
    if isinstance(value, Mapping):
        named = any(_is_value_key(key) for key in value) and _names_a_secret(value)
        return {
            key: (REDACTED if _secret_name(str(key)) or (named and _is_value_key(key)) else redact(item))
            for key, item in value.items()
        }
    if isinstance(value, list | tuple):
        return [redact(item) for item in value]
    if isinstance(value, str):
        if _AUTH_VALUE.fullmatch(value):
            return REDACTED
        text = _URL_PASSWORD.sub(rf"://\1:{REDACTED}@", _HUB_TOKEN.sub(REDACTED, value))
        return _PARAMETER.sub(_parameter_redacted, text) if "=" in text else text
    return value


def _parameter_redacted(found: re.Match[str]) -> str:
    name, value = found.groups()
    if value == MASKED or not _secret_name(urllib.parse.unquote_plus(name)):
        return found.group(0)  # not a secret's name, or already masked as the admin shows it (``***``)
    return f"{name}={REDACTED}"


# How `urlsafety.shown` writes a hidden value; a parameter already masked so stays as it is.
MASKED = "***"


_PAIR_NAMES = frozenset({"name", "key"})


def _secret_name(name: str) -> bool:
    """Whether a key (or a pair's name) is a secret's, read as it shows (NFKC): "password" written in
    full-width or mathematical letters reads as "password" to whoever typed its value."""
    return bool(_SECRET_KEY.search(name if name.isascii() else unicodedata.normalize("NFKC", name)))


def _names_a_secret(pair: Mapping[Any, Any]) -> bool:
    """A name/value pair whose name is a secret's: ``{"name": "X-Api-Key", "value": ...}``."""
    return any(
        str(key).lower() in _PAIR_NAMES and isinstance(name, str) and _secret_name(name)
        for key, name in pair.items()
    )


def _is_value_key(key: Any) -> bool:
    return str(key).lower() == "value"


MAX_DEPTH = 100  # levels of objects and arrays in an event's data; the hub's own inputs stop far sooner


class _Refusal(Exception):
    """Why a part of an event's data cannot be stored; ``path``: where, innermost first, filled in on the way
    out (nothing is spent on locations while all is well)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason
        self.path: list[str] = []


def storable(data: Mapping[str, Any], verb: str = "") -> dict[str, Any]:
    """`data` exactly as the jsonb column will give it back, so the hash written is the hash verified.

    What PostgreSQL would change is changed here, before hashing: a float Python writes with an exponent
    (1e16 and up) comes back as every one of its digits, an int; -0.0 comes back 0.0; a NUL or a lone
    surrogate cannot be stored at all and becomes U+FFFD, as in every text the hub keeps
    (``safejson.storable_text``); a key that is not a string becomes the string JSON makes of it. What cannot
    be kept is refused with ``safejson.Unstorable`` naming where it is, before anything is written: NaN and
    infinities, nesting deeper than MAX_DEPTH, other types, and two keys that become the same.
    """
    try:
        return _storable(data, 0)
    except _Refusal as refusal:
        where = "$" + "".join(reversed(refusal.path))
        raise safejson.Unstorable(f"{verb or 'audit'} event data: {refusal.reason}", where[:300]) from None


def _storable(value: Any, depth: int) -> Any:
    if isinstance(value, str):
        return safejson.storable_text(value)
    if value is None or isinstance(value, bool | int):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise _Refusal(f"{value!r} is not a JSON number")
        # repr's digits exactly, as numeric keeps them; + 0.0 turns -0.0 into 0.0
        return int(Decimal(repr(value))) if abs(value) >= 1e16 else value + 0.0
    if not isinstance(value, Mapping | list | tuple):
        raise _Refusal(f"a {type(value).__name__} is not JSON")
    if depth >= MAX_DEPTH:
        raise _Refusal(f"nesting deeper than {MAX_DEPTH} levels")
    if not isinstance(value, Mapping):
        items = []
        for index, item in enumerate(value):
            try:
                items.append(_storable(item, depth + 1))
            except _Refusal as refusal:
                refusal.path.append(f"[{index}]")
                raise
        return items
    out: dict[str, Any] = {}
    for key, item in value.items():
        name = _key(key)
        if name in out:
            raise _Refusal(f"two keys that are both {name[:40]!r} once stored")
        try:
            out[name] = _storable(item, depth + 1)
        except _Refusal as refusal:
            refusal.path.append(f".{name[:40]}")
            raise
    return out


def _key(key: Any) -> str:
    """A key as JSON writes it (``1`` -> ``"1"``, ``True`` -> ``"true"``), storable."""
    if isinstance(key, str):
        return safejson.storable_text(key)
    if key is None or isinstance(key, int | float):
        return json.dumps(key)
    raise _Refusal(f"a {type(key).__name__} key is not JSON")


def record(
    *,
    actor: Actor,
    verb: str,
    call: ToolCall | None = None,
    input_request: InputRequest | None = None,
    data: Mapping[str, Any] | None = None,
    team_slug: str = "",
) -> AuditEvent:
    """Append one event to the chain. Runs inside the caller's transaction (or its own)."""
    if "." not in verb:
        raise ValueError(f"audit verbs are namespaced (noun.verb), got {verb!r}")
    if not verbs.is_registered(verb):
        raise ValueError(f"{verb!r} is not in the registry of audit verbs (approvals.audit.verbs)")
    clean = redact(storable(data or {}, verb))
    action, outcome = derive_action_outcome(verb, clean)
    event = AuditEvent(
        actor_type=actor.type,
        actor_id=actor.id,
        actor_label=actor.label,
        verb=verb,
        call_id=call.pk if call else (input_request.round.call_id if input_request else None),
        input_request_id=input_request.pk if input_request else None,
        server_slug=call.server_slug if call else "",
        team_slug=team_slug or _team_of(call, input_request),
        tool=call.tool if call else "",
        action=action,
        outcome=outcome,
        data=clean,
    )
    pending = getattr(_batch, "events", None)
    if pending is not None:
        pending.append(event)  # chained and written when the batch ends
    else:
        _chain([event])
    return event


_batch = threading.local()


@contextmanager
def batched() -> Iterator[None]:
    """The events recorded inside join the chain together as the block ends, in the order recorded: one lock,
    one read of the chain's head and one INSERT instead of three round trips each. Use it inside the caller's
    transaction, for the events of one step; an exception in the block writes none of them (the transaction
    is rolled back anyway). Nested, the outermost block writes."""
    if getattr(_batch, "events", None) is not None:
        yield
        return
    _batch.events = []
    try:
        yield
        events: list[AuditEvent] = _batch.events
    finally:
        _batch.events = None
    if events:
        _chain(events)


def _chain(events: list[AuditEvent]) -> None:
    """Give `events` their ids, time and hashes under the chain lock and insert them, in this order.

    Inside the caller's transaction without a savepoint of its own (a savepoint would cost two round trips
    more): the events belong to the step that records them, and an append that fails fails that step. Two
    round trips in all: the lock with the ids and the head's hash, then the INSERT."""
    with transaction.atomic(savepoint=False):
        last_id, previous = _reserve(len(events))
        at = timezone.now()
        for event_id, event in enumerate(events, start=last_id - len(events) + 1):
            event.id, event.at, event.prev_hash = event_id, at, previous
            event.hash = previous = compute_hash(event)
        if len(events) == 1:
            events[0].save(force_insert=True)
        else:
            AuditEvent.objects.bulk_create(events)


def _reserve(count: int) -> tuple[int, str]:
    """Take the chain lock (held until the transaction ends) and reserve `count` ids: the last of them, and
    the hash the first must link to. Only inside a transaction."""
    with connection.cursor() as cursor:
        cursor.execute(_RESERVE, [count, _CHAIN_LOCK])
        last_id, previous = cursor.fetchone()
    return last_id, previous or GENESIS


def append_many(rows: Sequence[Mapping[str, Any]]) -> int:
    """Append many events in one transaction with one COPY, in order: for seeding and imports, fast.

    Each row gives ``at``, ``actor_type``, ``actor_id``, ``actor_label``, ``verb`` and ``data``, and may give
    ``call_id``, ``input_request_id``, ``server_slug``, ``team_slug`` and ``tool``; the chain's own columns
    (ids, hashes, action, outcome) are computed here. Verbs must be registered and data is redacted, as in
    ``record``; each row's columns are normalised as the table will read them back (``_imported_columns``:
    ``at`` an aware datetime or ISO 8601 text with its offset, kept in UTC), or the whole import is refused.
    Holds the chain lock until the caller's transaction commits, like ``record``.
    """
    if not rows:
        return 0
    prepared = []
    for number, row in enumerate(rows):
        verb = row["verb"]
        if not isinstance(verb, str) or not verbs.is_registered(verb):
            raise ValueError(f"{verb!r} is not in the registry of audit verbs (approvals.audit.verbs)")
        data = redact(storable(row.get("data") or {}, verb))
        action, outcome = derive_action_outcome(verb, data)
        prepared.append(
            {**_imported_columns(row, number), "data": data, "action": action, "outcome": outcome}
        )
    columns = list(ROW_FIELDS)
    with transaction.atomic(), connection.cursor() as cursor:
        last_id, previous = _reserve(len(prepared))
        with cursor.cursor.copy(f"COPY approvals_auditevent ({', '.join(columns)}) FROM STDIN") as copy:
            for event_id, values in enumerate(prepared, start=last_id - len(prepared) + 1):
                values.update(id=event_id, prev_hash=previous, hash="")
                values["hash"] = previous = event_hash(previous, export_row(values))
                values["data"] = json.dumps(values["data"], ensure_ascii=False)
                copy.write_row([values[column] for column in columns])
    return len(prepared)


_TEXT_COLUMNS = ("actor_type", "actor_id", "actor_label", "verb", "server_slug", "team_slug", "tool")
_UUID_COLUMNS = ("call_id", "input_request_id")


def _imported_columns(row: Mapping[str, Any], number: int) -> dict[str, Any]:
    """An imported row's columns as the table will give them back, so the hash written is the hash verified
    (``storable`` does the same for its data), or ValueError naming the row and the column.

    ``at`` becomes UTC: the table reads every time back in UTC, so a time hashed as ``+01:00``, or naive, or
    as a string spelled otherwise (``Z``) would never verify, and an audit row cannot be corrected. A call's
    or input request's id is hashed as the table reads it (lowercase, hyphenated); the text columns must be
    text (an actor id of ``5`` reads back as ``"5"``)."""
    where = f"imported audit event {number}"
    at = row["at"]
    if isinstance(at, str):
        try:
            at = datetime.fromisoformat(at)
        except ValueError:
            raise ValueError(f"{where}: at is not an ISO 8601 time: {at[:40]!r}") from None
    if not isinstance(at, datetime) or timezone.is_naive(at):
        raise ValueError(f"{where}: at must be a date-time with its UTC offset, not {str(at)[:40]!r}")
    columns: dict[str, Any] = {"at": at.astimezone(UTC)}
    for name in _TEXT_COLUMNS:
        value = row.get(name, "")
        if not isinstance(value, str):
            raise ValueError(f"{where}: {name} must be text, not a {type(value).__name__}")
        columns[name] = safejson.storable_text(value)
    if columns["actor_type"] not in AuditEvent.ActorType.values:
        raise ValueError(f"{where}: actor_type {columns['actor_type'][:20]!r} is not user, agent or system")
    for name in _UUID_COLUMNS:
        value = row.get(name)
        try:
            columns[name] = uuid.UUID(str(value)) if value else None
        except ValueError:
            raise ValueError(f"{where}: {name} is not a UUID: {str(value)[:40]!r}") from None
    return columns


def _team_of(call: ToolCall | None, input_request: InputRequest | None) -> str:
    # Call-level events carry the team the call is routed to, so a team's members find them by team alone.
    if input_request is not None and input_request.team is not None:
        return input_request.team.slug
    if call is not None and call.server is not None and call.server.default_team is not None:
        return call.server.default_team.slug
    return ""


# The columns a chain row is read with, for verification and exports (never ``search``).
ROW_FIELDS = (
    "id",
    "at",
    "actor_type",
    "actor_id",
    "actor_label",
    "verb",
    "call_id",
    "input_request_id",
    "server_slug",
    "team_slug",
    "tool",
    "action",
    "outcome",
    "data",
    "prev_hash",
    "hash",
)


def export_row(values: Mapping[str, Any]) -> dict[str, Any]:
    """One event as the canonical form, the exports and the offline verifier name its fields."""
    at = values["at"]
    return {
        "id": values["id"],
        "at": at.isoformat() if isinstance(at, datetime) else str(at),
        "actor_type": values["actor_type"],
        "actor_id": values["actor_id"],
        "actor_label": values["actor_label"],
        "verb": values["verb"],
        "call_id": str(values["call_id"]) if values["call_id"] else None,
        "input_request_id": str(values["input_request_id"]) if values["input_request_id"] else None,
        "server": values["server_slug"],
        "team": values["team_slug"],
        "tool": values.get("tool") or "",
        "action": values.get("action") or "",
        "outcome": values.get("outcome") or "",
        "data": values["data"],
        "prev_hash": values["prev_hash"],
        "hash": values["hash"],
    }


def _values(event: AuditEvent) -> dict[str, Any]:
    return {name: getattr(event, name) for name in ROW_FIELDS}


def canonical(event: AuditEvent) -> bytes:
    return audit_verify.canonical(export_row(_values(event)))


def compute_hash(event: AuditEvent) -> str:
    return event_hash(event.prev_hash, export_row(_values(event)))


@dataclass(frozen=True)
class ChainReport:
    checked: int
    first_bad_id: int | None = None
    problem: str = ""
    anchor: str = GENESIS  # the prev_hash the first row must carry: GENESIS, or the last pruned row's hash
    head_id: int | None = None
    head_hash: str = ""
    recorded_head_id: int | None = None  # the head the previous check recorded, compared by check_chain
    since_id: int | None = None  # an hourly check's start: the head the previous check recorded (None: all)

    @property
    def ok(self) -> bool:
        return self.first_bad_id is None


def chain_anchor() -> tuple[str, int | None]:
    """Where the remaining chain starts: the hash and id of the last row the latest prune removed."""
    pruned = AuditEvent.objects.filter(verb=PRUNED).order_by("-id").values_list("data", flat=True).first()
    if not pruned:
        return GENESIS, None
    return str(pruned.get("last_hash", "")), pruned.get("last_id")


# Walks of the whole chain made again when a prune moved its start meanwhile (see ``verify``).
_WALK_ATTEMPTS = 3


def verify(events: Iterable[AuditEvent] | None = None) -> ChainReport:
    """Walk the chain in id order; name the first row whose hash or link does not match.

    The chain's start and its rows are read a chunk at a time, each as it is then (one snapshot held for the
    whole walk, minutes on a long chain, would hold back every table's vacuum). A prune committed meanwhile
    makes what follows look broken: the first row links to the start the prune recorded, not to the one read,
    or events the walk had not reached are gone. A walk that fails while the chain's start moved is made
    again from the new start (a prune never removes a part that does not verify, so a real break stays)."""
    if events is not None:
        anchor, pruned_through = chain_anchor()
        return _verify_rows((_values(event) for event in events), anchor, pruned_through)
    for _ in range(_WALK_ATTEMPTS):
        start = chain_anchor()
        report = _verify_rows(_rows(AuditEvent.objects.all()), *start)
        if report.ok or chain_anchor() == start:
            break
    return report


# A walk reads at most WALK_ROWS events at a time, and about WALK_BYTES of their data: an event's data may be
# as large as a call's arguments (ELICIT_MAX_BODY), and thousands of such events read at once would take
# gigabytes. One larger event is read alone.
WALK_ROWS = 5000
WALK_BYTES = 8 * 1024 * 1024


def in_chunks(
    qs: QuerySet[AuditEvent], *, through_id: int | None = None, rows: int = 0, budget: int = 0
) -> Iterator[list[dict[str, Any]]]:
    """The events of ``qs`` (up to ``through_id``) in id order as ROW_FIELDS values, a chunk at a time: at
    most ``rows`` events (WALK_ROWS) and about ``budget`` bytes of data (WALK_BYTES).

    Each chunk first reads the ids and data sizes of the next matching events (``id > last``, so a chunk
    never repeats or skips one), then the rows of as many as fit the budget (always at least one), so what
    is held at a time never depends on how large the events that follow each other happen to be. The sizes
    read are of about twice as many events as the chunk before held, so large events are not sized over and
    over. A size costs nothing for data stored as it is (small, or out of line uncompressed:
    ``pg_column_size``); compressed data is sized as text.
    """
    rows, budget = rows or WALK_ROWS, budget or WALK_BYTES
    size = Case(
        When(compression__isnull=True, then=Func("data", function="pg_column_size")),
        default=Func(Cast("data", TextField()), function="octet_length"),
        output_field=IntegerField(),
    )
    bounded = qs if through_id is None else qs.filter(id__lte=through_id)
    last, probe = 0, rows
    while True:
        sized = list(
            bounded.filter(id__gt=last)
            .order_by("id")
            .annotate(compression=Func("data", function="pg_column_compression", output_field=TextField()))
            .annotate(size=size)
            .values_list("id", "size")[:probe]
        )
        if not sized:
            return
        ids: list[int] = []
        total = 0
        for event_id, data_size in sized:
            total += data_size
            if ids and total > budget:
                break
            ids.append(event_id)
        last, probe = ids[-1], min(rows, 2 * len(ids))
        yield list(AuditEvent.objects.filter(id__in=ids).order_by("id").values(*ROW_FIELDS))


def _rows(qs: QuerySet[AuditEvent]) -> Iterator[dict[str, Any]]:
    for chunk in in_chunks(qs):
        yield from chunk


def _verify_rows(
    rows: Iterator[dict[str, Any]],
    anchor: str,
    pruned_through: int | None = None,
    start: str = "",
    start_id: int | None = None,
) -> ChainReport:
    """``start``, ``start_id``: walk on from a known event (its hash and id) instead of the anchor."""
    previous = start or anchor
    checked = 0
    head_id, head_hash = None, ""
    before_id = start_id
    for values in rows:
        if checked == 0 and pruned_through is not None and values["id"] <= pruned_through:
            return ChainReport(0, values["id"], "it is older than the last pruned range", anchor)
        if values["prev_hash"] != previous:
            return ChainReport(checked, values["id"], _broken_link(values["id"], before_id, anchor), anchor)
        if event_hash(values["prev_hash"], export_row(values)) != values["hash"]:
            return ChainReport(checked, values["id"], "its contents do not match its hash", anchor)
        previous = head_hash = values["hash"]
        head_id = before_id = values["id"]
        checked += 1
    return ChainReport(checked, anchor=anchor, head_id=head_id, head_hash=head_hash)


def _broken_link(event_id: int, before_id: int | None, anchor: str) -> str:
    """Why an event's prev_hash is not the hash it should link to, naming both ends of the break: with its
    hash recomputed, a rewritten event verifies alone, so the break may be the fault of the event before."""
    if before_id is None:
        start = "the chain's start" if anchor == GENESIS else "the hash of the last pruned event"
        return f"its prev_hash is not {start}: the events before it were removed, or it was rewritten"
    text = f"its prev_hash is not the hash of event #{before_id} before it: "
    if event_id == before_id + 1:
        return text + f"#{before_id} or #{event_id} was rewritten, its hash recomputed"
    return text + (
        f"the events between #{before_id} and #{event_id} were removed, or #{before_id} or #{event_id} was "
        "rewritten, its hash recomputed"
    )


def chain_head() -> dict[str, Any]:
    """The newest event's id and hash: kept outside the database, it shows whether rows were rewritten."""
    anchor, _ = chain_anchor()
    head = AuditEvent.objects.order_by("-id").values("id", "at", "hash").first()
    return {
        "format": audit_verify.FORMAT,
        "head_id": head["id"] if head else None,
        "head_at": head["at"].isoformat() if head else None,
        "head_hash": head["hash"] if head else GENESIS,
        "anchor": anchor,
        "taken_at": timezone.now().isoformat(),
    }


def head_matches(saved: Mapping[str, Any]) -> bool:
    """Whether the row a saved head names still carries the saved hash (it may since have been pruned)."""
    if saved.get("head_id") is None:
        return True
    current = AuditEvent.objects.filter(pk=saved["head_id"]).values_list("hash", flat=True).first()
    if current is None:
        _, pruned_through = chain_anchor()
        return pruned_through is not None and saved["head_id"] <= pruned_through
    return current == saved.get("head_hash")


def removing_prune(event_id: int) -> AuditEvent | None:
    """The oldest ``audit.pruned`` event still kept whose range reaches ``event_id``: the record of the prune
    that removed it, or of a later one that removed that record too. None when no prune covers it."""
    return (
        AuditEvent.objects.filter(verb=PRUNED, data__last_id__gte=event_id)
        .order_by("id")
        .only("id", "at", "actor_label", "data")
        .first()
    )


def _verify_since(saved: Mapping[str, Any]) -> ChainReport | None:
    """The events after the head the previous check recorded, chained from its hash; None when that head is
    gone or changed (the whole chain is walked then, to say what happened)."""
    head_id = saved.get("head_id")
    if head_id is None:
        return None
    current = AuditEvent.objects.filter(pk=head_id).values_list("hash", flat=True).first()
    if current is None or current != saved.get("head_hash"):
        return None
    anchor = chain_anchor()
    newer = _rows(AuditEvent.objects.filter(id__gt=head_id))
    report = _verify_rows(newer, anchor[0], start=str(saved["head_hash"]), start_id=head_id)
    if not report.ok and chain_anchor() != anchor:
        return None  # a prune committed meanwhile, and may have removed events ahead of the walk
    if report.ok and report.head_id is None:  # nothing new since
        report = replace(report, head_id=head_id, head_hash=str(saved["head_hash"]))
    return replace(report, since_id=head_id)


def check_chain(*, full: bool = True) -> ChainReport:
    """``verify``, then compare with the head the previous check recorded outside the audit table.

    A chain whose newest events were deleted still verifies: only a head kept elsewhere shows the cut. The
    recorded head must still be there with the same hash, or have been removed by a recorded prune. When all
    is well the record moves forward to today's head (never back: a trigger refuses that, migration 0007).

    ``full=False`` (beat's hourly check): only the events after the recorded head are walked, chained from
    its hash, once that head is found unchanged; a chain of tens of millions of events is then checked in
    the time its last hour's events take. Older events are walked by the full check (beat's daily one, and
    ``verify_audit``): an hourly check sees a cut tail or a rewritten head, not an older event rewritten.
    """
    saved = AuditHead.objects.filter(pk=1).values("head_id", "head_hash").first()
    report = None if full or saved is None else _verify_since(saved)
    if report is None:
        report = verify()
    if not report.ok:
        return report
    # An hourly check found the recorded head unchanged before it walked on from it (`_verify_since`).
    if saved is not None and report.since_id is None and not head_matches(saved):
        gone = not AuditEvent.objects.filter(pk=saved["head_id"]).exists()
        problem = (
            f"it was the newest event at the last check and is gone, unrecorded by any prune (the newest now "
            f"is #{report.head_id}): the chain's tail was cut"
            if gone
            else "it no longer carries the hash the last check recorded: the chain was rewritten"
        )
        return replace(
            report, first_bad_id=saved["head_id"], problem=problem, recorded_head_id=saved["head_id"]
        )
    if report.head_id is not None and (saved is None or report.head_id > saved["head_id"]):
        with connection.cursor() as cursor:
            cursor.execute(
                "INSERT INTO approvals_audithead (id, head_id, head_hash, recorded_at) "
                "VALUES (1, %s, %s, %s) ON CONFLICT (id) DO UPDATE SET head_id = EXCLUDED.head_id, "
                "head_hash = EXCLUDED.head_hash, recorded_at = EXCLUDED.recorded_at "
                "WHERE approvals_audithead.head_id < EXCLUDED.head_id",
                [report.head_id, report.head_hash, timezone.now()],
            )
    return replace(report, recorded_head_id=saved["head_id"] if saved else None)


# --- the last full check, kept for the audit page ---------------------------------------------------

CHAIN_STATE_KEY = "audit:chain-state"


def store_chain_state(report: ChainReport) -> dict[str, Any]:
    """Keep the check's result for the audit page; an hourly check's keeps the last full walk's time.

    An hourly check walks only the events after the recorded head, so it cannot see an older event the last
    full walk found rewritten: that break stays the state (``found_by_full_walk``) until a full walk passes,
    whatever the hourly checks in between find.
    """
    before = last_chain_state() or {}
    now = timezone.now().isoformat()
    full = report.since_id is None
    state: dict[str, Any] = {
        "ok": report.ok,
        "checked": report.checked,
        "first_bad_id": report.first_bad_id,
        "problem": report.problem,
        "head_id": report.head_id,
        "head_hash": report.head_hash,
        "anchor": report.anchor,
        "checked_at": now,
        "since_id": report.since_id,
        "full_checked_at": now if full else before.get("full_checked_at"),
        "found_by_full_walk": False,
    }
    if full:
        state["full_break"] = None if report.ok else {"id": report.first_bad_id, "problem": report.problem}
    else:
        state["full_break"] = found = _full_break(before)
        if report.ok and found:
            state.update(
                ok=False, first_bad_id=found["id"], problem=found["problem"], found_by_full_walk=True
            )
    try:
        cache.set(CHAIN_STATE_KEY, state, timeout=None)
    except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError) as exc:
        # Only the audit page's copy is lost (it says how old the last one it has is): the check itself,
        # and its verdict for whoever ran it, need the database alone. The class only: a driver's message
        # may quote the address.
        logger.warning(
            "the chain check's result was not kept for the audit page: Redis (%s)", type(exc).__name__
        )
    return state


def _full_break(state: Mapping[str, Any]) -> dict[str, Any] | None:
    """The break the last full walk found, as a state records it (one kept before ``full_break`` existed: a
    full walk's own result that was not ok)."""
    if "full_break" in state:
        return state["full_break"]
    if state and state.get("since_id") is None and state.get("ok") is False:
        return {"id": state.get("first_bad_id"), "problem": state.get("problem", "")}
    return None


def last_chain_state() -> dict[str, Any] | None:
    """The last check's result; None when there is none, or while Redis (where it is kept) is down."""
    try:
        return cache.get(CHAIN_STATE_KEY)
    except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError):
        return None


# --- retention -----------------------------------------------------------------------------------------

PRUNED = "audit.pruned"


class ChainBroken(Exception):
    def __init__(self, report: ChainReport) -> None:
        super().__init__(f"event #{report.first_bad_id}: {report.problem}")
        self.report = report


@dataclass(frozen=True)
class PruneResult:
    count: int
    first_id: int
    last_id: int
    last_hash: str
    event: AuditEvent | None = None  # the audit.pruned event; None on a dry run


def prune(*, before: datetime, actor: Actor, dry_run: bool = False) -> PruneResult | None:
    """Remove the oldest events, up to the first one at or after ``before``, and record what went.

    Only a prefix of the chain is ever removed, so a row newer than ``before`` is never taken because an
    older one follows it. A prefix that does not verify is not removed: pruning must not launder tampering.

    The prefix is verified before the chain lock is taken, so appends (every step of every call) go on
    meanwhile, however long it is: its rows cannot change (never updated; only a prune removes any). Under the
    lock it is read again, and verified again only if it changed meanwhile (an append older than ``before``,
    another prune) or did not verify; only the record and the delete hold the lock.
    """
    bounds = _prefix(before)
    if bounds is None:
        return None
    report = _verify_prefix(bounds)
    if dry_run:
        if not report.ok:
            raise ChainBroken(report)
        return PruneResult(report.checked, bounds.first_id, bounds.last_id, bounds.last_hash)
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s)", [_CHAIN_LOCK])
        locked = _prefix(before)
        if locked is None:
            return None
        if locked != bounds or not report.ok:
            bounds, report = locked, _verify_prefix(locked)
        if not report.ok:
            raise ChainBroken(report)
        result = PruneResult(report.checked, bounds.first_id, bounds.last_id, bounds.last_hash)
        # The audit.pruned event goes in first, then the prefix it names: the table's trigger lets a DELETE
        # stand only when the newest event records exactly what it removed (migration 0007). Written before
        # the delete, it links to the same row it would afterwards: the newest kept event, or, when nothing
        # is kept, the last removed one (its ``start``).
        event = record(
            actor=actor,
            verb=PRUNED,
            data={
                "before": before.isoformat(),
                "count": result.count,
                "first_id": bounds.first_id,
                "first_at": bounds.first_at.isoformat(),
                "last_id": bounds.last_id,
                "last_at": bounds.last_at.isoformat(),
                "first_prev_hash": bounds.anchor,
                "last_hash": bounds.last_hash,
            },
        )
        with connection.cursor() as cursor:
            cursor.execute("DELETE FROM approvals_auditevent WHERE id <= %s", [bounds.last_id])
            removed = cursor.rowcount
        if removed != result.count:
            raise RuntimeError(f"expected to remove {result.count} events, removed {removed}")
    return PruneResult(result.count, result.first_id, result.last_id, result.last_hash, event)


@dataclass(frozen=True)
class _Prefix:
    """The part of the chain a prune would remove, and where the chain starts now."""

    first_id: int
    first_at: datetime
    last_id: int
    last_at: datetime
    last_hash: str
    anchor: str
    pruned_through: int | None


def _prefix(before: datetime) -> _Prefix | None:
    keep_from = AuditEvent.objects.filter(at__gte=before).order_by("id").values_list("id", flat=True).first()
    doomed = AuditEvent.objects.all() if keep_from is None else AuditEvent.objects.filter(id__lt=keep_from)
    first = doomed.order_by("id").values("id", "at").first()
    last = doomed.order_by("-id").values("id", "at", "hash").first()
    if first is None or last is None:
        return None
    anchor, pruned_through = chain_anchor()
    return _Prefix(first["id"], first["at"], last["id"], last["at"], last["hash"], anchor, pruned_through)


def _verify_prefix(prefix: _Prefix) -> ChainReport:
    # Unlocked, a prune committed meanwhile makes it fail: ``prune`` walks it again under the chain lock.
    rows = _rows(AuditEvent.objects.filter(id__lte=prefix.last_id))
    return _verify_rows(rows, prefix.anchor, prefix.pruned_through)
