"""A relay for a server the hub does not know is shown under the agent's label (its card's server, which the
page's live filter compares): the queue's server filter offers that label and finds its rounds, as it does a
registered server's."""

from __future__ import annotations

from typing import Any

import pytest

from approvals.services import calls
from tests import factories

pytestmark = pytest.mark.django_db


def _relay(agent: Any, label: str, tool: str) -> Any:
    call, _ = calls.relay_submit(
        agent=agent,
        server_slug=label,
        tool=tool,
        arguments={},
        input_requests={
            "env": {
                "method": "elicitation/create",
                "params": {
                    "mode": "form",
                    "message": "Which one?",
                    "requestedSchema": factories.ENVIRONMENT_SCHEMA,
                },
            }
        },
    )
    return call


def test_the_server_filter_finds_a_relays_label(client: Any) -> None:
    staff = factories.user("sam", is_staff=True)
    deploy = factories.server("deploy")
    agent, _ = factories.agent("ci-bot", servers=[deploy])
    theirs = _relay(agent, "vendor-x", "sync_vendor")
    ours = factories.call(deploy, agent, tool="create_deployment")
    factories.open_round(ours)
    client.force_login(staff)

    page = client.get("/", {"server": "vendor-x"})
    assert page.status_code == 200
    assert f'data-call="{theirs.pk}"' in page.text
    assert f'data-call="{ours.pk}"' not in page.text
    assert '<option value="vendor-x" dir="auto" selected>' in page.text
    assert client.get("/queue/count/", {"server": "vendor-x"}).json() == {"pending": 1}

    everything = client.get("/")
    assert '<option value="vendor-x" dir="auto">' in everything.text  # offered among the servers
    assert '<option value="deploy" dir="auto">' in everything.text
    only_deploy = client.get("/", {"server": "deploy"})
    assert f'data-call="{ours.pk}"' in only_deploy.text
    assert f'data-call="{theirs.pk}"' not in only_deploy.text
