"""Benchmark pass-through on the MCP gateway against a running hub (`make run`): how long a question its rule
passes to the requester takes to reach the agent's client, and how long the answer takes to become the
upstream's result, for both eras of the official Python SDK client.

For each era it runs ``--calls`` calls of the demo server's ``create_deployment`` through ``/mcp``, one at a
time, under a temporary "requester answers" rule (removed at the end), and records:

- ask: ``tools/call`` sent -> the question in the client (``input_required`` for 2026-07-28, the
  ``elicitation/create`` callback for the handshake era): the hub's submit, the worker's send, the
  upstream's ``input_required``, the round opened and routed, the gateway woken;
- answer: the answer sent -> the upstream's ``CallToolResult`` in the client: recorded, the retry queued and
  sent, the upstream's result, the gateway woken;
- and, as the floor, ``echo`` through the gateway (submit -> worker -> upstream -> result, no question).

    make bench BENCH="gateway --calls 30"
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import anyio
import httpx2
import mcp
import mcp_types as types
from django.core.management.base import BaseCommand, CommandError
from mcp.client.streamable_http import streamable_http_client

from approvals.models import McpServer, RoutingRule
from approvals.services import tokens
from bench.stats import pct

TOOL = "create_deployment"


def describe(values: list[float]) -> str:
    ms = [v * 1000 for v in values]
    return (
        f"n={len(ms)} p50={statistics.median(ms):.1f} ms p95={pct(ms, 0.95):.1f} ms "
        f"max={max(ms):.1f} ms mean={statistics.fmean(ms):.1f} ms"
    )


def _client(url: str, token: str, mode: str, elicit: Any) -> tuple[httpx2.AsyncClient, mcp.Client]:
    http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=httpx2.Timeout(120))
    transport = streamable_http_client(url, http_client=http)
    return http, mcp.Client(transport, mode=mode, elicitation_callback=elicit)


async def _refuse(context: Any, params: Any) -> types.ElicitResult:
    raise RuntimeError("a 2026-07-28 client is never sent elicitation/create")


async def modern(url: str, token: str, name: str, echo: str, n: int) -> dict[str, list[float]]:
    found: dict[str, list[float]] = {"ask": [], "answer": [], "echo": []}
    http, client = _client(url, token, "2026-07-28", _refuse)
    async with http, client:
        await client.list_tools()
        for i in range(n):
            arguments = {"branch": f"bench-{time.time_ns()}-{i}"}
            started = time.perf_counter()
            first = await client.session.call_tool(name, arguments, allow_input_required=True)
            asked = time.perf_counter()
            if not isinstance(first, types.InputRequiredResult) or not first.input_requests:
                raise CommandError(f"expected input_required, got {first!r}")
            (key,) = first.input_requests
            done = await client.session.call_tool(
                name,
                arguments,
                input_responses={
                    key: types.ElicitResult(action="accept", content={"environment": "staging"})
                },
                request_state=first.request_state,
                allow_input_required=True,
            )
            finished = time.perf_counter()
            if not isinstance(done, types.CallToolResult) or done.is_error:
                raise CommandError(f"expected the upstream's result, got {done!r}")
            found["ask"].append(asked - started)
            found["answer"].append(finished - asked)
            started = time.perf_counter()
            await client.session.call_tool(echo, {"text": f"floor {i}"}, allow_input_required=True)
            found["echo"].append(time.perf_counter() - started)
    return found


async def handshake(url: str, token: str, name: str, n: int) -> dict[str, list[float]]:
    found: dict[str, list[float]] = {"ask": [], "answer": []}
    marks: dict[str, float] = {}

    async def person(context: Any, params: Any) -> types.ElicitResult:
        marks["asked"] = time.perf_counter()
        return types.ElicitResult(action="accept", content={"environment": "staging"})

    http, client = _client(url, token, "legacy", person)
    async with http, client:
        await client.list_tools()
        for i in range(n):
            started = time.perf_counter()
            result = await client.call_tool(name, {"branch": f"bench-hs-{time.time_ns()}-{i}"})
            finished = time.perf_counter()
            if result.is_error:
                raise CommandError(f"expected the upstream's result, got {result!r}")
            found["ask"].append(marks["asked"] - started)
            found["answer"].append(finished - marks["asked"])
    return found


class Command(BaseCommand):
    help = __doc__

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--gateway", default="http://127.0.0.1:8001/mcp")
        parser.add_argument("--server", default="demo")
        parser.add_argument("--calls", type=int, default=30)

    def handle(self, *args: Any, **o: Any) -> None:
        server = McpServer.objects.filter(slug=o["server"]).first()
        if server is None or not server.default_team:
            raise CommandError(f"no server {o['server']!r} with a team: run `make run` first")
        agent, token = tokens.agent_create(name=f"bench-gateway-{time.time_ns()}", servers=[server])
        rule = RoutingRule.objects.create(
            position=0,
            name="bench: the requester answers",
            server=server,
            tool_pattern=TOOL,
            team=server.default_team,
            answered_by=RoutingRule.AnsweredBy.REQUESTER,
        )
        name, echo = f"{server.slug}__{TOOL}", f"{server.slug}__echo"
        try:
            fresh = anyio.run(modern, o["gateway"], token, name, echo, o["calls"])
            old = anyio.run(handshake, o["gateway"], token, name, o["calls"])
        finally:
            rule.delete()
            agent.is_active = False
            agent.save(update_fields=["is_active"])
        self.stdout.write(f"2026-07-28 ask (tools/call -> input_required): {describe(fresh['ask'])}")
        self.stdout.write(f"2026-07-28 answer (retry -> result):          {describe(fresh['answer'])}")
        self.stdout.write(f"handshake ask (tools/call -> elicitation):   {describe(old['ask'])}")
        self.stdout.write(f"handshake answer (ElicitResult -> result):   {describe(old['answer'])}")
        self.stdout.write(f"floor: echo through the gateway:             {describe(fresh['echo'])}")
