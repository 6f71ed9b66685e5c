"""`add_server --secrets-stdin`: a server's credentials (its headers, or a stdio server's environment) read
from stdin, so they stay out of the command line, the process list and the shell's history."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from approvals.models import AuditEvent, McpServer
from tests import live

URL = "http://127.0.0.1:9/mcp"
SECRET = "s3cret-from-stdin"


def add(*args: str, stdin: str) -> str:
    out = io.StringIO()
    call_command("add_server", *args, "--no-probe", "--secrets-stdin", stdin=io.StringIO(stdin), stdout=out)
    return out.getvalue()


@pytest.mark.django_db
def test_headers_come_from_stdin_beside_those_given_and_are_never_shown() -> None:
    said = add("deploy", URL, "--header", "X-Team: release", stdin=f"Authorization: Bearer {SECRET}\r\n\n")

    server = McpServer.objects.get(slug="deploy")
    assert server.headers == {"X-Team": "release", "Authorization": f"Bearer {SECRET}"}
    assert "(2 header(s))" in said and SECRET not in said
    assert not any(SECRET in str(data) for data in AuditEvent.objects.values_list("data", flat=True))


@pytest.mark.django_db
def test_a_stdio_servers_environment_comes_from_stdin() -> None:
    said = add("files", "--command", sys.executable, "--arg=-V", stdin=f"API_TOKEN={SECRET}\nREGION=eu\n")

    server = McpServer.objects.get(slug="files")
    assert server.env == {"API_TOKEN": SECRET, "REGION": "eu"}
    assert "2 environment variable(s)" in said and SECRET not in said


@pytest.mark.django_db
def test_bad_or_oversized_stdin_is_refused_before_anything_is_stored() -> None:
    with pytest.raises(CommandError, match="--header"):
        add("deploy", URL, stdin="not a header line\n")
    with pytest.raises(CommandError, match="more than 64 KiB"):
        add("deploy", URL, stdin="X-Pad: " + "p" * 70_000 + "\n")
    assert not McpServer.objects.exists()


def test_the_shell_pipes_the_secret_in_and_it_is_not_in_the_command_line(live_db: None) -> None:
    done = subprocess.run(
        [sys.executable, "manage.py", "add_server", "piped", URL, "--no-probe", "--secrets-stdin"],
        input=f"Authorization: Bearer {SECRET}\n",
        capture_output=True,
        text=True,
        cwd=Path(__file__).parent.parent,
        env={**os.environ, "DATABASE_URL": live.test_database_url(), "DJANGO_DEBUG": "true"},
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert SECRET not in done.stdout + done.stderr
    assert McpServer.objects.get(slug="piped").headers == {"Authorization": f"Bearer {SECRET}"}
