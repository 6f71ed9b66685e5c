"""`make run`'s demo set-up (`manage.py bootstrap_demo`) run again on the next start."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from django.core.management import call_command
from django.test import override_settings

from approvals.management.commands import bootstrap_demo
from approvals.models import McpServer, Team


@pytest.mark.django_db
def test_the_next_start_keeps_what_an_admin_changed_on_the_demo_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, demo_server: object
) -> None:
    monkeypatch.setattr(bootstrap_demo, "VAR_DIR", tmp_path)
    url = demo_server.url  # type: ignore[attr-defined]
    with override_settings(ELICIT_DEMO_MCP_URL=url):
        call_command("bootstrap_demo", stdout=io.StringIO())
        platform = Team.objects.create(slug="platform", name="Platform")
        McpServer.objects.filter(slug="demo").update(
            name="Our sandbox", default_team=platform, era="2026-07-28"
        )

        out = io.StringIO()
        call_command("bootstrap_demo", stdout=out)

    demo = McpServer.objects.get(slug="demo")
    assert (demo.name, demo.default_team, demo.era) == ("Our sandbox", platform, "2026-07-28")
    assert demo.url == url
    assert demo.probe is not None and demo.probe["ok"] is True  # probed again all the same
    assert "probe: ok" in out.getvalue()


@pytest.mark.django_db
def test_a_demo_server_registered_elsewhere_is_moved_to_the_demo_url(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, demo_server: object
) -> None:
    monkeypatch.setattr(bootstrap_demo, "VAR_DIR", tmp_path)
    url = demo_server.url  # type: ignore[attr-defined]
    with override_settings(ELICIT_DEMO_MCP_URL="http://127.0.0.1:9/mcp"):
        call_command("bootstrap_demo", stdout=io.StringIO())
    with override_settings(ELICIT_DEMO_MCP_URL=url):
        call_command("bootstrap_demo", stdout=io.StringIO())
    demo = McpServer.objects.get(slug="demo")
    assert demo.url == url
    assert demo.probe is not None and demo.probe["ok"] is True
