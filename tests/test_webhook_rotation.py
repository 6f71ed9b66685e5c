"""Rotating an agent's webhook signing secret: for an overlap the hub signs each delivery with the new secret
and the one it replaces (Standard Webhooks' space-separated signatures), so a receiver switches without
refusing anything; the receiver here verifies with the Standard Webhooks reference library. Rotating the
token or the secret is an operator's command, audited without the values."""

from __future__ import annotations

import json
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.test import Client
from django.utils import timezone
from standardwebhooks import Webhook, WebhookVerificationError

from approvals.audit import core as audit
from approvals.models import AgentClient, AuditEvent, WebhookDelivery
from approvals.services import tokens, webhooks
from tests import factories
from tests.hub import WebhookReceiver


@pytest.fixture(autouse=True)
def attempts_made_here(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each attempt is made by the test itself: a delivery's task is not queued, so a Celery worker that
    another test left running cannot make the attempt first."""
    monkeypatch.setattr(webhooks, "enqueue_on_commit", lambda *args, **kwargs: None)


def delivered(agent: AgentClient) -> tuple[bytes, dict[str, str]]:
    """One finished call's webhook, as the receiver got it."""
    with WebhookReceiver() as receiver:
        call = factories.call(agent.servers.get(), agent, callback_url=receiver.url)
        factories.finish_call(call.pk)
        (delivery,) = WebhookDelivery.objects.filter(call=call)
        assert webhooks.webhook_attempt(delivery_id=str(delivery.pk)) is None
    (received,) = receiver.received
    return received.body, received.headers


def verifies(secret: str, body: bytes, headers: dict[str, str]) -> bool:
    try:
        Webhook(secret).verify(body, headers)
    except WebhookVerificationError:
        return False
    return True


def signing_agent() -> AgentClient:
    agent, _ = tokens.agent_create(
        name="deployer", servers=[factories.server("deploy")], with_webhook_secret=True
    )
    return agent


@pytest.mark.django_db(transaction=True)
def test_during_the_overlap_either_secret_verifies_and_after_it_only_the_new_one() -> None:
    agent = signing_agent()
    old = agent.webhook_secret

    new, until = tokens.webhook_secret_rotate(agent=agent, keep_previous_for=timedelta(hours=24))

    assert new != old and until is not None and until > timezone.now() + timedelta(hours=23)
    body, headers = delivered(agent)
    assert len(headers["webhook-signature"].split(" ")) == 2
    assert verifies(new, body, headers) and verifies(old, body, headers)

    AgentClient.objects.filter(pk=agent.pk).update(previous_webhook_secret_until=timezone.now())
    body, headers = delivered(agent)
    assert len(headers["webhook-signature"].split(" ")) == 1
    assert verifies(new, body, headers)
    assert not verifies(old, body, headers)


@pytest.mark.django_db(transaction=True)
def test_a_leaked_secret_rotated_without_overlap_stops_signing_at_once() -> None:
    agent = signing_agent()
    old = agent.webhook_secret

    new, until = tokens.webhook_secret_rotate(agent=agent, keep_previous_for=timedelta(0))

    assert until is None
    body, headers = delivered(agent)
    assert verifies(new, body, headers)
    assert not verifies(old, body, headers)
    agent.refresh_from_db()
    assert agent.previous_webhook_secret == ""


@pytest.mark.django_db(transaction=True)
def test_a_second_rotation_replaces_the_overlap_and_the_first_secret_no_longer_signs() -> None:
    agent = signing_agent()
    first = agent.webhook_secret
    second, _ = tokens.webhook_secret_rotate(agent=agent, keep_previous_for=timedelta(hours=1))
    third, _ = tokens.webhook_secret_rotate(agent=agent, keep_previous_for=timedelta(hours=1))

    body, headers = delivered(agent)

    assert verifies(third, body, headers) and verifies(second, body, headers)
    assert not verifies(first, body, headers)


@pytest.mark.django_db(transaction=True)
def test_the_command_rotates_the_secret_and_the_token_and_the_audit_holds_neither() -> None:
    agent = signing_agent()
    old_secret = agent.webhook_secret
    server = agent.servers.get()
    call = factories.call(server, agent)
    last = AuditEvent.objects.order_by("-id").values_list("id", flat=True).first() or 0
    out = _run("deployer", "--token", "--webhook-secret", "--keep-previous-secret-for", "2")

    agent.refresh_from_db()
    printed = dict(line.split(": ", 1) for line in out.splitlines() if ": " in line)
    assert printed["webhook secret"] == agent.webhook_secret != old_secret
    assert agent.previous_webhook_secret == old_secret
    assert agent.previous_webhook_secret_until is not None
    assert timedelta(hours=1.9) < agent.previous_webhook_secret_until - timezone.now() <= timedelta(hours=2)
    token = printed["token"]
    api = Client()
    assert (
        api.get(f"/api/v1/calls/{call.pk}", headers={"authorization": f"Bearer {token}"}).status_code == 200
    )

    events = list(AuditEvent.objects.filter(id__gt=last))
    assert sorted(e.verb for e in events) == ["agent.changed", "token.rotated"]
    assert all(e.actor_label == "manage.py rotate_agent" for e in events)
    changed = next(e for e in events if e.verb == "agent.changed")
    fields = {change["field"] for change in changed.data["changes"]}
    assert {"webhook_secret", "previous_webhook_secret", "previous_webhook_secret_until"} <= fields
    recorded = json.dumps([e.data for e in events])
    for secret in (old_secret, agent.webhook_secret, token, tokens.hash_token(token)):
        assert secret not in recorded
        assert secret.removeprefix("whsec_") not in recorded
    assert audit.verify().ok


@pytest.mark.django_db(transaction=True)
def test_an_agent_without_a_secret_gets_one_and_nothing_overlaps() -> None:
    tokens.agent_create(name="quiet", servers=[factories.server("deploy")])

    out = _run("quiet", "--webhook-secret")

    agent = AgentClient.objects.get(name="quiet")
    assert f"webhook secret: {agent.webhook_secret}" in out
    assert agent.webhook_secret.startswith("whsec_")
    assert agent.previous_webhook_secret == "" and agent.previous_webhook_secret_until is None
    assert "signed by the new secret only" in out


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["deployer"], "say what to rotate"),
        (["nobody", "--token"], "no agent named 'nobody'"),
        (["deployer", "--webhook-secret", "--keep-previous-secret-for", "nan"], "not between 0 and 168"),
        (["deployer", "--webhook-secret", "--keep-previous-secret-for", "200"], "not between 0 and 168"),
        (["deployer", "--webhook-secret", "--keep-previous-secret-for", "soon"], "not a number of hours"),
    ],
)
def test_the_command_refuses_what_it_cannot_do_and_changes_nothing(args: list[str], message: str) -> None:
    agent = signing_agent()
    before = (agent.token_hash, agent.webhook_secret)

    with pytest.raises(CommandError, match=message):
        _run(*args)

    agent.refresh_from_db()
    assert (agent.token_hash, agent.webhook_secret) == before


def _run(*args: str) -> str:
    out = StringIO()
    call_command("rotate_agent", *args, stdout=out)
    return out.getvalue()


@pytest.mark.django_db
def test_the_admin_shows_until_when_the_replaced_secret_signs_and_neither_secret(
    admin_client: Client,
) -> None:
    agent = signing_agent()
    old = agent.webhook_secret
    page = admin_client.get(f"/admin/approvals/agentclient/{agent.pk}/change/").content.decode()
    assert "Replaced secret still signs until" in page
    new, until = tokens.webhook_secret_rotate(agent=agent, keep_previous_for=timedelta(hours=5))
    assert until is not None

    page = admin_client.get(f"/admin/approvals/agentclient/{agent.pk}/change/").content.decode()

    assert str(until.year) in page.split("Replaced secret still signs until", 1)[1][:400]
    for secret in (old, new):
        assert secret.removeprefix("whsec_") not in page
