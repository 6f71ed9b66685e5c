"""What the gateway reads: the tools an agent may call, and what one of its calls waits for.

Plain synchronous ORM reads; the ASGI side runs them in a thread (``approvals.gateway.server``).
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

from django.db import connection
from django.utils import timezone

from approvals import safejson
from approvals.gateway.names import MAX_NAME, gateway_name, may_be_hashed, name_prefix, plain_tool, shown
from approvals.models import AgentClient, Decision, InputRequest, McpServer, Round, ToolCall
from approvals.selectors import gate_summary

logger = logging.getLogger(__name__)

SCOPE_KEY = "elicit_hub.gateway"  # where the guard leaves {"agent": id, "slug": str | None} in the scope


@dataclass(frozen=True)
class ExposedTool:
    name: str  # what the agent sees
    server: str  # the upstream server's slug
    tool: str  # the upstream tool's name
    spec: dict[str, Any]  # the stored tools/list entry, renamed


def _storable(*texts: str | None) -> bool:
    """Whether PostgreSQL can compare the client's ``texts`` (a NUL or a lone surrogate, which a path or a
    tool name may hold, makes the query itself fail: no server nor tool has such a name)."""
    return all(text is None or safejson.text_problem(text) is None for text in texts)


def may_use(agent_id: int, slug: str) -> bool:
    if not _storable(slug):
        return False
    return McpServer.objects.filter(agents__pk=agent_id, enabled=True, slug=slug).exists()


# Where a tool stands in the order of `tools/list` pages: (server slug, the name the agent sees), a name
# over NAME_KEY characters by its first NAME_KEY and a digest of the rest, so a page's cursor stays short.
Position = tuple[str, str, str]
NAME_KEY = 64


def position(server: str, name: str) -> Position:
    """The tool's place in the pages' order: by server, then by name (for a name that is cut, by its start,
    then by the SHA-256 of the whole name)."""
    if len(name) <= NAME_KEY:
        return (server, name, "")
    return (server, name[:NAME_KEY], hashlib.sha256(name.encode()).hexdigest()[:32])


# One tool as `exposed_tools` orders it: (its position, its name, its server's id, its upstream name).
_Placed = tuple[Position, str, int, str]
_READS = 3  # times a page is read while its tool lists change under it


def exposed_tools(
    agent_id: int, slug: str | None = None, *, after: Position | None = None, limit: int | None = None
) -> list[ExposedTool]:
    """The agent's tools from the stored tool lists, in `position` order: `<slug>__<tool>` on `/mcp`, the
    upstream names on `/mcp/<slug>`; only those after ``after``, at most ``limit`` (a page of tools/list). A
    tool list never fetched (or an entry without a name) contributes nothing; a name a list holds twice counts
    once, as its first entry.

    A slug may not hold `__` (nor end in `_`), so a name on `/mcp` splits at its first `__` into one server
    and one tool. A server registered before that rule may still have such a slug, and then two tools of
    two servers can take one name (`a` with `b__c`, `a__b` with `c`): that name is left out for both, and
    logged, rather than calling whichever server came first; `/mcp/<slug>` still names each.

    A page reads the tool names of the servers it reaches (in slug order, from the position on: one, then
    two, then four...) and of those whose names could be theirs, then the definitions of its own tools
    only: a stored list can be megabytes, and a walk of the pages reads each about once."""
    for _ in range(_READS):
        slugs, page = _page(agent_id, slug, after, limit)
        specs = _definitions([(server_id, tool) for _, _, server_id, tool in page])
        if len(specs) == len(page):
            break
        # A list changed between the two reads (a refresh): a page short of a tool it counted could end the
        # walk early (a page as long as asked for says there is another), so it is read again.
    return [
        ExposedTool(name=name, server=slugs[server_id], tool=tool, spec={**spec, "name": name})
        for _, name, server_id, tool in page
        if (spec := specs.get((server_id, tool))) is not None
    ]


def _page(
    agent_id: int, slug: str | None, after: Position | None, limit: int | None
) -> tuple[dict[int, str], list[_Placed]]:
    """The agent's servers (id: slug), and the tools of the page in order, by name only."""
    servers = McpServer.objects.filter(agents__pk=agent_id, enabled=True)
    if slug is not None:
        servers = servers.filter(slug=slug)
    slugs = dict(servers.values_list("pk", "slug"))
    ahead = [
        pk
        for found, pk in sorted((found, pk) for pk, found in slugs.items())
        if after is None or found >= after[0]
    ]
    placed: list[_Placed] = []
    batch = 1 if limit is not None else len(ahead)
    while ahead and (limit is None or len(placed) < limit):
        placed += _placed(slugs, ahead[:batch], slug is not None, after)
        ahead, batch = ahead[batch:], batch * 2
    placed.sort()
    return slugs, placed if limit is None else placed[:limit]


