"""The operator's commands under hostile or mistaken input: a server's text cannot drive the terminal, an
engine down or a wrong argument is one clear line and a distinct exit status, never a traceback."""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.core.management import CommandError, call_command

from approvals.models import AgentClient, AuditEvent, McpServer, PersonalToken
from tests import factories
from tests.live import child_env, free_port

pytestmark = [pytest.mark.django_db, pytest.mark.timeout(120)]

# What a hostile server names itself and its tools: escape sequences that recolour and retitle the
# operator's terminal, a newline that forges a line of the command's output, a bidi override.
HOSTILE_NAME = "evil\x1b[31mRED\x1b[0m\n  error             none\u202e"
HOSTILE_TOOL = "t\x1b]0;pwned\x07x"


class _HostileMcp(BaseHTTPRequestHandler):
    """A handshake-era MCP server over HTTP (JSON answers) whose identity and tool names carry controls."""

    def log_message(self, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        self.send_response(405)
        self.end_headers()

    def do_DELETE(self) -> None:
        self.send_response(200)
        self.end_headers()

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        if "id" not in body:
            self.send_response(202)
            self.end_headers()
            return
        method = body.get("method")
        if method == "server/discover":
            answer: dict[str, Any] = {"error": {"code": -32601, "message": "no \x1b[2J discover"}}
        elif method == "initialize":
            info = {"name": HOSTILE_NAME, "version": "1\x1b]0;title\x07"}
            answer = {"result": {"protocolVersion": "2025-06-18", "capabilities": {"tools": {}}}}
            answer["result"]["serverInfo"] = info
        elif method == "tools/list":
            schema = {"type": "object"}
            tools = [{"name": HOSTILE_TOOL, "inputSchema": schema}, {"name": "a\nb", "inputSchema": schema}]
            answer = {"result": {"tools": tools}}
        else:
            answer = {"result": {}}
        data = json.dumps({"jsonrpc": "2.0", "id": body["id"], **answer}).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@pytest.fixture
def hostile_url() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _HostileMcp)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/mcp"
    finally:
        server.shutdown()
        server.server_close()


def run(*args: str) -> str:
    out = io.StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


def assert_inert(output: str) -> None:
    """No character a terminal obeys or that starts a line the command did not write."""
    assert not any(ord(char) < 0x20 and char != "\n" for char in output), output
    assert "\x7f" not in output and "\u202e" not in output
    assert "\u27e8U+001B\u27e9" in output and "\u27e8U+202E\u27e9" in output
    assert not any(line.startswith("  error ") for line in output.splitlines()), output
    assert not any(line.startswith("b") for line in output.splitlines()), output


def test_a_servers_name_and_tools_cannot_drive_the_operators_terminal(hostile_url: str) -> None:
    registered = run("add_server", "evil", hostile_url)
    assert "probe: ok" in registered
    assert_inert(registered)
    checked = run("check_server", "evil")
    assert_inert(checked)
    assert "\u27e8U+000A\u27e9  error" in checked  # the forged line is shown inside its own
    assert "t\u27e8U+001B\u27e9]0;pwned\u27e8U+0007\u27e9x" in checked
    # The JSON output escapes them already (json.dumps), and keeps the names as the server sent them.
    as_json = json.loads(run("check_server", "evil", "--json"))
    assert as_json["server_info"]["name"] == HOSTILE_NAME
    assert {tool["name"] for tool in McpServer.objects.get(slug="evil").tools} == {HOSTILE_TOOL, "a\nb"}


def test_check_server_of_an_unknown_slug_does_not_exit_as_unreachable() -> None:
    with pytest.raises(CommandError, match="unknown server 'nope'") as raised:
        run("check_server", "nope")
    assert raised.value.returncode == 3  # 1 is "unreachable", 2 "not usable"


def test_add_server_without_a_url_or_command_says_what_is_missing() -> None:
    with pytest.raises(CommandError, match="give the server's URL, or --command"):
        run("add_server", "deploy")
    assert not McpServer.objects.exists()


def test_create_agent_trims_the_name_it_checks_so_no_look_alike_agent_is_made() -> None:
    factories.server("deploy")
    output = run("create_agent", "  ci-bot ", "--server", "deploy")
    assert output.startswith("agent ci-bot may call: deploy")
    assert list(AgentClient.objects.values_list("name", flat=True)) == ["ci-bot"]
    with pytest.raises(CommandError, match="an agent named 'ci-bot' exists already"):
        run("create_agent", "ci-bot ", "--server", "deploy")
    assert AgentClient.objects.count() == 1


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"days": 10**9}, "before the year 1"),
        ({"days": 9_999_999}, "before the year 1"),
        ({"before": "2999-01-01T00:00:00+00:00"}, "lies in the future"),
        ({"before": "2026-02-30T00:00:00"}, "must be an ISO 8601 time"),
    ],
)
def test_prune_audit_refuses_a_cutoff_it_cannot_mean(options: dict[str, Any], message: str) -> None:
    factories.server("deploy")
    run("create_agent", "ci-bot", "--server", "deploy")  # audited: there are events to lose
    events = AuditEvent.objects.count()
    assert events > 0
    with pytest.raises(CommandError, match=message):
        call_command("prune_audit", stdout=io.StringIO(), **options)
    assert AuditEvent.objects.count() == events


