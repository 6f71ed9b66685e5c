"""Management commands for admins: register servers, create agents and personal tokens."""

from __future__ import annotations

import io

import pytest
from django.core.management import CommandError, call_command

from approvals.models import AgentClient, McpServer, PersonalToken
from approvals.services import tokens
from tests import factories

pytestmark = pytest.mark.django_db


def run(*args: str) -> str:
    out = io.StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


def test_add_server_stores_headers_without_printing_them(fake_dns) -> None:
    fake_dns["mcp.example.com"] = ["93.184.216.34"]
    output = run(
        "add_server",
        "deploy",
        "https://mcp.example.com/mcp",
        "--name",
        "Deploy bot",
        "--team",
        "release",
        "--header",
        "Authorization: Bearer s3cret-value",
        "--no-probe",  # nothing listens at that public address; the probe tests use loopback servers
    )
    server = McpServer.objects.get(slug="deploy")
    assert server.headers == {"Authorization": "Bearer s3cret-value"}
    assert server.default_team.slug == "release"
    assert "s3cret" not in output


@pytest.mark.parametrize(
    "args", [("deploy", "ftp://x"), ("deploy", "https://x.example.com", "--header", "nocolon")]
)
def test_add_server_refuses_bad_input(args, fake_dns) -> None:
    fake_dns["x.example.com"] = ["93.184.216.34"]
    with pytest.raises(CommandError):
        run("add_server", *args)
    assert not McpServer.objects.exists()


def test_create_agent_prints_a_token_once_and_stores_its_hash() -> None:
    factories.server("deploy")
    owner = factories.user("carol")
    output = run("create_agent", "ci-bot", "--server", "deploy", "--owner", "carol", "--webhook-secret")
    token = next(line.split(": ", 1)[1] for line in output.splitlines() if line.startswith("token: "))
    agent = AgentClient.objects.get(name="ci-bot")
    assert agent.token_hash == tokens.hash_token(token)
    assert agent.owner == owner
    assert agent.webhook_secret.startswith("whsec_") and agent.webhook_secret in output
    assert tokens.authenticate(token) == agent


def test_create_agent_refuses_unknown_servers() -> None:
    with pytest.raises(CommandError, match="unknown server"):
        run("create_agent", "ci-bot", "--server", "nope")


def test_create_token_acts_as_the_user() -> None:
    dave = factories.user("dave")
    output = run("create_token", "dave")
    token = output.split("token: ", 1)[1].split()[0]
    assert PersonalToken.objects.get().user == dave
    assert tokens.authenticate(token).user == dave
    with pytest.raises(CommandError):
        run("create_token", "nobody")


@pytest.mark.parametrize("line", ["nocolon-s3cret", ": s3cret"])
def test_the_admin_and_add_server_read_header_lines_alike(line: str) -> None:
    from approvals.admin import McpServerForm

    ok = McpServerForm(
        data={"slug": "a", "name": "A", "url": "http://127.0.0.1:9/a", "on_expiry": "", "enabled": "on"}
        | {"new_headers": "Authorization: Bearer x\n\n  X-Team:  blue  "}
    )
    assert ok.is_valid(), ok.errors
    assert ok.cleaned_data["new_headers"] == {"Authorization": "Bearer x", "X-Team": "blue"}
    run("add_server", "b", "http://127.0.0.1:9/b", "--header", "Authorization: Bearer x")
    assert McpServer.objects.get(slug="b").headers == {"Authorization": "Bearer x"}

    bad = McpServerForm(data={"slug": "c", "name": "C", "url": "http://127.0.0.1:9/c", "new_headers": line})
    assert not bad.is_valid() and "Name: value" in str(bad.errors["new_headers"])
    with pytest.raises(CommandError, match="Name: value"):
        run("add_server", "d", "http://127.0.0.1:9/d", "--header", line)