def _placed(
    slugs: dict[int, str], server_ids: list[int], scoped: bool, after: Position | None
) -> list[_Placed]:
    """The tools of the servers ``server_ids`` after ``after``, each with the name only it takes. On `/mcp`
    the names of every server whose names could equal theirs (one's `name_prefix` begins the other's) are
    read too, to leave out a name two tools would share."""
    chosen = set(server_ids)
    if scoped:
        read = server_ids
    else:
        prefixes = {pk: name_prefix(found) for pk, found in slugs.items()}
        read = [
            pk
            for pk, prefix in prefixes.items()
            if pk in chosen
            or any(prefix.startswith(prefixes[own]) or prefixes[own].startswith(prefix) for own in chosen)
        ]
    by_name: dict[str, list[tuple[int, str]]] = {}
    for server_id, tool in _tool_names(read, None):
        name = tool if scoped else gateway_name(slugs[server_id], tool)
        by_name.setdefault(name, []).append((server_id, tool))
    placed: list[_Placed] = []
    for name, named in by_name.items():
        if not any(server_id in chosen for server_id, _ in named):
            continue
        if len(named) > 1:
            _left_out(name, sorted((slugs[server_id], tool) for server_id, tool in named))
            continue
        server_id, tool = named[0]
        at = position(slugs[server_id], name)
        if after is None or at > after:
            placed.append((at, name, server_id, tool))
    return placed


def _left_out(name: str, named: Sequence[tuple[str, str]]) -> None:
    """Log a name two tools would share. Upstream tool names are quoted and cut (`shown`): one may hold a
    newline that would forge a log line, or a megabyte that every page would repeat."""
    if len({server for server, _ in named}) == 1:
        why = "the server names one tool as the hub cuts or mends another's name"
    else:
        why = "a server slug holding '__' (or ending in '_') is ambiguous, rename the server"
    logger.warning(
        "gateway: the tool name %r is left out: it names %s; %s",
        shown(name),
        ", ".join(f"{shown(tool)!r} of {server!r}" for server, tool in named),
        why,
    )


# The entries of a stored tool list that `exposed_tools` counts: objects with a non-empty string name.
_ENTRIES = """
    FROM approvals_mcpserver s CROSS JOIN LATERAL jsonb_array_elements(
        CASE WHEN jsonb_typeof(s.tools) = 'array' THEN s.tools ELSE '[]'::jsonb END
    ) WITH ORDINALITY AS e(spec, at)
    WHERE jsonb_typeof(e.spec) = 'object' AND jsonb_typeof(e.spec -> 'name') = 'string'
        AND e.spec ->> 'name' <> ''
"""


def _tool_names(server_ids: list[int], only: list[str] | None) -> set[tuple[int, str]]:
    """(server id, tool name) of the servers' stored tools (of those named ``only``): names, not lists."""
    sql = f"SELECT DISTINCT s.id, e.spec ->> 'name' {_ENTRIES} AND s.id = ANY(%s)"
    params: list[Any] = [server_ids]
    if only is not None:
        sql += " AND e.spec ->> 'name' = ANY(%s)"
        params.append(only)
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return {(server_id, tool) for server_id, tool in cursor.fetchall()}


def _definition(server_id: int, tool: str) -> dict[str, Any] | None:
    """The first entry of the server's stored tool list named ``tool`` (a name a list holds twice counts
    once), read alone."""
    sql = f"SELECT e.spec::text {_ENTRIES} AND s.id = %s AND e.spec ->> 'name' = %s ORDER BY e.at LIMIT 1"
    with connection.cursor() as cursor:
        cursor.execute(sql, [server_id, tool])
        found = cursor.fetchone()
    return json.loads(found[0]) if found else None


# The entries of the (server id, tool name) pairs given as two arrays, each pair's first entry first.
_PAIRS = """
    AND s.id = ANY(%s) AND (s.id, e.spec ->> 'name') IN (SELECT * FROM unnest(%s::bigint[], %s::text[]))
    ORDER BY 1, 2, e.at
"""


