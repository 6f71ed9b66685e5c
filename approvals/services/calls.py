"""Calls and relays: submit, cancel, finish. Each function owns its state change end to end."""

from __future__ import annotations

import hashlib
import itertools
import json
import re
import unicodedata
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.db.models import Q
from django.utils import timezone

from approvals import broadcast, netguard, safejson
from approvals.audit import core as audit
from approvals.audit.core import Actor
from approvals.models import AgentClient, AuditEvent, InputRequest, McpServer, Round, ToolCall
from approvals.prepared import PreparedRead
from approvals.queueing import NEW_WORK, RUN_CALL, enqueue_on_commit
from approvals.schema_forms import reading
from approvals.services import gates, webhooks
from approvals.services.errors import Conflict, Forbidden, Invalid, NotFound
from approvals.services.rounds import notify_holders, round_open

MAX_KEY = 500  # InputRequest.key's length
# A relay's server label is kept where a slug is: on the call, and on its audit events (their server_slug).
MAX_LABEL = AuditEvent._meta.get_field("server_slug").max_length or 50

FINAL_EVENT: dict[str, str] = {
    ToolCall.Status.COMPLETED: "call.completed",
    ToolCall.Status.FAILED: "call.failed",
    ToolCall.Status.EXPIRED: "call.expired",
    ToolCall.Status.CANCELLED: "call.cancelled",
}


def check_callback_url(url: str) -> str:
    """Judge an agent's callback URL through the outbound guard; https only outside development. Its name's
    lookup waits ELICIT_WEBHOOK_TIMEOUT at most, as a delivery's does: the agent names the host, and a name
    server that answers slowly would hold the request as long as the system's resolver retries."""
    if not url:
        return ""
    schemes = ("https", "http") if settings.ELICIT_WEBHOOK_ALLOW_HTTP else ("https",)
    try:
        netguard.check_url(url, schemes=schemes, lookup_timeout=settings.ELICIT_WEBHOOK_TIMEOUT)
    except netguard.Refused as exc:
        raise Invalid(
            f"callback_url is refused: {exc.message}.",
            code="invalid_callback_url",
            fields={"callback_url": exc.message},
        ) from None
    return url


# Read for every call submitted; compiled once per process.
# Read for every call submitted; compiled once per process. Only among the agent's own servers, in one
# statement: a server it was not given reads as one that does not exist, in the same time.
_AGENT_SERVER_BY_SLUG = PreparedRead(
    # With its default team: the call's audit events name it.
    lambda slug, agent: (
        McpServer.objects.select_related("default_team").filter(slug=slug, agents=agent).order_by("pk")[:1]
    ),
    slug=McpServer._meta.get_field("slug"),
    agent=AgentClient.servers.through._meta.get_field("agentclient"),
)


def _server_for(agent: AgentClient, slug: str) -> McpServer:
    server = _AGENT_SERVER_BY_SLUG.first(slug=slug, agent=agent.pk)
    if server is None:
        # The same answer whether the server does not exist or the agent may not call it (as the gateway's
        # /mcp/<slug>): an agent learns no slug it was not given.
        raise NotFound(f"This agent has no MCP server {slug!r}.", code="unknown_server")
    if not server.enabled:
        raise Conflict(f"The server {slug!r} is disabled.", code="server_disabled")
    return server


def _existing(agent: AgentClient, idempotency_key: str | None, kind: str) -> ToolCall | None:
    """The agent's call or relay made with this key, if any. A key is the agent's once, whatever the kind: one
    that made a relay, given for a call (or the other way round), is refused rather than answered with an
    address of the other kind, where the call is not found."""
    if not idempotency_key:
        return None
    existing = ToolCall.objects.filter(agent=agent, idempotency_key=idempotency_key).first()
    if existing is not None and existing.kind != kind:
        raise Conflict(
            f"This idempotency_key was already used for a {existing.get_kind_display().lower()}; "
            "use a new key.",
            code="idempotency_key_reused",
            fields={"idempotency_key": "already used for another request"},
        )
    return existing


