"""The web process's CPU per API request, endpoint by endpoint (issue 15: where a call's web time goes).

Starts the process that serves /api/ as `make run` does (the API server, uvicorn; ``--via web`` for Daphne;
DEBUG off unless ``--debug``) and nothing else, then sends each request ``--count`` times, one at a time,
and prints the process's CPU time (utime + stime from /proc) per request, and the engines' (the embedded
PostgreSQL and Redis, when they are used) per request:

- ``GET /api/v1/inbox?limit=1`` as a reviewer whose queue holds a backlog: the ``--count`` + 1 pending
  requests the answer case below answers (so the inbox's cost with a backlog shows with ``--count``);
- ``GET /api/v1/calls/<id>`` as an agent, for a completed call (``wait=0`` and ``wait=30``: a final call
  answers at once either way);
- ``POST /api/v1/calls`` as an agent (the call is queued for a worker; none runs here, so it stays queued);
- ``POST /api/v1/input-requests/<id>/respond`` as a reviewer (one pending request answered each time;
  the worker's part is not counted).

    make bench BENCH="requests --count 300"
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import httpx
from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import BaseCommand
from django.utils import timezone

from approvals.models import InputRequest, McpServer, Membership, Round, Team, ToolCall
from approvals.services import tokens
from bench.load import engine_pids
from bench.procs import Proc, answers, free_port, hub_env, tree_cpu_seconds
from elicit_hub import engines
from elicit_hub.celery import app as celery_app
from elicit_hub.launch import Layout, commands


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}


def _unqueue(call_ids: set[str]) -> None:
    """Remove the queued tasks that name one of `call_ids` from the broker's list."""
    if not call_ids:
        return
    with celery_app.connection_for_write() as conn:
        client = conn.default_channel.client
        queue = settings.CELERY_TASK_DEFAULT_QUEUE
        for raw in client.lrange(queue, 0, -1):
            text = raw.decode(errors="replace")
            if any(call_id in text for call_id in call_ids):
                client.lrem(queue, 1, raw)