def _definitions(tools: list[tuple[int, str]]) -> dict[tuple[int, str], dict[str, Any]]:
    """`_definition` of each (server id, tool name), in one statement unpacking only their servers' lists."""
    if not tools:
        return {}
    sql = f"SELECT DISTINCT ON (1, 2) s.id, e.spec ->> 'name', e.spec::text {_ENTRIES}{_PAIRS}"
    with connection.cursor() as cursor:
        ids = [server_id for server_id, _ in tools]
        cursor.execute(sql, [sorted(set(ids)), ids, [tool for _, tool in tools]])
        return {(server_id, tool): json.loads(spec) for server_id, tool, spec in cursor.fetchall()}


def find_tool(agent_id: int, name: str, slug: str | None = None) -> ExposedTool | None:
    """The tool `exposed_tools` names ``name``, or None: the same names and the same rule for a name two
    tools share, read without loading tool lists (each can be megabytes). On `/mcp` only the servers whose
    slug can begin the name are looked at, only their tools' names, and only for a name that may be cut or
    mended, all of them; then the one tool's definition."""
    if not _storable(name, slug):
        return None
    servers = McpServer.objects.filter(agents__pk=agent_id, enabled=True)
    if slug is not None:
        server_id = servers.filter(slug=slug).values_list("pk", flat=True).first()
        spec = _definition(server_id, name) if server_id is not None else None
        return None if spec is None else ExposedTool(name, slug, name, {**spec, "name": name})
    if len(name) > MAX_NAME:  # longer than any name `gateway_name` gives
        return None
    slugs = {
        pk: found for pk, found in servers.values_list("pk", "slug") if name.startswith(name_prefix(found))
    }
    only = None if may_be_hashed(name) else [t for found in slugs.values() if (t := plain_tool(found, name))]
    if not slugs or only == []:
        return None
    named = sorted(
        (slugs[pk], tool)
        for pk, tool in _tool_names(list(slugs), only)
        if gateway_name(slugs[pk], tool) == name
    )
    if len(named) != 1:
        if named:
            _left_out(name, named)
        return None
    server, tool = named[0]
    server_id = next(pk for pk, found in slugs.items() if found == server)
    spec = _definition(server_id, tool)
    return None if spec is None else ExposedTool(name, server, tool, {**spec, "name": name})


def agent(agent_id: int) -> AgentClient | None:
    return AgentClient.objects.filter(pk=agent_id, is_active=True).first()


def still_holds(agent: AgentClient) -> bool:
    """The agent is still active, with the token it was let in with (not rotated since)."""
    return AgentClient.objects.filter(pk=agent.pk, is_active=True, token_hash=agent.token_hash).exists()


@dataclass(frozen=True)
class CallState:
    id: str
    status: str
    is_final: bool
    result: Any
    result_truncated: bool
    error: dict[str, Any] | None
    waiting_for: str  # a line for progress notifications, e.g. "waiting for release: 1 of 2 approvals"
    gate: dict[str, Any] | None = None  # the call's gate (services.gates.gate_summary): digest, diff


def _approvals_given(ir: InputRequest) -> int:
    return Decision.objects.filter(
        input_request=ir, action=InputRequest.Action.ACCEPT, superseded=False, is_final=False
    ).count()


def _waiting_for(call: ToolCall) -> str:
    server = call.server_name
    if call.status == ToolCall.Status.QUEUED:
        return f"queued for {server}"
    if call.status == ToolCall.Status.RUNNING:
        said = (call.progress or {}).get("message") if isinstance(call.progress, dict) else None
        return f"running on {server}: {said}" if said else f"running on {server}"
    if call.status == ToolCall.Status.RESUMING:
        return f"answers sent; resuming on {server}"
    if call.status != ToolCall.Status.AWAITING_INPUT:
        return call.status
    pending = (
        InputRequest.objects.filter(round__call=call, status=InputRequest.Status.PENDING)
        .select_related("team", "escalation_team")
        .order_by("created_at", "key")
    )
    parts = []
    for ir in pending:
        if ir.for_requester:
            parts.append("waiting for the requester to answer through the agent's MCP client")
            continue
        team = ir.escalation_team if ir.escalated_at and ir.escalation_team else ir.team
        who = team.slug if team else "a reviewer"
        required = ir.approvals_required
        counted = f"{_approvals_given(ir)} of {required} approval{'s' * (required != 1)}"
        if ir.method == "tools/call":  # a gate (services.gates): nothing is sent before it is approved
            parts.append(f"waiting for approval to send by {who}: {counted}")
        else:
            parts.append(f"waiting for {who}: {counted}")
    return "; ".join(parts) or "waiting for input"


