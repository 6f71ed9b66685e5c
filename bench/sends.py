"""The MCP client's CPU per send (issue 15: a worker's send, without its database work).

Starts its MCP server (bench/sends_server.py: the demo server's tools, plus ``deployment_report``, whose
result has the output schema a typical typed tool declares) and sends from this process exactly as a worker
does (`approvals.mcp_client.run` around `call_tool`, the tool's stored definition given, a new event loop and
client per send), ``--count`` times each, one at a time, to ``--host`` (127.0.0.1 unless given; ``localhost``
makes the outbound guard resolve a name), then prints this process's CPU time (utime + stime) per send and
the wall time:

- ``echo``: completes at once; its result is checked against a one-field output schema;
- ``deployment_report``: completes at once; its result is checked against nested models (1.3 KB of schema);
- ``create_deployment`` first send: answers ``input_required`` (one form question);
- ``create_deployment`` retry: the answer and the ``requestState`` go back, and it completes.

    make bench BENCH="sends --count 300"
"""

from __future__ import annotations

import resource
import sys
import time
from collections.abc import Callable
from typing import Any

from django.core.management.base import BaseCommand, CommandError
from django.test.utils import override_settings

from approvals.mcp_client import Completed, InputRequired, ServerConfig, call_tool, list_tools, run
from bench.procs import Proc, answers, free_port, hub_env


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class Command(BaseCommand):
    help = __doc__

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--count", type=int, default=300, help="sends of each kind")
        parser.add_argument(
            "--host",
            default="127.0.0.1",
            help="the server's host as the URL names it (`localhost`: the outbound guard resolves a name)",
        )

    def handle(self, *args: Any, **o: Any) -> None:
        port = free_port()
        server = Proc("sends-server", [sys.executable, "bench/sends_server.py", f"--port={port}"], hub_env())
        try:
            server.wait_for(lambda: answers(f"http://127.0.0.1:{port}/healthz"), "the MCP server")
            with override_settings(ELICIT_OUTBOUND_ALLOW="127.0.0.0/8"):
                self._run(ServerConfig(url=f"http://{o['host']}:{port}/mcp", timeout=30), o["count"])
        finally:
            server.stop()

    def _run(self, server: ServerConfig, count: int) -> None:
        tools = {tool["name"]: tool for tool in run(list_tools(server))}
        echo, report, deploy = tools["echo"], tools["deployment_report"], tools["create_deployment"]
        rounds: list[InputRequired] = []

        def echo_send(i: int) -> object:
            return run(call_tool(server, "echo", {"text": f"hello {i}"}, tool=echo))

        def report_send(i: int) -> object:
            return run(call_tool(server, "deployment_report", {"branch": f"b{i}"}, tool=report))

        def first_send(i: int) -> object:
            outcome = run(call_tool(server, "create_deployment", {"branch": f"b{i}"}, tool=deploy))
            if isinstance(outcome, InputRequired):
                rounds.append(outcome)
            return outcome

        def retry(i: int) -> object:
            asked = rounds[i]
            key = next(iter(asked.input_requests))
            return run(
                call_tool(
                    server,
                    "create_deployment",
                    {"branch": f"b{i}"},
                    input_responses={key: {"action": "accept", "content": {"environment": "staging"}}},
                    request_state=asked.request_state,
                    tool=deploy,
                )
            )

        kinds: list[tuple[str, Callable[[int], object], type]] = [
            ("echo (output schema checked)", echo_send, Completed),
            ("deployment_report (nested schema)", report_send, Completed),
            ("create_deployment, first send", first_send, InputRequired),
            ("create_deployment, retry", retry, Completed),
        ]
        self.stdout.write(f"MCP client in this process; {count} sends of each kind, one at a time")
        for i in range(10):  # warm: imports, the TLS context, the guard's resolver
            self._expect(echo_send(i), Completed, "warm-up")
        for label, send, expected in kinds:
            cpu, wall = _cpu(), time.perf_counter()
            for i in range(count):
                self._expect(send(i), expected, label)
            cpu, wall = _cpu() - cpu, time.perf_counter() - wall
            self.stdout.write(
                f"{label:<34} client CPU {1000 * cpu / count:5.2f} ms, wall {1000 * wall / count:5.2f} ms"
            )

    @staticmethod
    def _expect(outcome: object, expected: type, label: str) -> None:
        if not isinstance(outcome, expected):
            raise CommandError(f"{label}: expected {expected.__name__}, got {outcome!r}")
