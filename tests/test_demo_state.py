"""`make run`'s demo state: the demo agent's token belongs to the database it was minted in, and a demo
step that fails never takes the hub down."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from django.core.management import call_command
from django.db import connection

from approvals.management.commands import bootstrap_demo
from approvals.models import AgentClient
from approvals.services import tokens
from elicit_hub import launch
from tests import factories
from tests.live import Daphne


@pytest.fixture
def var_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(bootstrap_demo, "VAR_DIR", tmp_path)
    return tmp_path


def _kept_token() -> str:
    return bootstrap_demo.token_file().read_text().strip()


def _is_demo_agent(token: str) -> bool:
    found = tokens.authenticate(token)
    return isinstance(found, AgentClient) and found.name == "demo-agent"


@pytest.mark.django_db
def test_the_demo_token_is_kept_per_database_and_reminted_when_it_does_not_authenticate(
    var_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    call_command("bootstrap_demo", stdout=io.StringIO())
    first = _kept_token()
    assert _is_demo_agent(first)
    agent = AgentClient.objects.get(name="demo-agent")
    # The demo server answers a re-sent tools/call from its Idempotency-Key store: it is registered so.
    assert agent.servers.get().honours_idempotency_key is True
    factories.call(agent.servers.get(), agent)  # the agent has a call now: it can never be deleted

    # Run again: the kept token still works, so nothing changes.
    call_command("bootstrap_demo", stdout=io.StringIO())
    assert _kept_token() == first

    # The file now holds a token from another database (or was left by an older run): it is re-minted.
    bootstrap_demo.token_file().write_text(tokens.new_token(tokens.AGENT_PREFIX))
    call_command("bootstrap_demo", stdout=io.StringIO())
    again = _kept_token()
    assert again != first and _is_demo_agent(again)
    assert not _is_demo_agent(first)
    assert AgentClient.objects.filter(name="demo-agent").count() == 1

    # Another database keeps its token in another file.
    here = bootstrap_demo.token_file()
    monkeypatch.setitem(connection.settings_dict, "NAME", "some_other_database")
    assert bootstrap_demo.token_file() != here
    assert bootstrap_demo.token_file().parent == var_dir


@pytest.mark.usefixtures("live_db")
def test_a_failing_demo_step_warns_and_the_launcher_goes_on(
    web: Daphne, capsys: pytest.CaptureFixture[str]
) -> None:
    # The hub answers 401 to a token of another database; before, that stopped the hub and its engines.
    wrong = tokens.new_token(tokens.AGENT_PREFIX)
    assert launch.demo_step("demo_agent", "--hub", web.url, "--token", wrong) is False
    assert "warning: `manage.py demo_agent` failed" in capsys.readouterr().out
