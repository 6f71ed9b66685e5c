"""Registering stdio servers (admins only): `manage.py add_server --command` and the admin's server form.
The environment is write-only: never printed, never shown back, never in an error."""

from __future__ import annotations

import io
import os
import shutil
import sys
from pathlib import Path

import pytest
from django.contrib.admin.models import LogEntry
from django.core.management import CommandError, call_command

from approvals.models import AuditEvent, McpServer
from approvals.services import stdio as stdio_rules

pytestmark = pytest.mark.django_db

SECRET = "s3cret-token-value"


def run(*args: str) -> str:
    out = io.StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


def test_add_server_registers_a_command_its_arguments_and_environment_without_printing_values() -> None:
    output = run(
        "add_server",
        "local-tools",
        "--command",
        "python3",
        "--arg=-m",  # a value starting with "-" is given with "="
        "--arg",
        "my_server --flag",
        "--env",
        f"API_TOKEN={SECRET}",
        "--env",
        "MODE=a=b",
        "--team",
        "ops",
    )
    server = McpServer.objects.get(slug="local-tools")
    assert server.transport == McpServer.Transport.STDIO and server.url == ""
    assert server.command == shutil.which("python3")  # found on PATH, stored as its absolute path
    assert server.args == ["-m", "my_server --flag"]
    assert server.env == {"API_TOKEN": SECRET, "MODE": "a=b"}
    assert server.default_team.slug == "ops"
    assert server.needs_session
    assert SECRET not in output and "2 environment variable(s)" in output
    assert not AuditEvent.objects.filter(data__icontains=SECRET).exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--command", "bin/server"), "absolute path or a name found on PATH"),
        (("--command", "no-such-command-anywhere"), "not found on PATH"),
        (("--command", __file__), "not an executable file"),  # mode 0644
        (("--command", "/no/such/file"), "not an executable file"),
        (("--command", "python3", "--env", f"NOVALUE{SECRET}"), 'line 1 is not "NAME=value"'),
        (("--command", "python3", "--env", f"1BAD={SECRET}"), 'line 1 is not "NAME=value"'),
        (("--command", "python3", "--env", "BIG=" + "x" * 9000), "BIG is longer than"),
        (("--command", "python3", *["--arg", "a"] * 65), "At most 64 arguments"),
        (("--command", "python3", "--arg", "x" * 5000), "at most 4096 characters"),
        (("http://127.0.0.1:9/mcp", "--command", "python3"), "no URL"),
        (("--command", "python3", "--header", "A: b"), "no --header"),
        (("http://127.0.0.1:9/mcp", "--env", "A=b"), "belong to a stdio server"),
        (("--command", "x" * 600), "longer than 500"),
    ],
)
def test_add_server_refuses_bad_stdio_input_and_stores_nothing(args: tuple[str, ...], message: str) -> None:
    with pytest.raises(CommandError, match=message) as refused:
        run("add_server", "local-tools", *args)
    assert SECRET not in str(refused.value)
    assert not McpServer.objects.exists()


def test_add_server_with_neither_url_nor_command_is_refused() -> None:
    with pytest.raises(CommandError):
        run("add_server", "local-tools")
    assert not McpServer.objects.exists()


def test_registering_a_url_for_a_stdio_server_drops_its_command_and_environment() -> None:
    run("add_server", "tools", "--command", sys.executable, "--env", f"API_TOKEN={SECRET}")
    run("add_server", "tools", "http://127.0.0.1:9/mcp", "--no-probe")
    server = McpServer.objects.get(slug="tools")
    assert (server.transport, server.url, server.command, server.args, server.env) == (
        McpServer.Transport.HTTP,
        "http://127.0.0.1:9/mcp",
        "",
        [],
        {},
    )