def _same_input_requests(call: ToolCall, input_requests: dict[str, Any]) -> bool:
    """Whether the relay `call` was made with these ``input_requests``: its round as kept (`round_open`
    keeps ``{"inputRequests": ...}`` as the agent sent it), compared as JSON values in the database, as
    arguments are. A round too large to keep whole kept only its size (and, refused as a whole, its keys):
    then those are compared."""
    raw = {"inputRequests": input_requests}
    kept = Round.objects.filter(call=call.pk, number=1)
    if kept.filter(raw=raw).exists():
        return True
    size = Q(raw__truncated=True, raw__size=safejson.size(raw))
    keys = Q(raw__declined_keys__isnull=True) | Q(raw__declined_keys=list(input_requests))
    return kept.filter(size, keys).exists()


def other_request(
    call: ToolCall,
    *,
    server_slug: str,
    tool: str,
    arguments: dict[str, Any],
    input_requests: dict[str, Any] | None = None,
    on_behalf_of: str | None = None,
) -> str | None:
    """What `call`, found by an idempotency key, was made for, in words, when it is not ``tool`` of
    ``server_slug`` (a relay's label) with ``arguments`` (and, for a relay, ``input_requests``) for the
    person named ``on_behalf_of`` (or no one); None when it is. Arguments compare as JSON values (key order
    aside; ``true`` is not ``1``) with those the agent asked for (a reviewer may have edited them at a gate).
    A relay's answers are answers to its input requests: the same key with other questions is another
    request, not a repeat. So is the same call for another person: who it acts for decides who may open its
    links, and whose grants and self-approval rules apply."""
    same = (
        ToolCall.objects.filter(pk=call.pk, tool=tool)
        .filter(Q(server__slug=server_slug) | Q(server__isnull=True, server_label=server_slug))
        .filter(Q(arguments=arguments) | Q(gates__arguments=arguments))
    )
    same_call = same.exists()
    same_person = (
        call.on_behalf_of_id is None
        if not on_behalf_of
        else ToolCall.objects.filter(pk=call.pk, on_behalf_of__username=on_behalf_of).exists()
    )
    if same_call and same_person and (input_requests is None or _same_input_requests(call, input_requests)):
        return None
    first = f"{call.tool} of {call.server_slug}"
    if same_call and not same_person:
        first += " for another person" if call.on_behalf_of_id else " for no one in particular"
    elif same_call:
        first += " with other input requests"
    elif (call.tool, call.server_slug) == (tool, server_slug):
        first += " with other arguments"
    return first


def refuse_other_request(
    call: ToolCall,
    *,
    server_slug: str,
    tool: str,
    arguments: dict[str, Any],
    input_requests: dict[str, Any] | None = None,
    on_behalf_of: str | None = None,
) -> None:
    """An idempotency_key repeats only its own request (`other_request`): anything else is a new request
    reusing the key, refused (409) rather than answered with the first one's result."""
    first = other_request(
        call,
        server_slug=server_slug,
        tool=tool,
        arguments=arguments,
        input_requests=input_requests,
        on_behalf_of=on_behalf_of,
    )
    if first is not None:
        raise Conflict(
            f"This idempotency_key was already used for {first}; a new request needs a new key.",
            code="idempotency_key_reused",
            fields={"idempotency_key": "already used for another request"},
        )


def _acted_for(agent: AgentClient, username: str | None) -> Any:
    """The person `agent` acts for: one of the users it lists, or a member of a team it lists.

    Anyone else, whether the name exists or not, gets the same refusal, so agents cannot probe usernames.
    """
    if not username:
        return None
    from django.contrib.auth import get_user_model

    user = (
        get_user_model()
        .objects.filter(username=username, is_active=True)
        .filter(Q(pk__in=agent.acts_for_users.values("pk")) | Q(teams__in=agent.acts_for_teams.all()))
        .distinct()
        .first()
    )
    if user is None:
        raise Forbidden(
            "This agent may not act for that person.",
            code="on_behalf_of_not_allowed",
            fields={"on_behalf_of": "not a person this agent may act for"},
        )
    return user


