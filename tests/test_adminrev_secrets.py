"""What the admin shows of a secret, to a staff member who may only view: never the secret itself, neither
on a page nor through what a changelist's query string filters on (the count of matches is an oracle that
reads a credential letter by letter)."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import Permission
from django.test import Client

from approvals.models import AgentClient, InputRequest, McpServer, Team, ToolCall, WebhookDelivery
from approvals.services import tokens
from tests import factories

pytestmark = pytest.mark.django_db

PASSWORD_SCHEMA = {
    "type": "object",
    "properties": {"environment": {"type": "string"}, "password": {"type": "string"}},
}


def viewer(*codenames: str) -> Client:
    """A staff member who may only view these models."""
    user = factories.user("operator", is_staff=True)
    user.user_permissions.set(Permission.objects.filter(codename__in=codenames))
    client = Client()
    client.force_login(user)
    return client


def relayed_call() -> ToolCall:
    """A relay whose person typed a password into its form."""
    call = factories.call(
        factories.server(), kind=ToolCall.Kind.RELAY, callback_url="https://cb.example/hook?token=cb-tok-77"
    )
    rnd = factories.open_round(call)
    ir = InputRequest.objects.get(round=rnd)
    answer = {"environment": "production", "password": "hunter2-typed"}
    InputRequest.objects.filter(pk=ir.pk).update(
        requested_schema=PASSWORD_SCHEMA,
        status=InputRequest.Status.ANSWERED,
        action=InputRequest.Action.ACCEPT,
        content=answer,
        answered_at=ir.created_at,
    )
    ToolCall.objects.filter(pk=call.pk).update(
        status=ToolCall.Status.ANSWERED,
        input_responses={"environment": {"action": "accept", "content": answer}},
    )
    return call


@pytest.mark.parametrize(
    ("model", "lookup", "holder"),
    [
        ("mcpserver", "headers__Authorization__startswith", "Bearer sk-"),
        ("mcpserver", "url__contains", "api_key=k-"),
        ("mcpserver", "env__API_TOKEN__startswith", "t"),
        ("team", "chat_webhook_url__contains", "/services/T0"),
        ("agentclient", "webhook_secret__startswith", ""),
        ("agentclient", "token_hash__startswith", ""),
        ("personaltoken", "token_hash__startswith", ""),
        ("toolcall", "callback_url__contains", "token=cb-"),
        ("inputrequest", "content__password__startswith", "hunter"),
        ("user", "password__startswith", "pbkdf2"),
    ],
)
def test_a_changelist_cannot_be_filtered_on_a_secret(model: str, lookup: str, holder: str) -> None:
    factories.server(
        "vault",
        url="https://vault.example/mcp?api_key=k-123",
        headers={"Authorization": "Bearer sk-live-1"},
    )
    factories.server(
        "local", url="", transport=McpServer.Transport.STDIO, command="/bin/true", env={"API_TOKEN": "t1"}
    )
    Team.objects.create(slug="ops", name="Ops", chat_webhook_url="https://hooks.slack.com/services/T0/B0/x")
    agent, _ = factories.agent("ci-bot")
    AgentClient.objects.filter(pk=agent.pk).update(webhook_secret="whsec-1")
    tokens.personal_token_create(user=factories.user("alice"), name="laptop")
    relayed_call()
    client = viewer(f"view_{model}")
    changelist = f"/admin/{'auth' if model == 'user' else 'approvals'}/{model}/"

    assert client.get(changelist).status_code == 200
    assert client.get(changelist, {lookup: holder}).status_code == 400


def test_the_filters_a_changelist_offers_still_filter(admin_client: Client) -> None:
    ops = Team.objects.create(slug="ops", name="Ops")
    factories.server("kept", default_team=ops)
    other = factories.server("other")
    factories.call(McpServer.objects.get(slug="kept"), tool="kept_tool")
    factories.call(other, tool="other_tool")

    page = admin_client.get(
        "/admin/approvals/toolcall/", {"server__id__exact": other.pk, "status__exact": "queued"}
    )
    assert page.status_code == 200
    assert "other_tool" in page.text and "kept_tool" not in page.text
    assert (
        admin_client.get("/admin/approvals/mcpserver/", {"era__exact": "auto", "q": "kept"}).status_code
        == 200
    )
    # A filter offered on a relation does not reach the related model's secrets.
    assert admin_client.get("/admin/approvals/toolcall/", {"server__headers__x": "1"}).status_code == 400


def test_a_team_shown_read_only_shows_where_its_chat_webhook_goes_never_its_address() -> None:
    team = Team.objects.create(
        slug="ops", name="Ops", chat_webhook_url="https://hooks.slack.com/services/T0/B0/wh-secret-9"
    )
    page = viewer("view_team").get(f"/admin/approvals/team/{team.pk}/change/")

    assert page.status_code == 200
    assert "hooks.slack.com" in page.text
    assert "wh-secret-9" not in page.text and "/services/T0" not in page.text


def test_a_call_page_hides_the_callback_token_and_a_relayed_password() -> None:
    call = relayed_call()
    page = viewer("view_toolcall").get(f"/admin/approvals/toolcall/{call.pk}/change/")

    assert page.status_code == 200
    assert "cb.example" in page.text and "cb-tok-77" not in page.text
    assert "production" in page.text  # the answer is shown...
    assert "hunter2-typed" not in page.text and "(hidden)" in page.text  # ...but not its password


def test_an_input_request_page_hides_a_password_its_answer_holds() -> None:
    call = relayed_call()
    ir = InputRequest.objects.get(round__call=call)
    page = viewer("view_inputrequest").get(f"/admin/approvals/inputrequest/{ir.pk}/change/")

    assert page.status_code == 200
    assert "production" in page.text
    assert "hunter2-typed" not in page.text and "(hidden)" in page.text


def test_a_webhook_delivery_page_hides_a_relayed_password(admin_client: Client) -> None:
    call = relayed_call()
    answer: dict[str, Any] = {"environment": {"action": "accept", "content": {"password": "hunter2-typed"}}}
    delivery = WebhookDelivery.objects.create(
        call=call,
        event_type="call.answered",
        url=call.callback_url,
        payload={"type": "call.answered", "data": {"id": str(call.pk), "input_responses": answer}},
    )
    page = admin_client.get(f"/admin/approvals/webhookdelivery/{delivery.pk}/change/")

    assert page.status_code == 200
    assert "call.answered" in page.text and "(hidden)" in page.text
    assert "hunter2-typed" not in page.text and "cb-tok-77" not in page.text