def test_env_lines_name_the_bad_line_never_its_value() -> None:
    assert stdio_rules.parse_env_lines(["A=1", "", "  ", "B_2= spaced value ", "C="]) == {
        "A": "1",
        "B_2": " spaced value ",
        "C": "",
    }
    for lines in ([f"{SECRET}"], [f"BAD NAME={SECRET}"], ["A=1", f"-X={SECRET}"]):
        with pytest.raises(ValueError) as bad:
            stdio_rules.parse_env_lines(lines)
        assert SECRET not in str(bad.value)
    with pytest.raises(ValueError, match="at most 64"):
        stdio_rules.parse_env_lines([f"V{i}=x" for i in range(65)])


def test_a_command_must_be_executable(tmp_path: Path) -> None:
    script = tmp_path / "server"
    script.write_text("#!/bin/sh\n")
    with pytest.raises(ValueError, match="not an executable"):
        stdio_rules.check_command(str(script))
    os.chmod(script, 0o700)
    assert stdio_rules.check_command(str(script)) == str(script)
    with pytest.raises(ValueError, match="not an executable"):
        stdio_rules.check_command(str(tmp_path))  # a directory


# ---- the admin ------------------------------------------------------------------------------------------


def stdio_form(**extra: str) -> dict[str, str]:
    return {
        "slug": "local-tools",
        "name": "Local tools",
        "transport": "stdio",
        "url": "",
        "command": sys.executable,
        "arguments": "-m\nmy_server\n",
        "new_env": f"API_TOKEN={SECRET}\nMODE=fast",
        "enabled": "on",
        "on_expiry": "",
    } | extra


def test_the_admin_registers_a_stdio_server_and_never_shows_its_environment(admin_client) -> None:
    page = admin_client.post("/admin/approvals/mcpserver/add/", stdio_form())
    assert page.status_code == 302, page.content.decode()[:2000]
    server = McpServer.objects.get(slug="local-tools")
    assert (server.transport, server.command, server.args) == ("stdio", sys.executable, ["-m", "my_server"])
    assert server.env == {"API_TOKEN": SECRET, "MODE": "fast"}

    change = admin_client.get(f"/admin/approvals/mcpserver/{server.pk}/change/").content.decode()
    assert "my_server" in change  # the arguments are shown back
    assert SECRET not in change and "API_TOKEN" not in change
    listing = admin_client.get("/admin/approvals/mcpserver/").content.decode()
    assert "2 environment variable(s) set" in listing and SECRET not in listing
    assert not any(SECRET in entry.change_message for entry in LogEntry.objects.all())

    # Saving without new values keeps the environment; "remove" clears it.
    keep = stdio_form(new_env="", name="Local tools (renamed)")
    assert admin_client.post(f"/admin/approvals/mcpserver/{server.pk}/change/", keep).status_code == 302
    server.refresh_from_db()
    assert server.env == {"API_TOKEN": SECRET, "MODE": "fast"} and server.name == "Local tools (renamed)"
    clear = stdio_form(new_env="", clear_env="on")
    assert admin_client.post(f"/admin/approvals/mcpserver/{server.pk}/change/", clear).status_code == 302
    server.refresh_from_db()
    assert server.env == {}


@pytest.mark.parametrize(
    ("extra", "field", "message"),
    [
        ({"command": "no-such-command-anywhere"}, "command", "not found on PATH"),
        ({"command": "relative/server"}, "command", "absolute path"),
        ({"command": ""}, "command", "empty"),
        ({"url": "http://127.0.0.1:9/mcp"}, "url", "no URL"),
        ({"new_env": f"BROKEN {SECRET}"}, "new_env", 'line 1 is not "NAME=value"'),
        ({"transport": "http", "url": ""}, "url", "needs its URL"),
        ({"transport": "http", "url": "http://127.0.0.1:9/mcp"}, "command", "Only a stdio server"),
    ],
)
def test_the_admin_refuses_bad_stdio_registrations(
    admin_client, extra: dict, field: str, message: str
) -> None:
    from approvals.admin import McpServerForm

    form = McpServerForm(data=stdio_form(**extra))
    assert not form.is_valid()
    assert message in " ".join(form.errors[field])
    assert SECRET not in str(form.errors)
    page = admin_client.post("/admin/approvals/mcpserver/add/", stdio_form(**extra))
    assert page.status_code == 200 and SECRET not in page.content.decode()
    assert not McpServer.objects.exists()


