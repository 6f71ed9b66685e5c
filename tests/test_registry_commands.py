"""The registry's commands given bad arguments: each is refused with a clear error (a `CommandError`, exit
status 1 from the shell) before anything is stored, instead of a database traceback or a row the admin and
the hub's URLs cannot handle."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from approvals.models import AgentClient, AuditEvent, McpServer, PersonalToken, Team
from tests import factories, live

URL = "http://127.0.0.1:9/mcp"


def run(*args: str) -> str:
    out = io.StringIO()
    call_command(*args, stdout=out, stderr=io.StringIO())
    return out.getvalue()


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("args", "says"),
    [
        (("deploy tools", URL), "slug"),  # a space: not a slug, breaks /mcp/<slug> and the admin's URLs
        (("deploy/prod", URL), "slug"),
        (("déploy", URL), "slug"),
        (("d" * 51, URL), "slug"),
        (("deploy", URL, "--name", "n" * 121), "--name"),
        (("deploy", URL + "/" + "p" * 500), "URL"),
        (("deploy", URL, "--team", "release team"), "--team"),
        (("deploy", URL, "--team", "t" * 51), "--team"),
    ],
)
def test_add_server_refuses_what_it_cannot_store_before_storing_anything(args: tuple, says: str) -> None:
    with pytest.raises(CommandError) as info:
        run("add_server", *args, "--no-probe")
    assert says in str(info.value)
    assert not McpServer.objects.exists() and not Team.objects.exists()
    assert not AuditEvent.objects.exists()


@pytest.mark.django_db
@pytest.mark.parametrize(("name", "says"), [("a" * 121, "name"), ("", "name"), ("   ", "name")])
def test_create_agent_refuses_a_name_it_cannot_store(name: str, says: str) -> None:
    factories.server("deploy")
    with pytest.raises(CommandError) as info:
        run("create_agent", name, "--server", "deploy")
    assert says in str(info.value) and not AgentClient.objects.exists()


@pytest.mark.django_db
def test_create_token_refuses_a_name_it_cannot_store() -> None:
    factories.user("dave")
    with pytest.raises(CommandError, match="--name"):
        run("create_token", "dave", "--name", "n" * 121)
    assert not PersonalToken.objects.exists()


def test_a_refused_argument_exits_1_with_the_error_and_no_traceback(live_db: None) -> None:
    done = subprocess.run(
        [sys.executable, "manage.py", "add_server", "x" * 60, URL, "--no-probe"],
        capture_output=True,
        text=True,
        cwd=Path(__file__).parent.parent,
        env={**__import__("os").environ, "DATABASE_URL": live.test_database_url(), "DJANGO_DEBUG": "true"},
        timeout=60,
    )
    assert done.returncode == 1 and "CommandError" in done.stderr and "Traceback" not in done.stderr
    assert not McpServer.objects.exists()
