"""Re-registering a server from the command line: what the operator did not give stays as it was."""

from __future__ import annotations

import io

import pytest
from django.core.management import call_command

from approvals.models import McpServer, Team

pytestmark = pytest.mark.django_db

URL = "http://127.0.0.1:9/mcp"


@pytest.fixture(autouse=True)
def _loopback_allowed(settings: object) -> None:
    settings.ELICIT_OUTBOUND_ALLOW = "127.0.0.1"  # type: ignore[attr-defined]


def add_server(*args: str) -> str:
    out = io.StringIO()
    call_command("add_server", *args, "--no-probe", stdout=out)
    return out.getvalue()


def test_updating_a_server_keeps_its_name_and_default_team_unless_given() -> None:
    add_server("deploy", URL, "--name", "Deploy bot", "--team", "release")

    # Rotating the server's credential: nothing else given.
    add_server("deploy", URL, "--header", "Authorization: Bearer new")

    server = McpServer.objects.select_related("default_team").get(slug="deploy")
    assert server.name == "Deploy bot"
    assert server.default_team is not None and server.default_team.slug == "release"
    assert server.headers == {"Authorization": "Bearer new"}


def test_updating_a_server_sets_what_is_given() -> None:
    add_server("deploy", URL, "--name", "Deploy bot", "--team", "release")
    Team.objects.create(slug="ops", name="Ops")

    add_server("deploy", URL, "--name", "Deployer", "--team", "ops")

    server = McpServer.objects.select_related("default_team").get(slug="deploy")
    assert server.name == "Deployer"
    assert server.default_team is not None and server.default_team.slug == "ops"


def test_a_new_server_is_named_after_its_slug_without_a_team() -> None:
    add_server("deploy-bot", URL)

    server = McpServer.objects.get(slug="deploy-bot")
    assert (server.name, server.default_team) == ("Deploy Bot", None)


def test_updating_a_stdio_server_keeps_its_name_and_default_team() -> None:
    call_command(
        "add_server",
        "files",
        "--command",
        "/bin/true",
        "--name",
        "Shared files",
        "--team",
        "ops",
        stdout=io.StringIO(),
    )

    call_command("add_server", "files", "--command", "/bin/true", "--arg", "x", stdout=io.StringIO())

    server = McpServer.objects.select_related("default_team").get(slug="files")
    assert server.name == "Shared files"
    assert server.default_team is not None and server.default_team.slug == "ops"
    assert server.args == ["x"]


def test_rotating_a_deactivated_agents_token_says_it_will_not_work_yet() -> None:
    from approvals.models import AgentClient
    from tests import factories

    agent, _ = factories.agent("ci-bot")
    AgentClient.objects.filter(pk=agent.pk).update(is_active=False)
    out = io.StringIO()

    call_command("rotate_agent", "ci-bot", "--token", stdout=out)

    assert "token: " in out.getvalue()
    assert "ci-bot is deactivated" in out.getvalue()
    out = io.StringIO()
    AgentClient.objects.filter(pk=agent.pk).update(is_active=True)
    call_command("rotate_agent", "ci-bot", "--token", stdout=out)
    assert "deactivated" not in out.getvalue()