def test_a_refused_admin_form_does_not_echo_typed_credentials(admin_client) -> None:
    form = {"slug": "deploy", "name": "Deploy", "url": "ftp://x", "enabled": "on", "on_expiry": ""}
    page = admin_client.post(
        "/admin/approvals/mcpserver/add/", form | {"new_headers": f"Authorization: {SECRET}"}
    )
    assert page.status_code == 200 and "url" in page.context["adminform"].form.errors
    assert SECRET not in page.content.decode()


@pytest.mark.parametrize("user", ["no-such-user-anywhere", "root"])
def test_a_root_hub_warns_when_stdio_servers_cannot_drop_root(settings, user: str) -> None:
    from django.core.checks import run_checks

    settings.ELICIT_STDIO_USER = user
    warnings = [w for w in run_checks() if w.id == "approvals.W001"]
    if os.geteuid() == 0:
        assert len(warnings) == 1 and "never run as root" in warnings[0].msg
    else:
        assert warnings == []  # the hub's own user runs them
    settings.ELICIT_STDIO_USER = "nobody"
    assert not [w for w in run_checks() if w.id == "approvals.W001"]


@pytest.mark.parametrize(
    "change",
    [
        {"arguments": "-m\nsomeone_elses_server\n"},  # another package under the same runner
        {"command": shutil.which("env") or "/usr/bin/env", "arguments": ""},  # a program that prints it
    ],
)
def test_the_stored_environment_does_not_follow_another_command_unseen(admin_client, change) -> None:
    assert admin_client.post("/admin/approvals/mcpserver/add/", stdio_form()).status_code == 302
    server = McpServer.objects.get(slug="local-tools")
    url = f"/admin/approvals/mcpserver/{server.pk}/change/"

    page = admin_client.post(url, stdio_form(new_env="", **change))
    assert page.status_code == 200
    errors = page.context["adminform"].form.errors
    assert "set it again here, or remove it" in " ".join(errors["new_env"])
    assert SECRET not in page.content.decode()
    server.refresh_from_db()
    assert (server.command, server.args) == (sys.executable, ["-m", "my_server"])  # nothing saved

    again = stdio_form(new_env="API_TOKEN=for-the-new-one", **change)
    assert admin_client.post(url, again).status_code == 302
    server.refresh_from_db()
    assert server.env == {"API_TOKEN": "for-the-new-one"}
    assert admin_client.post(url, stdio_form(new_env="", clear_env="on")).status_code == 302
    server.refresh_from_db()
    assert server.env == {} and server.args == ["-m", "my_server"]


def test_add_server_does_not_carry_a_stored_environment_to_another_command() -> None:
    base = ("add_server", "local-tools", "--command", sys.executable, "--arg=-m", "--arg", "my_server")
    run(*base, "--env", f"API_TOKEN={SECRET}")
    run(*base, "--name", "Local tools")  # the same command and arguments: it stays
    assert McpServer.objects.get(slug="local-tools").env == {"API_TOKEN": SECRET}
    with pytest.raises(CommandError, match="give it again with --env, or remove it with --clear-env") as e:
        run("add_server", "local-tools", "--command", sys.executable, "--arg=-m", "--arg", "other_server")
    assert SECRET not in str(e.value)
    server = McpServer.objects.get(slug="local-tools")
    assert (server.args, server.env) == (["-m", "my_server"], {"API_TOKEN": SECRET})
    with pytest.raises(CommandError, match="give one"):
        run(*base, "--env", "A=1", "--clear-env")
    run("add_server", "local-tools", "--command", sys.executable, "--arg=-m", "--arg", "other", "--clear-env")
    server = McpServer.objects.get(slug="local-tools")
    assert (server.args, server.env) == (["-m", "other"], {})