def call_submit(
    *,
    agent: AgentClient,
    server_slug: str,
    tool: str,
    arguments: dict[str, Any],
    idempotency_key: str | None = None,
    callback_url: str = "",
    on_behalf_of: str | None = None,
    channel: str = "api",
    agent_client: dict[str, Any] | None = None,
) -> tuple[ToolCall, bool]:
    """Queue a tool call for a worker. Returns (call, created); an idempotency key repeats the first call.

    ``channel`` says how the agent asked ("api": the REST API, "mcp": the MCP gateway); the audit keeps it.
    ``agent_client``: what the gateway's client can answer itself (``ToolCall.agent_client``); a repeat
    records the latest client's, so a later round may pass through to it."""
    existing = _existing(agent, idempotency_key, ToolCall.Kind.CALL)
    if existing:
        # Only a repeat of the same request speaks for the call's client: another request reusing the key
        # is refused by the caller (`other_request`) and changes nothing.
        other = other_request(
            existing, server_slug=server_slug, tool=tool, arguments=arguments, on_behalf_of=on_behalf_of
        )
        if other is None:
            _note_client(existing, agent_client)
        return existing, False
    server = _server_for(agent, server_slug)
    if not tool:
        raise Invalid("tool is required.", code="invalid_body", fields={"tool": "required"})
    callback_url = check_callback_url(callback_url)
    user = _acted_for(agent, on_behalf_of)
    try:
        with transaction.atomic():
            call = ToolCall.objects.create(
                server=server,
                tool=tool,
                arguments=arguments,
                agent=agent,
                on_behalf_of=user,
                idempotency_key=idempotency_key or None,
                callback_url=callback_url,
                agent_client=agent_client,
            )
            audit.record(
                actor=Actor.agent(agent),
                verb="call.submitted",
                call=call,
                data={
                    "tool": tool,
                    "arguments": arguments,
                    "on_behalf_of": on_behalf_of or "",
                    "channel": channel,
                },
            )
            if not gates.gate_on_submit(call):
                enqueue_on_commit(RUN_CALL, str(call.pk), priority=NEW_WORK)
    except IntegrityError:
        existing = _existing(agent, idempotency_key, ToolCall.Kind.CALL)
        if existing is None:
            raise
        return existing, False
    return call, True


