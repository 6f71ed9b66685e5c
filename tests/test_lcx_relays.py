"""A relay's label never reads as a registered server the agent may not use, however it is spelled."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.test import Client

from approvals.models import ToolCall
from tests import factories
from tests.hub import off_the_loop

pytestmark = pytest.mark.django_db

ASK = {
    "method": "elicitation/create",
    "params": {"mode": "form", "message": "Which?", "requestedSchema": factories.ENVIRONMENT_SCHEMA},
}


@pytest.fixture
def relay() -> Any:
    factories.server("vault", name="Secrets vault")
    _, token = factories.agent("ci-bot", servers=[factories.server("deploy")])
    client = Client(HTTP_AUTHORIZATION=f"Bearer {token}")

    def post(label: str) -> Any:
        body = {"server": label, "tool": "read_secret", "arguments": {}, "input_requests": {"ok": ASK}}
        return off_the_loop(client.post, "/api/v1/relays", json.dumps(body), content_type="application/json")

    return post


@pytest.mark.parametrize(
    "label",
    [
        "Secrets  vault",  # two spaces: a page shows one
        "Secrets\u00a0vault",  # a no-break space
        "Secrets\tvault",
        "Secrets vault\u200b",  # a zero-width space
        "v\u200dault",  # a zero-width joiner
        "\u202dvault",  # a direction mark
        "\uff36\uff41\uff55\uff4c\uff54",  # full-width letters
    ],
)
def test_a_label_spelled_to_look_like_a_server_the_agent_may_not_use_is_refused(relay, label: str) -> None:
    """Only the exact spelling (in any case, outer spaces aside) was refused: the same name with its space
    doubled or made a no-break one, an invisible character added, or in full-width letters, was accepted,
    and reviewers saw the agent's questions under the vault's name."""
    refused = relay(label)
    assert refused.status_code == 403, refused.content
    assert refused.json()["error"]["code"] == "server_not_allowed"
    assert not ToolCall.objects.exists()


@pytest.mark.parametrize("label", ["Secrets vaults", "vault 2", "Deploy", "deploy-proxy"])
def test_a_label_of_its_own_stays_a_label(relay, label: str) -> None:
    created = relay(label)
    assert created.status_code == 201, created.content
    assert ToolCall.objects.get().server_label == label