class Command(BaseCommand):
    help = __doc__
    submitted: set[str]

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--count", type=int, default=300, help="requests of each kind")
        parser.add_argument("--only", default="", help="only the kinds whose name holds this text")
        parser.add_argument("--debug", action="store_true", help="run the web process with DEBUG on")
        parser.add_argument(
            "--via", choices=("api", "web"), default="api", help="the API server (uvicorn) or Daphne (web)"
        )

    def handle(self, *args: Any, **o: Any) -> None:
        self.submitted = set()
        if settings.USING_EMBEDDED_ENGINES:
            engines.start()
        call_command("migrate", verbosity=0)
        env = hub_env(debug=o["debug"], ELICIT_API_RATE=os.environ.get("ELICIT_API_RATE", "10000000/m"))
        ports = {"web": free_port(), "api": free_port()}
        # The process exactly as `make run` starts it (elicit_hub.launch), and nothing else.
        layout = Layout(port=ports["web"], gateway_port=free_port(), api_port=ports["api"], demo_port=None)
        web = Proc(o["via"], commands(layout)[o["via"]], env)
        try:
            base = f"http://127.0.0.1:{ports[o['via']]}"
            web.wait_for(lambda: answers(base + "/accounts/login/"), "the web server")
            self._run(base, web.proc.pid, o["count"], o["only"])
        finally:
            web.stop()
            # The calls submitted here were queued for a worker (none runs here): their tasks are taken off
            # the broker's queue and the calls deleted, so a later benchmark's worker does not meet them.
            _unqueue(self.submitted)
            ToolCall.objects.filter(server__slug__startswith="bench-req-").delete()

    def _run(self, base: str, pid: int, count: int, only: str) -> None:
        stamp = int(time.time() * 1000)
        team = Team.objects.create(slug=f"bench-req-{stamp}", name=f"Bench requests {stamp}")
        server = McpServer.objects.create(
            slug=f"bench-req-{stamp}", name="bench", url="https://mcp.example.com/mcp", default_team=team
        )
        agent, agent_token = tokens.agent_create(name=f"bench-req-{stamp}", servers=[server])
        user = get_user_model().objects.create_user(f"bench-req-{stamp}")
        Membership.objects.create(team=team, user=user, role=Membership.Role.REVIEWER)
        _, reviewer_token = tokens.personal_token_create(user=user, name="bench")
        done = ToolCall.objects.create(
            agent=agent,
            server=server,
            tool="echo",
            arguments={},
            status=ToolCall.Status.COMPLETED,
            result={"content": [], "isError": False},
        )
        pending = [self._pending(agent, server, team) for _ in range(count + 1)]
        agent_http = httpx.Client(
            base_url=base, headers={"Authorization": f"Bearer {agent_token}"}, timeout=30
        )
        bot_http = httpx.Client(
            base_url=base, headers={"Authorization": f"Bearer {reviewer_token}"}, timeout=30
        )
        engines_pids = engine_pids() if settings.USING_EMBEDDED_ENGINES else set()
        answer_ids = iter(pending)

        def submit(i: int) -> httpx.Response:
            body = {"server": server.slug, "tool": "echo", "arguments": {"i": i}}
            response = agent_http.post("/api/v1/calls", json=body)
            if response.status_code == 202:
                self.submitted.add(response.json()["id"])
            return response

        def waited(_: int) -> httpx.Response:
            return agent_http.get(f"/api/v1/calls/{done.pk}", params={"wait": 30})

        def respond(_: int) -> httpx.Response:
            ir = next(answer_ids)
            body = {"action": "accept", "content": {"ok": True}}
            return bot_http.post(f"/api/v1/input-requests/{ir}/respond", json=body)

        cases: list[tuple[str, Callable[[int], httpx.Response]]] = [
            ("GET /accounts/login/ (a page, no database)", lambda _: agent_http.get("/accounts/login/")),
            ("GET /api/v1/inbox (reviewer)", lambda _: bot_http.get("/api/v1/inbox?limit=1")),
            ("GET /api/v1/calls/<id> (final call)", lambda _: agent_http.get(f"/api/v1/calls/{done.pk}")),
            (
                "GET /api/v1/calls/<id>?wait=30 (final)",
                lambda _: agent_http.get(f"/api/v1/calls/{done.pk}?wait=30"),
            ),
            ("POST /api/v1/calls", submit),
            ("POST /api/v1/input-requests/<id>/respond", respond),
        ]
        self.stdout.write(f"web process {pid}; {count} requests of each kind, one at a time")
        for name, send in cases:
            if only not in name:
                continue
            send(-1).raise_for_status()  # warm: imports, first connections
            web_before = tree_cpu_seconds(pid)
            eng_before = sum(tree_cpu_seconds(p) for p in engines_pids)
            started = time.perf_counter()
            for i in range(count):
                send(i).raise_for_status()
            wall = time.perf_counter() - started
            web_ms = (tree_cpu_seconds(pid) - web_before) * 1000 / count
            eng_ms = (sum(tree_cpu_seconds(p) for p in engines_pids) - eng_before) * 1000 / count
            self.stdout.write(
                f"{name:<45} web CPU {web_ms:5.2f} ms, engines {eng_ms:5.2f} ms, "
                f"wall {wall * 1000 / count:5.2f} ms"
            )

    @staticmethod
    def _pending(agent: Any, server: McpServer, team: Team) -> str:
        call = ToolCall.objects.create(
            agent=agent, server=server, tool="echo", arguments={}, status=ToolCall.Status.AWAITING_INPUT
        )
        now = timezone.now()
        rnd = Round.objects.create(
            call=call,
            number=1,
            request_state="",
            opened_at=now,
            deadline=now + timedelta(hours=1),
        )
        ir = InputRequest.objects.create(
            round=rnd, key="ok", mode="form", message="ok?", requested_schema=SCHEMA, team=team
        )
        return str(ir.pk)