def _repeat_lock_key(agent: AgentClient, server_slug: str, tool: str, arguments: dict[str, Any]) -> int:
    canonical = json.dumps(arguments, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    digest = hashlib.sha256(f"repeat\0{agent.pk}\0{server_slug}\0{tool}\0{canonical}".encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


def call_submit_or_repeat(
    *,
    agent: AgentClient,
    server_slug: str,
    tool: str,
    arguments: dict[str, Any],
    window: int,
    channel: str = "api",
    agent_client: dict[str, Any] | None = None,
) -> tuple[ToolCall, bool]:
    """`call_submit` without an idempotency key, for agents that repeat a call after losing its answer: the
    same agent asking for the same tool of the same server with the same arguments (compared as JSON
    values, so key order does not matter) gets the call still open, or one that ended less than ``window``
    seconds ago, instead of a second execution. Returns (call, created).

    Concurrent identical requests are serialised on a transaction-scoped advisory lock, so exactly one of
    them creates the call."""
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT pg_advisory_xact_lock(%s)", [_repeat_lock_key(agent, server_slug, tool, arguments)]
            )
        since = timezone.now() - timedelta(seconds=window)
        existing = (
            ToolCall.objects.filter(agent=agent, kind=ToolCall.Kind.CALL, server__slug=server_slug, tool=tool)
            # Made for no one, as this one is: the same call for a person is another request.
            .filter(on_behalf_of__isnull=True)
            # A reviewer may have edited the arguments at a gate: the agent repeats the ones it asked for.
            .filter(Q(arguments=arguments) | Q(gates__arguments=arguments))
            .filter(Q(finished_at__isnull=True) | Q(finished_at__gte=since))
            .distinct()
            .order_by("-created_at")
            .first()
        )
        if existing is not None:
            _note_client(existing, agent_client)
            return existing, False
        return call_submit(
            agent=agent,
            server_slug=server_slug,
            tool=tool,
            arguments=arguments,
            channel=channel,
            agent_client=agent_client,
        )


def _note_client(call: ToolCall, agent_client: dict[str, Any] | None) -> None:
    if agent_client is not None and call.agent_client != agent_client and not call.is_final:
        ToolCall.objects.filter(pk=call.pk).update(agent_client=agent_client)
        call.agent_client = agent_client


# Letters of other scripts drawn as Latin ones (Cyrillic, Greek, Armenian), and the Latin letters and digits
# drawn alike (I, l, 1, |; O, 0), each as the one letter they pass for: a label spelled with them reads as
# the Latin name (`_as_drawn`).
_DRAWN_AS = str.maketrans(
    {
        **dict.fromkeys("\u0430\u0410\u03b1\u0391", "a"),
        **dict.fromkeys("\u0412\u0392", "b"),
        **dict.fromkeys("\u0441\u0421\u03f2\u03f9", "c"),
        **dict.fromkeys("\u0501", "d"),
        **dict.fromkeys("\u0435\u0415\u0395", "e"),
        **dict.fromkeys("\u04bb\u041d\u0397\u0570", "h"),
        **dict.fromkeys("\u0456\u03b9", "i"),
        **dict.fromkeys("\u0458\u0408\u037f", "j"),
        **dict.fromkeys("\u041a\u039a\u03ba", "k"),
        **dict.fromkeys("Il1|\u0406\u04c0\u04cf\u0399\u01c0", "l"),
        **dict.fromkeys("\u041c\u039c", "m"),
        **dict.fromkeys("\u039d\u0578", "n"),
        **dict.fromkeys("0\u043e\u041e\u03bf\u039f\u0585\u0555", "o"),
        **dict.fromkeys("\u0440\u0420\u03c1\u03a1", "p"),
        **dict.fromkeys("\u051b\u051a", "q"),
        **dict.fromkeys("\u0455\u0405", "s"),
        **dict.fromkeys("\u0422\u03a4", "t"),
        **dict.fromkeys("\u03c5\u057d", "u"),
        **dict.fromkeys("\u03bd\u0474\u0475", "v"),
        **dict.fromkeys("\u051d\u051c", "w"),
        **dict.fromkeys("\u0445\u0425\u03a7\u03c7", "x"),
        **dict.fromkeys("\u0443\u0423\u04af\u04ae\u03a5", "y"),
        **dict.fromkeys("\u0396", "z"),
    }
)
# Drawn as nothing though not format characters (which `reading` drops): the combining grapheme joiner,
# variation selectors, Mongolian free variation selectors; and drawn as a blank, so read as a space: the
# Hangul fillers (NFKC makes U+3164 and U+FFA0 U+1160) and the blank Braille pattern.
_DRAWN_AS_NOTHING = re.compile("[\u034f\u17b4\u17b5\u180b-\u180f\ufe00-\ufe0f\U000e0100-\U000e01ef]+")
_DRAWN_AS_BLANK = re.compile("[\u115f\u1160\u3164\uffa0\u2800]")


def _as_drawn(text: str) -> tuple[str, str]:
    """`text` as a reviewer sees it drawn, twice: in any case (`reading`: case, runs of spaces, format
    characters and full-width letters aside), then with letters drawn alike as one (`_DRAWN_AS`); and with
    those letters read as one first, so a capital I passes for an l too, then in any case. Empty when it shows
    as nothing."""
    shown = unicodedata.normalize("NFKC", text)
    shown = _DRAWN_AS_BLANK.sub(" ", _DRAWN_AS_NOTHING.sub("", shown))
    return reading(shown).translate(_DRAWN_AS), reading(shown.translate(_DRAWN_AS))


def _lookalike(agent: AgentClient, label: str) -> bool:
    """Whether a relay's label reads as a registered server the agent may not use: its slug or its name, in
    any case, spaces aside: as a reader takes it in (runs of spaces one, invisible characters none, full-width
    letters plain, a Cyrillic or Greek letter drawn as a Latin one that one: `_as_drawn`)."""
    text = _as_drawn(label)
    if not text[0]:
        return False
    others = McpServer.objects.exclude(pk__in=agent.servers.values("pk")).values_list("slug", "name")
    for slug, name in others.iterator():
        for other in (_as_drawn(slug), _as_drawn(name)):
            if text[0] == other[0] or text[1] == other[1]:
                return True
    return False


def _malformed(problems: dict[str, str]) -> Invalid:
    """The 400 of a relay's malformed input requests: each named, up to as many as a round may hold (a body
    of thousands of keys would get an answer several times its size, naming each again)."""
    limit = settings.ELICIT_MAX_INPUT_REQUESTS
    message = "Some input requests are malformed."
    if len(problems) > limit:
        message = f"{len(problems)} input requests are malformed; the first {limit} are named."
    return Invalid(message, code="invalid_body", fields=dict(itertools.islice(problems.items(), limit)))


def _audited_keys(input_requests: dict[str, Any]) -> dict[str, Any]:
    """A relay's keys as its audit event keeps them: all of them, or, past the most a round holds (a round
    refused as a whole), as many as that and their count, as the round's own event (``round.opened``)."""
    limit = settings.ELICIT_MAX_INPUT_REQUESTS
    if len(input_requests) <= limit:
        return {"keys": list(input_requests)}
    return {"keys": list(itertools.islice(input_requests, limit)), "key_count": len(input_requests)}


def relay_submit(
    *,
    agent: AgentClient,
    server_slug: str,
    tool: str,
    arguments: dict[str, Any],
    input_requests: dict[str, Any],
    idempotency_key: str | None = None,
    callback_url: str = "",
    expires_in: int | None = None,
    on_behalf_of: str | None = None,
) -> tuple[ToolCall, bool]:
    """Park input requests an agent received itself; the answers go back to the agent, not to the server."""
    existing = _existing(agent, idempotency_key, ToolCall.Kind.RELAY)
    if existing:
        return existing, False
    if not isinstance(input_requests, dict) or not input_requests:
        raise Invalid(
            "input_requests must be a non-empty object.",
            code="invalid_body",
            fields={"input_requests": "required"},
        )
    problems = {
        key[:MAX_KEY]: "must be an object with method and params"
        for key, value in input_requests.items()
        if not isinstance(value, dict)
        or not isinstance(value.get("params"), dict)
        or not isinstance(value.get("method"), str)
        or not value["method"]
    }
    problems.update(
        (key[:MAX_KEY], f"keys are at most {MAX_KEY} characters")
        for key in input_requests
        if len(key) > MAX_KEY
    )
    if problems:
        raise _malformed(problems)
    if len(server_slug) > MAX_LABEL:
        raise Invalid(
            f"server is at most {MAX_LABEL} characters: a server's slug, or a label for one the hub does "
            "not know.",
            code="invalid_body",
            fields={"server": f"at most {MAX_LABEL} characters"},
        )
    known = McpServer.objects.filter(slug=server_slug).first()
    if known is None and not _as_drawn(server_slug)[0]:
        # Blank, or invisible characters only: reviewers would see questions from no server at all.
        raise Invalid(
            "server shows as nothing: give a server's slug, or a label for one the hub does not know.",
            code="invalid_body",
            fields={"server": "shows as nothing"},
        )
    if known is not None and not agent.servers.filter(pk=known.pk).exists():
        raise Forbidden(
            f"This agent may not relay for the server {server_slug!r}.", code="server_not_allowed"
        )
    if known is None and _lookalike(agent, server_slug):
        # A label is shown to reviewers as the server's name: one that reads as a registered server (its
        # slug in another case, its name) would pass the agent's questions off as that server's.
        raise Forbidden(
            f"This agent may not relay for the server {server_slug!r}.", code="server_not_allowed"
        )
    if expires_in is not None and not 10 <= expires_in <= 7 * 24 * 3600:
        raise Invalid(
            "expires_in must be between 10 seconds and 7 days.",
            code="invalid_body",
            fields={"expires_in": "out of range"},
        )
    callback_url = check_callback_url(callback_url)
    user = _acted_for(agent, on_behalf_of)
    now = timezone.now()
    try:
        with transaction.atomic():
            call = ToolCall.objects.create(
                kind=ToolCall.Kind.RELAY,
                server=known,
                server_label="" if known else server_slug,
                tool=tool,
                arguments=arguments,
                agent=agent,
                on_behalf_of=user,
                idempotency_key=idempotency_key or None,
                callback_url=callback_url,
                status=ToolCall.Status.AWAITING_INPUT,
                started_at=now,
            )
            audit.record(
                actor=Actor.agent(agent),
                verb="relay.submitted",
                call=call,
                data={"tool": tool, "arguments": arguments, **_audited_keys(input_requests)},
            )
            round_open(
                call=call,
                input_requests=input_requests,
                raw={"inputRequests": input_requests},
                request_state=None,
                received_at=now,
                ttl=expires_in,
            )
    except IntegrityError:
        existing = _existing(agent, idempotency_key, ToolCall.Kind.RELAY)
        if existing is None:
            raise
        return existing, False
    return call, True


def bounded_result(result: Any) -> tuple[Any, int | None, bool]:
    """(what to store, the size the server sent in bytes, truncated?) for a tool result.

    Over ELICIT_MAX_RESULT the result keeps its isError and one text item: the start of its text content
    (or of its JSON when it has none), cut to fit the limit.

    A result with structuredContent loses it, and a client that knows the tool's outputSchema refuses a
    successful result without it (the schema says it must be there): such a result becomes a tool error
    (isError true) whose first text item says it was too large for the hub, then the start of its text.
    The REST API and the gateway both show what is stored here."""
    if result is None:
        return None, None, False
    size = safejson.size(result)
    limit = settings.ELICIT_MAX_RESULT
    if size <= limit:
        return result, size, False
    items = result.get("content") if isinstance(result, dict) else None
    texts = [i["text"] for i in items or [] if isinstance(i, dict) and isinstance(i.get("text"), str)]
    whole = "\n".join(texts) if texts else json.dumps(result, ensure_ascii=False)
    is_error = bool(result.get("isError")) if isinstance(result, dict) else False
    content: list[dict[str, Any]] = []
    if isinstance(result, dict) and result.get("structuredContent") is not None:
        is_error = True
        note = (
            f"The tool's result was too large for the hub: {size} bytes, over its limit of {limit} bytes "
            "(ELICIT_MAX_RESULT), so its structured content was not kept. The start of its text follows."
        )
        content.append({"type": "text", "text": note})
    budget = max(0, limit - 1024 - sum(safejson.size(i) for i in content))  # room for the JSON around it
    start = whole.encode("utf-8")[:budget].decode("utf-8", "ignore")
    while safejson.size(start) > budget:  # escapes (quotes, control characters) take more than one byte
        start = start[: len(start) * 3 // 4]
    if start or not content:
        content.append({"type": "text", "text": start})
    return {"content": content, "isError": is_error}, size, True


def call_finish(
    *,
    call: ToolCall,
    status: str,
    result: Any = None,
    error: dict | None = None,
    verb: str | None = None,
    actor: Actor | None = None,
    only_from: Sequence[str] = (),
    event: str | None = None,
) -> bool:
    """Move a call to a final status (conditional on it still being open, or on it being in one of
    `only_from`), audit it, tell the agent (the webhook's ``event``: by default the status's ``call.*``).
    False when the call was not in such a status: nothing is written.
    The UPDATE takes the call's row lock (FOR NO KEY UPDATE), as a locking read of it would."""
    now = timezone.now()
    result, size, truncated = bounded_result(result)
    still_open = ToolCall.objects.filter(pk=call.pk)
    if only_from:
        still_open = still_open.filter(status__in=only_from)
    else:
        still_open = still_open.exclude(status__in=ToolCall.Status.finals())
    updated = still_open.update(
        status=status,
        result=result,
        result_size=size,
        result_truncated=truncated,
        error=error,
        finished_at=now,
        updated_at=now,
    )
    if not updated:
        return False
    # What the UPDATE wrote, set on the call as written: reading it back would decode the result again (and a
    # full refresh would also drop the server and agent already read with the call).
    call.status, call.result, call.result_size, call.result_truncated = status, result, size, truncated
    call.error, call.finished_at, call.updated_at = error, now, now
    data: dict[str, Any] = {"error": error} if error else {"is_error": bool((result or {}).get("isError"))}
    if truncated:
        data.update(result_truncated=True, result_size=size)
    audit.record(actor=actor or Actor.system(), verb=verb or FINAL_EVENT[status], call=call, data=data)
    webhooks.webhook_queue(call=call, event_type=event or FINAL_EVENT.get(status, "call.completed"))
    transaction.on_commit(lambda: broadcast.call_changed(call))
    return True


def call_outcome_discarded(*, call: ToolCall, status: str | None) -> bool:
    """A server's answer came for a call that ended (`status`) or was deleted (None) meanwhile: it is
    recorded, not applied. False, as `call_finish` returns when it changed nothing."""
    audit.record(
        actor=Actor.system(),
        verb="call.outcome_discarded",
        call=call,
        data={"reason": f"the call was {status or 'deleted'} meanwhile"},
    )
    return False


RETRY_SCHEDULED = "call.retry_scheduled"


def sent_and_put_back(call_id: Any, round_number: int = 0) -> bool:
    """Whether an earlier send of the call's first tools/call (`round_number` 0) or of its round's retry
    may have reached the server and was put back for a retry (a tool safe to repeat). Nothing later proves
    it did not run: the call's outcome stays unknown until a send settles it. The audit event of each retry
    (`sending._transient`) is the hub's only record of it, read only when a call ends otherwise."""
    return AuditEvent.objects.filter(
        call_id=call_id, verb=RETRY_SCHEDULED, data__may_have_run=True, data__round=round_number
    ).exists()


def _in_flight(call: ToolCall) -> bool:
    """Whether a tools/call (or its retry with answers) may be at the server: a worker is sending it, or a
    holder's session runs it, or (queued again) an earlier send may have reached it and waits for a retry.
    A cancel then cannot stop the tool, and its result will not be kept."""
    held = call.holder_id is not None and call.started_at is not None
    if call.status in ToolCall.Status.sending() or held:
        return True
    return call.status == ToolCall.Status.QUEUED and call.attempts > 0 and sent_and_put_back(call.pk)


def _cancelled_in_flight() -> dict[str, Any]:
    return {
        "code": "cancelled_while_sending",
        "message": "The agent cancelled the call while it was on its way to the server: the tool may have "
        "run, and any result it sends is not kept. Check the server before calling the tool again.",
        "tool_may_have_run": True,
    }


def call_cancel(*, agent: AgentClient, call_id: Any, kind: str = ToolCall.Kind.CALL) -> ToolCall:
    """The agent gives up: pending input requests are cancelled and the call ends ``cancelled``. Only a
    call of ``kind`` (the address the agent used): a relay's id given as a call's is not found, as its GET
    is, and nothing changes."""
    with transaction.atomic():
        # The open round's lock and its gate's before the call's: the order an answer, an expiry and a send
        # take them in (an answer locks the round, then moves the call on). The other way round, a cancel
        # racing a reviewer's answer or decision deadlocked, and PostgreSQL aborted one of the two.
        open_rounds = Round.objects.filter(
            call_id=call_id, call__agent=agent, call__kind=kind, status=Round.Status.OPEN
        )
        list(open_rounds.select_for_update(no_key=True, of=("self",)).values_list("pk", flat=True))
        gates.gate_withdraw_lock(call_id=call_id, agent=agent)
        call = (
            ToolCall.objects.select_for_update(no_key=True).filter(pk=call_id, agent=agent, kind=kind).first()
        )
        if call is None:
            raise NotFound(f"No such {ToolCall.Kind(kind).name.lower()}.")
        if call.is_final:
            what = ToolCall.Kind(kind).name.lower()
            raise Conflict(f"The {what} is already {call.status}.", code="already_final")
        now = timezone.now()
        open_round = call.rounds.exclude(status=Round.Status.CLOSED).first()
        cancelled: list[InputRequest] = []
        if open_round:
            cancelled = list(open_round.input_requests.pending())
            InputRequest.objects.filter(pk__in=[ir.pk for ir in cancelled]).update(
                status=InputRequest.Status.CANCELLED, action=InputRequest.Action.CANCEL, answered_at=now
            )
            Round.objects.filter(pk=open_round.pk).update(
                status=Round.Status.CLOSED, closed_at=now, outcome=Round.Outcome.CANCELLED
            )
        gates.gate_withdraw(call=call, now=now)
        call_finish(
            call=call,
            status=ToolCall.Status.CANCELLED,
            error=_cancelled_in_flight() if _in_flight(call) else None,
            verb="call.cancelled",
            actor=Actor.agent(agent),
            # A relay's webhook names a relay, whose address is /relays/<id> (/calls/<id> answers 404).
            event="relay.cancelled" if kind == ToolCall.Kind.RELAY else None,
        )
        call_id_ = call.pk
        transaction.on_commit(lambda: broadcast.queue_changed("round.closed", call_id_, cancelled))
        if call.holder_id is not None:
            # A holder runs it on a session: it answers the server's question ``cancel`` at once, or stops
            # the tools/call (the server gets notifications/cancelled).
            notify_holders(f"call:{call_id_}")
    call.refresh_from_db()
    return call
