"""Grants over HTTP: GET /api/v1/grants and POST /api/v1/grants/<id>/revoke, the grants page, revoking after
a confirmation, the approve form's "also allow the same again" fields and the queue's suggestion."""

from __future__ import annotations

from datetime import timedelta
from types import SimpleNamespace
from typing import Any

import pytest
from django.template.loader import render_to_string
from django.test import Client
from django.utils import timezone

from approvals.audit import core as audit
from approvals.models import AuditEvent, Grant, Membership
from approvals.services import gate_decisions, grants, tokens
from tests import factories
from tests.hub import ApiClient

pytestmark = pytest.mark.django_db

TOOL_DIGEST = "d" * 64


@pytest.fixture
def world() -> Any:
    alice, vera, olga = (factories.user(name) for name in ("alice", "vera", "olga"))
    release = factories.team("release", (alice, Membership.Role.REVIEWER), (vera, Membership.Role.VIEWER))
    ops = factories.team("ops", (olga, Membership.Role.REVIEWER))
    deploy = factories.server("deploy", name="Deploy bot", default_team=release)
    pager = factories.server("pager", name="Pager", default_team=ops)
    agent, agent_token = factories.agent("ci-bot", servers=[deploy, pager])
    other, other_token = factories.agent("other-bot", servers=[deploy])
    return SimpleNamespace(**locals())


def grant(
    world: Any, *, server: Any = None, agent: Any = None, choice: dict | None = None, **call: Any
) -> Grant:
    server = server or world.deploy
    made = factories.call(
        server, agent or world.agent, arguments=call.pop("arguments", {"env": "prod"}), **call
    )
    approver = world.alice if server == world.deploy else world.olga
    return grants.create_from_approval(
        approver=approver,
        call=made,
        tool_digest=TOOL_DIGEST,
        choice=choice or {"for": "8h", "arguments": "exact"},
    )


def api(token: str) -> ApiClient:
    return ApiClient(token)


def personal(user: Any) -> ApiClient:
    _, token = tokens.personal_token_create(user=user)
    return ApiClient(token)


def assert_error(response: Any, status: int, code: str) -> None:
    assert response.status_code == status, response.content
    assert response["content-type"].startswith("application/json")
    body = response.json()["error"]
    assert body["code"] == code and body["message"]