@pytest.mark.parametrize("saved", ["[1]", "{}", '{"head_id": "x", "head_hash": "ab"}', '{"head_id": 1}'])
def test_verify_audit_refuses_a_file_that_is_not_a_saved_head(saved: str, tmp_path: Path) -> None:
    factories.server("deploy")
    run("create_agent", "ci-bot", "--server", "deploy")
    head = tmp_path / "head.json"
    head.write_text(saved)
    with pytest.raises(CommandError, match="is not a head saved by export_audit_head"):
        run("verify_audit", "--head", str(head))


def test_a_saved_head_of_an_empty_chain_is_accepted_and_said_to_vouch_for_nothing(tmp_path: Path) -> None:
    head = tmp_path / "head.json"
    head.write_text(run("export_audit_head"))
    assert json.loads(head.read_text())["head_id"] is None
    said = run("verify_audit", "--head", str(head))
    assert "the saved head is of an empty chain: it vouches for nothing" in said
    assert "#None" not in said


@pytest.mark.parametrize("argv", [["create_token", "alice"], ["check_server", "deploy"]])
def test_a_command_with_the_database_down_says_so_in_one_line_and_exits_3(argv: list[str]) -> None:
    closed = f"postgres://postgres@127.0.0.1:{free_port()}/nothing"
    done = subprocess.run(
        [sys.executable, "manage.py", *argv],
        cwd=settings.BASE_DIR,
        env=child_env(DATABASE_URL=closed, ELICIT_DB_POOL_MAX="0", DJANGO_DEBUG="true"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 3, done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    assert "PostgreSQL (DATABASE_URL) did not answer (OperationalError)" in done.stderr
    assert done.stdout == ""


def test_add_server_does_not_carry_stored_headers_to_another_origin() -> None:
    run(
        "add_server",
        "deploy",
        "http://127.0.0.1:9/mcp",
        "--header",
        "Authorization: Bearer s3cret",
        "--no-probe",
    )
    with pytest.raises(
        CommandError, match=re.escape("set for http://127.0.0.1:9; to send requests to http://127.0.0.2:9")
    ) as e:
        run("add_server", "deploy", "http://127.0.0.2:9/mcp", "--no-probe")
    assert "s3cret" not in str(e.value)
    server = McpServer.objects.get(slug="deploy")
    assert (server.url, server.headers) == ("http://127.0.0.1:9/mcp", {"Authorization": "Bearer s3cret"})
    run("add_server", "deploy", "http://127.0.0.1:9/other", "--no-probe")  # same origin: they stay
    assert McpServer.objects.get(slug="deploy").headers == {"Authorization": "Bearer s3cret"}
    run(
        "add_server",
        "deploy",
        "http://127.0.0.2:9/mcp",
        "--header",
        "Authorization: Bearer new",
        "--no-probe",
    )
    assert McpServer.objects.get(slug="deploy").headers == {"Authorization": "Bearer new"}
    run("add_server", "deploy", "http://127.0.0.3:9/mcp", "--clear-headers", "--no-probe")
    assert McpServer.objects.get(slug="deploy").headers == {}


def test_create_token_refuses_an_inactive_user_whose_token_would_never_work() -> None:
    factories.user("eve", is_active=False)
    with pytest.raises(CommandError, match="'eve' is inactive"):
        run("create_token", "eve")
    assert not PersonalToken.objects.exists()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["run_gateway", "--port", "70000"], "argument --port: 70000 is not a port (1 to 65535)"),
        (["run_holder", "--max-calls", "-1"], "argument --max-calls: -1 is less than 1"),
    ],
)
def test_a_server_command_refuses_a_number_it_cannot_use_instead_of_starting(
    argv: list[str], message: str
) -> None:
    # Before: the gateway said it listened on 70000 (bound elsewhere); the holder ran holding nothing.
    done = subprocess.run(
        [sys.executable, "manage.py", *argv],
        cwd=settings.BASE_DIR,
        env=child_env(DJANGO_DEBUG="true"),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 2
    assert message in done.stderr
