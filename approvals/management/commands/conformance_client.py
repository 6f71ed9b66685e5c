"""The client adapter for the official MCP conformance suite: `manage.py conformance_client URL`.

It drives the hub's real call path: registers URL as an MCP server, submits the scenario's tool calls as an
agent would (services.call_submit, the code behind POST /api/v1/calls), lets a Celery worker send them,
answers every elicitation as a reviewer would (accept, with the schema's defaults, through
services.answers.input_respond), and exits 0 once every call is final and none failed. It uses the running
hub's worker when one answers (beside `make run`), and otherwise starts a worker itself.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import CommandError

from approvals import conformance, mcp_client, schema_forms, urlsafety
from approvals.audit.core import Actor
from approvals.management.commands._cli import HubCommand, shown
from approvals.models import InputRequest, McpServer, Membership, Team, ToolCall
from approvals.services import answers, calls, config_audit, tokens
from approvals.services.servers import server_refresh_tools
from elicit_hub.celery import app as celery_app

TIMEOUT = 50.0
ACTOR = Actor.system("manage.py conformance_client")


class Command(HubCommand):
    help = __doc__

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("url")

    def handle(self, *args: Any, url: str, **options: Any) -> None:
        scenario = os.environ.get("MCP_CONFORMANCE_SCENARIO", "adhoc")
        context = json.loads(os.environ.get("MCP_CONFORMANCE_CONTEXT") or "{}")
        call_command("migrate", verbosity=0, interactive=False)
        server, agent, reviewer = self._register(scenario, url)
        try:
            tools = server_refresh_tools(server=server)
        except mcp_client.McpError as exc:
            # Before any worker starts: nothing was called, and a traceback would hide the reason.
            raise CommandError(shown(f"could not list the tools at {urlsafety.shown(url)}: {exc}")) from None
        worker = None if celery_app.control.ping(timeout=1.0) else self._start_worker()
        try:
            planned = conformance.planned_calls(scenario, context, tools)
            ids = []
            for name, arguments in planned:
                call, _ = calls.call_submit(
                    agent=agent, server_slug=server.slug, tool=name, arguments=arguments
                )
                ids.append(call.pk)
            self._review_until_final(ids, reviewer)
        finally:
            if worker:
                worker.terminate()
                worker.wait(15)
        failed = ToolCall.objects.filter(pk__in=ids).exclude(status=ToolCall.Status.COMPLETED)
        for call in failed:
            self.stderr.write(f"{shown(call.tool)}: {call.status}: {shown(_reason(call.error))}")
        if failed:
            raise CommandError(f"{failed.count()} of {len(ids)} calls did not complete")
        self.stdout.write(f"{scenario}: {len(ids)} call(s) completed through the hub")

    def _register(self, scenario: str, url: str) -> tuple[McpServer, Any, Any]:
        """The scenario's team, server, agent and reviewer; what it creates or changes is audited."""
        team, _ = config_audit.get_or_create(
            Team, actor=ACTOR, slug="conformance", defaults={"name": "Conformance"}
        )
        server, _ = config_audit.update_or_create(
            McpServer,
            actor=ACTOR,
            slug=f"conformance-{scenario}"[:50],
            defaults={"url": url, "name": f"Conformance {scenario}", "default_team": team, "enabled": True},
        )
        agent, _ = tokens.agent_create(
            name=f"conformance-{scenario}-{time.time_ns()}", servers=[server], actor=ACTOR
        )
        reviewer, _ = get_user_model().objects.get_or_create(username="conformance-reviewer")
        config_audit.get_or_create(
            Membership, actor=ACTOR, team=team, user=reviewer, defaults={"role": Membership.Role.REVIEWER}
        )
        return server, agent, reviewer

    def _start_worker(self) -> subprocess.Popen[bytes]:
        worker = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "celery",
                "-A",
                "elicit_hub",
                "worker",
                "--pool=solo",
                "--loglevel=WARNING",
                "--without-gossip",
                "--without-mingle",
                "--without-heartbeat",
                "-n",
                f"conformance-{os.getpid()}@%h",
            ],
            cwd=settings.BASE_DIR,
            stdout=subprocess.DEVNULL,
            stderr=sys.stderr,
        )
        deadline = time.monotonic() + 30
        while not celery_app.control.ping(timeout=0.5):
            if worker.poll() is not None or time.monotonic() > deadline:
                raise CommandError("could not start a Celery worker")
        return worker

    def _review_until_final(self, ids: list[Any], reviewer: Any) -> None:
        deadline = time.monotonic() + TIMEOUT
        while ToolCall.objects.filter(pk__in=ids).open().exists():
            if time.monotonic() > deadline:
                still = ToolCall.objects.filter(pk__in=ids).open().order_by("created_at")
                for call in still:
                    self.stderr.write(f"{shown(call.tool)}: still {call.status}")
                raise CommandError(f"{still.count()} of {len(ids)} calls still open after {TIMEOUT:.0f} s")
            pending = InputRequest.objects.pending().filter(round__call_id__in=ids)
            for ir in pending:
                content = None
                if ir.mode == InputRequest.Mode.FORM:
                    content = schema_forms.defaults(ir.requested_schema)
                answers.input_respond(input_request_id=ir.pk, user=reviewer, action="accept", content=content)
            time.sleep(0.05)


def _reason(error: Any) -> str:
    """A failed call's stored error as one line: its code and message."""
    if isinstance(error, dict) and (error.get("code") or error.get("message")):
        return f"{error.get('code') or 'error'}: {error.get('message') or ''}".rstrip(": ")
    return str(error or "no error recorded")