def call_state(call_id: Any) -> CallState | None:
    """The call as the gateway reports it; None once it no longer exists (deleted while an agent waited)."""
    call = (
        ToolCall.objects.select_related("server")
        .defer("server__headers", "server__env")
        .filter(pk=call_id)
        .first()
    )
    if call is None:
        return None
    return CallState(
        id=str(call.pk),
        status=call.status,
        is_final=call.is_final,
        result=call.result,
        result_truncated=call.result_truncated,
        error=call.error,
        waiting_for="" if call.is_final else _waiting_for(call),
        gate=gate_summary(call) if call.is_final else None,
    )


@dataclass(frozen=True)
class Wake:
    is_final: bool  # final, or a question for the agent's own client: the gateway's wait ends either way


def call_row(call_id: Any, modes: Collection[str] = ("form", "url"), asked: Collection[str] = ()) -> Wake:
    """What a wait re-reads: the call's status, and whether a round asks the agent's client something it
    can answer (a request in one of its elicitation ``modes``) and was not ``asked`` yet in this wait. A
    question this client cannot take does not end its wait: it would be read again at once, in a loop."""
    status = ToolCall.objects.values_list("status", flat=True).get(pk=call_id)
    if status in ToolCall.Status.finals():
        return Wake(True)
    if status != ToolCall.Status.AWAITING_INPUT or not modes:
        return Wake(False)
    asks = (
        InputRequest.objects.filter(
            round__call_id=call_id,
            round__status=Round.Status.OPEN,
            status=InputRequest.Status.PENDING,
            for_requester=True,
            mode__in=list(modes),
        )
        .exclude(pk__in=list(asked))
        .exists()
    )
    return Wake(asks)


@dataclass(frozen=True)
class Ask:
    """One request of an open round that its rule passed through to the agent's own MCP client."""

    id: str
    round_id: int
    key: str
    mode: str
    params: dict[str, Any]  # the elicitation's params as the upstream server sent them
    seconds_left: float  # until the round's deadline (or the upstream's, for a pushed one)


def requester_asks(call_id: Any) -> list[Ask]:
    """The call's pending requests for the requester, in the round still open (empty: nothing to ask)."""
    pending = (
        InputRequest.objects.filter(
            round__call_id=call_id,
            round__status=Round.Status.OPEN,
            status=InputRequest.Status.PENDING,
            for_requester=True,
        )
        .select_related("round")
        .order_by("created_at", "key")
    )
    now = timezone.now()

    def left(rnd: Round) -> float:
        deadline = min(d for d in (rnd.deadline, rnd.server_deadline) if d is not None)
        return (deadline - now).total_seconds()

    return [Ask(str(ir.pk), ir.round_id, ir.key, ir.mode, dict(ir.params), left(ir.round)) for ir in pending]


def round_requests(call_id: Any, round_id: int) -> dict[str, InputRequest]:
    """The requests of one round of this call that the requester answers, by key."""
    found = InputRequest.objects.filter(round_id=round_id, round__call_id=call_id, for_requester=True)
    return {ir.key: ir for ir in found}


def retried_call(call_id: Any, agent_id: int, name: str, slug: str | None) -> bool:
    """Whether a 2026-07-28 retry naming the tool ``name`` on `/mcp` (``slug`` None) or `/mcp/<slug>` may
    answer the call ``call_id``: the agent's own call, of a server it may still use, of the tool that name
    gave it. Found by the call, not by the stored tool lists: an upstream that drops or renames the tool
    while its question waits (a refresh) leaves the call it already sent answerable."""
    found = (
        ToolCall.objects.filter(
            pk=call_id, agent_id=agent_id, server__enabled=True, server__agents__pk=agent_id
        )
        .values_list("server__slug", "tool")
        .first()
    )
    if found is None:
        return False
    server, tool = found
    if slug is not None:
        return server == slug and tool == name
    return gateway_name(server, tool) == name