def signed_in(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


# --- the API ------------------------------------------------------------------------------------------------


def test_an_agent_lists_its_own_grants_only(world) -> None:
    mine = grant(world)
    grant(world, agent=world.other)
    response = api(world.agent_token).get("/grants")
    assert response.status_code == 200
    body = response.json()
    assert [item["id"] for item in body] == [str(mine.pk)]
    item = body[0]
    assert item["state"] == "active" and item["agent"] == "ci-bot" and item["server"] == "deploy"
    assert item["tool"] == "create_deployment" and item["arguments_mode"] == "exact"
    assert (
        item["arguments"] == {"env": "prod"} and item["granted_by"] == "alice" and item["team"] == "release"
    )
    assert item["uses"] == 0 and item["expires_at"] and item["revoked_at"] is None


def test_a_person_lists_the_grants_of_their_teams(world) -> None:
    release = grant(world)
    ops = grant(world, server=world.pager, tool="page")
    assert [item["id"] for item in personal(world.vera).get("/grants").json()] == [str(release.pk)]
    assert [item["id"] for item in personal(world.olga).get("/grants").json()] == [str(ops.pk)]


def test_the_list_filters_by_state_team_agent_and_tool(world) -> None:
    active = grant(world)
    revoked = grant(world, arguments={"env": "staging"})
    grants.revoke(grant=revoked, by=world.alice)
    client = personal(world.alice)
    assert [i["id"] for i in client.get("/grants", state="revoked").json()] == [str(revoked.pk)]
    assert [i["id"] for i in client.get("/grants", state="active").json()] == [str(active.pk)]
    assert client.get("/grants", team="ops").json() == []
    assert client.get("/grants", agent="other-bot").json() == []
    assert len(client.get("/grants", tool="create_deployment").json()) == 2


def test_the_list_is_limited_and_says_when_more_exist(world) -> None:
    for n in range(3):
        grant(world, arguments={"n": n})
    response = personal(world.alice).get("/grants", limit=2)
    assert len(response.json()) == 2 and response["Grants-More"] == "true"
    assert personal(world.alice).get("/grants", limit=3)["Grants-More"] == "false"
    assert_error(personal(world.alice).get("/grants", limit=501), 400, "invalid_body")


def test_bad_queries_are_json_errors(world) -> None:
    assert_error(personal(world.alice).get("/grants", state="forever"), 400, "invalid_query")
    assert_error(personal(world.alice).get("/grants", tool="a\x00b"), 400, "invalid_query")
    assert_error(Client().get("/api/v1/grants"), 401, "unauthorized")


def test_a_reviewer_revokes_over_the_api(world) -> None:
    made = grant(world)
    response = personal(world.alice).post(f"/grants/{made.pk}/revoke", {})
    assert response.status_code == 200, response.content
    assert response.json()["state"] == "revoked" and response.json()["revoked_by"] == "alice"
    assert AuditEvent.objects.filter(verb="grant.revoked", actor_label="alice").count() == 1
    assert_error(personal(world.alice).post(f"/grants/{made.pk}/revoke", {}), 409, "grant_inactive")


def test_who_may_not_revoke_gets_a_json_error_and_nothing_changes(world) -> None:
    made = grant(world)
    assert_error(personal(world.vera).post(f"/grants/{made.pk}/revoke", {}), 403, "forbidden")  # a viewer
    assert_error(personal(world.olga).post(f"/grants/{made.pk}/revoke", {}), 404, "not_found")  # another team
    assert_error(api(world.agent_token).post(f"/grants/{made.pk}/revoke", {}), 403, "forbidden")  # agents
    assert_error(personal(world.alice).post("/grants/not-a-uuid/revoke", {}), 400, "invalid_body")
    made.refresh_from_db()
    assert made.state() == "active"


# --- the pages ----------------------------------------------------------------------------------------------


def test_the_grants_page_lists_active_grants_with_who_and_uses(world) -> None:
    made = grant(world, on_behalf_of=world.vera)
    grants.use(made, factories.call(world.deploy, world.agent, arguments={"env": "prod"}))
    revoked = grant(world, arguments={"env": "staging"})
    grants.revoke(grant=revoked, by=world.alice)
    page = signed_in(world.alice).get("/grants/")
    assert page.status_code == 200
    html = page.content.decode()
    assert f'data-grant="{made.pk}"' in html and f'data-grant="{revoked.pk}"' not in html  # active by default
    assert "Exactly these arguments" in html and "&quot;env&quot;: &quot;prod&quot;" in html
    assert f"/grants/{made.pk}/revoke/" in html and "by <bdi>alice</bdi>" in html
    assert '<td>1<div class="muted">last' in html  # one use, and when
    everything = signed_in(world.alice).get("/grants/", {"state": ""}).content.decode()
    assert f'data-grant="{revoked.pk}"' in everything and "badge-grant-revoked" in everything


def test_the_page_shows_conditions_and_hides_revoke_from_viewers(world) -> None:
    made = grant(
        world,
        choice={
            "for": "1h",
            "arguments": "conditions",
            "conditions": [{"argument": "env", "op": "in", "value": ["prod"]}],
        },
    )
    html = signed_in(world.vera).get("/grants/").content.decode()
    assert f'data-grant="{made.pk}"' in html and "env in [&quot;prod&quot;]" in html
    assert f"/grants/{made.pk}/revoke/" not in html
    assert f'data-grant="{made.pk}"' not in signed_in(world.olga).get("/grants/").content.decode()


def test_revoking_in_the_browser_asks_first_then_revokes(world) -> None:
    made = grant(world)
    client = signed_in(world.alice)
    confirm = client.get(f"/grants/{made.pk}/revoke/")
    assert confirm.status_code == 200 and b"Revoke the grant for ci-bot" in confirm.content
    made.refresh_from_db()
    assert made.state() == "active"  # looking is not revoking
    done = client.post(f"/grants/{made.pk}/revoke/", follow=True)
    assert done.redirect_chain[-1][0] == "/grants/"
    assert b"its next call stops for a person" in done.content
    made.refresh_from_db()
    assert made.state() == "revoked" and made.revoked_by == world.alice


def test_a_second_revoke_in_the_browser_is_told_calmly(world) -> None:
    made = grant(world)
    grants.revoke(grant=made, by=world.alice)
    page = signed_in(world.alice).post(f"/grants/{made.pk}/revoke/")
    assert page.status_code == 409 and b"already revoked by alice" in page.content
    assert b'class="notice"' in page.content


def test_a_viewer_cannot_revoke_in_the_browser(world) -> None:
    made = grant(world)
    page = signed_in(world.vera).post(f"/grants/{made.pk}/revoke/")
    assert page.status_code == 403 and b"Only a reviewer" in page.content
    assert signed_in(world.olga).get(f"/grants/{made.pk}/revoke/").status_code == 404
    assert Client().get("/grants/").status_code == 302  # to sign-in
    made.refresh_from_db()
    assert made.state() == "active"


def test_the_approve_form_fields_post_a_choice_parse_choice_reads(world) -> None:
    call = factories.call(world.deploy, world.agent, arguments={"env": "prod", "version": "2.3"})
    html = render_to_string("approvals/_grant_fields.html", {"call": call})
    assert 'name="grant_for" id="grant-for-none" value="" checked' in html
    for value in ("1h", "8h", "until_revoked"):
        assert 'name="grant_for" id="grant-for-' in html and f'value="{value}"' in html
    assert 'name="grant_arguments" id="grant-args-exact" value="exact" checked' in html
    assert "env == &quot;prod&quot;" in html
    # What a browser posts when the reviewer ticks "env" and picks 8 hours:
    import html as htmllib
    import re

    values = [
        htmllib.unescape(v) for v in re.findall(r'name="grant_condition" id="[^"]+" value="([^"]+)"', html)
    ]
    from django.http import QueryDict

    form = QueryDict(mutable=True)
    form.update({"grant_for": "8h", "grant_arguments": "conditions"})
    form.setlist("grant_condition", values[:1])
    choice = grants.parse_choice(form)
    assert choice == {
        "for": "8h",
        "arguments": "conditions",
        "conditions": [{"argument": "env", "op": "==", "value": "prod"}],
    }
    made = grants.create_from_approval(
        approver=world.alice, call=call, tool_digest=TOOL_DIGEST, choice=choice
    )
    other_version = factories.call(world.deploy, world.agent, arguments={"env": "prod", "version": "9"})
    assert grants.find(call=other_version, tool_digest=TOOL_DIGEST) == made


def test_the_queue_suggests_a_grant_for_a_tool_approved_often(world, settings) -> None:
    settings.ELICIT_GRANT_SUGGEST_APPROVALS = 2
    rows = [
        {
            "at": timezone.now() - timedelta(hours=1),
            "actor_type": "user",
            "actor_label": "alice",
            "actor_id": str(world.alice.pk),
            "verb": "gate.approved",
            "server_slug": "deploy",
            "team_slug": "release",
            "tool": "create_deployment",
            "data": {},
        }
    ] * 2
    audit.append_many(rows)
    html = signed_in(world.alice).get("/").content.decode()
    assert "data-grant-suggestions" in html and 'data-suggestion="deploy/create_deployment"' in html
    assert "2 times in 14 days" in html
    assert "data-grant-suggestions" not in signed_in(world.olga).get("/").content.decode()


# --- approving a gate in the browser with "also allow the same again" ---------------------------------------


@pytest.fixture
def gated(world) -> Any:
    """The deploy server's stored destructive tool behind a gate rule of team release."""
    from approvals.models import RoutingRule

    world.deploy.tools = [
        {
            "name": "wipe",
            "description": "Delete a bucket.",
            "inputSchema": {
                "type": "object",
                "properties": {"bucket": {"type": "string"}},
                "required": ["bucket"],
            },
            "annotations": {"destructiveHint": True},
        }
    ]
    world.deploy.tools_fetched_at = timezone.now()
    world.deploy.save()
    RoutingRule.objects.create(
        name="wipes", server=world.deploy, tool_pattern="wipe", gate=True, team=world.release
    )
    return world


def submit_wipe(world: Any, bucket: str = "logs") -> Any:
    from approvals.services import calls

    call, _ = calls.call_submit(
        agent=world.agent, server_slug="deploy", tool="wipe", arguments={"bucket": bucket}
    )
    return call


def pending_gate(call: Any) -> Any:
    from approvals.models import InputRequest

    return InputRequest.objects.filter(round__call=call, key="gate", status="pending").first()


def test_approving_in_the_browser_with_a_grant_lets_the_same_call_through_next_time(gated) -> None:
    from approvals.models import ToolCall

    first = submit_wipe(gated)
    ir = pending_gate(first)
    client = signed_in(gated.alice)
    page = client.get(f"/requests/{ir.pk}/").content.decode()
    assert "Also allow the same again" in page and 'name="grant_for"' in page
    response = factories.through_second_look(
        client,
        f"/requests/{ir.pk}/decide/",
        {"decision": "approve", "grant_for": "1h", "grant_arguments": "exact"},
    )
    assert response.status_code == 302, response.content.decode()[:2000]
    made = Grant.objects.get()
    assert (
        made.granted_by == gated.alice and made.arguments == {"bucket": "logs"} and made.team == gated.release
    )
    assert timedelta(minutes=59) < made.expires_at - made.created_at <= timedelta(hours=1)

    again = submit_wipe(gated)
    assert pending_gate(again) is None and again.status == ToolCall.Status.QUEUED
    assert AuditEvent.objects.filter(call_id=again.pk, verb="gate.granted").count() == 1
    other = submit_wipe(gated, bucket="backups")
    assert pending_gate(other) is not None  # exactly these arguments: another bucket stops at the gate


def test_a_grant_choice_that_cannot_be_honoured_is_a_readable_page_and_approves_nothing(gated) -> None:
    call = submit_wipe(gated)
    ir = pending_gate(call)
    response = signed_in(gated.alice).post(
        f"/requests/{ir.pk}/decide/",
        {"decision": "approve", "grant_for": "8h", "grant_arguments": "conditions"},
    )
    assert response.status_code == 400
    assert "A grant on conditions needs at least one condition." in response.content.decode()
    ir.refresh_from_db()
    assert ir.status == "pending" and not Grant.objects.exists()


def test_real_gate_decisions_feed_the_suggestion(gated, settings) -> None:

    settings.ELICIT_GRANT_SUGGEST_APPROVALS = 2
    for bucket in ("logs", "tmp"):
        ir = pending_gate(submit_wipe(gated, bucket))
        gate_decisions.gate_decide(input_request_id=ir.pk, user=gated.alice, decision="approve")
    html = signed_in(gated.alice).get("/").content.decode()
    assert 'data-suggestion="deploy/wipe"' in html and "2 times in 14 days" in html
    ir = pending_gate(submit_wipe(gated, "backups"))
    gate_decisions.gate_decide(
        input_request_id=ir.pk, user=gated.alice, decision="decline", reason="not backups"
    )
    assert grants.suggestions(gated.alice) == []
    assert "data-grant-suggestions" not in signed_in(gated.alice).get("/").content.decode()


def test_conditions_that_miss_the_edited_arguments_make_no_grant_and_say_so(gated) -> None:
    from approvals.services.errors import Invalid

    ir = pending_gate(submit_wipe(gated, "logs"))
    logs_only = {
        "for": "1h",
        "arguments": "conditions",
        "conditions": [{"argument": "bucket", "value": "logs"}],
    }
    with pytest.raises(Invalid) as raised:
        gate_decisions.gate_decide(
            input_request_id=ir.pk,
            user=gated.alice,
            decision="edit",
            arguments={"bucket": "tmp"},
            grant=logs_only,
        )
    assert raised.value.message.startswith("No grant was made")
    assert not Grant.objects.exists()
    # Checked before deciding: nothing was approved, and the call keeps its arguments.
    ir.refresh_from_db()
    assert ir.status == "pending"
    assert ir.round.call.arguments == {"bucket": "logs"}


def test_editing_in_the_browser_with_a_grant_grants_the_edited_arguments(gated) -> None:
    from approvals.models import ToolCall

    call = submit_wipe(gated, "logs")
    ir = pending_gate(call)
    client = signed_in(gated.alice)
    page = client.get(f"/requests/{ir.pk}/").content.decode()
    edit_form = page[page.index('id="gate-edit-form"') :]
    edit_form = edit_form[: edit_form.index("</form>")]
    assert 'name="grant_for"' in edit_form and 'id="edit-grant-for-8h"' in edit_form
    assert page.count('id="grant-for-8h"') == 1  # the approve form's, apart from the edit form's
    response = factories.through_second_look(
        client,
        f"/requests/{ir.pk}/decide/",
        {
            "decision": "edit",
            "editor": "form",
            "f-bucket": "tmp",
            "grant_for": "8h",
            "grant_arguments": "exact",
        },
    )
    assert response.status_code == 302, response.content.decode()[:2000]
    call.refresh_from_db()
    assert call.arguments == {"bucket": "tmp"}
    made = Grant.objects.get()
    assert made.arguments == {"bucket": "tmp"} and made.granted_by == gated.alice

    again = submit_wipe(gated, "tmp")  # what was sent, edited, goes through next time
    assert pending_gate(again) is None and again.status == ToolCall.Status.QUEUED
    asked = submit_wipe(gated, "logs")  # what was asked, and not approved, still stops
    assert pending_gate(asked) is not None


def test_a_grant_that_misses_the_edit_is_a_readable_page_that_keeps_the_edit_and_decides_nothing(
    gated,
) -> None:
    call = submit_wipe(gated, "logs")
    ir = pending_gate(call)
    response = signed_in(gated.alice).post(
        f"/requests/{ir.pk}/decide/",
        {
            "decision": "edit",
            "editor": "form",
            "f-bucket": "tmp",
            "grant_for": "1h",
            "grant_arguments": "conditions",
            "grant_condition": '{"argument": "bucket", "op": "==", "value": "logs"}',
        },
    )
    assert response.status_code == 400
    html = response.content.decode()
    assert "its conditions do not hold for the approved arguments" in html
    assert 'value="tmp"' in html  # the reviewer's edit, kept
    ir.refresh_from_db()
    call.refresh_from_db()
    assert ir.status == "pending" and call.arguments == {"bucket": "logs"}
    assert not Grant.objects.exists()
