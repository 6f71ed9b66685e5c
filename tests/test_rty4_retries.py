"""Retries of the hub's outbound work wait as long as the receiver asked, within a cap, and spread apart.

A receiver answering 429 or 503 with ``Retry-After`` (seconds or an HTTP date) is not tried again sooner than
it asked, nor later than the cap, whatever it wrote (huge, negative, unreadable); deliveries that failed
together do not come back together; one that keeps failing is given up after its attempts, each recorded.
The receivers are real loopback listeners; the MCP server is the scripted one of ``test_call_fate``.
"""

from __future__ import annotations

import email.utils
import json
import re
import secrets
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from approvals.models import Notification, Team, ToolCall, WebhookAttempt, WebhookDelivery
from approvals.services import notifications, sending, webhooks
from tests import factories
from tests.hub import WebhookReceiver, set_up_handshake_hub
from tests.live import HolderRunner, LoopbackMcpServer, child_env, wait_until
from tests.test_call_fate import TOOLS, Script, ScriptedServer
from tests.test_notifications import pending_request

pytestmark = pytest.mark.timeout(120)


def answering(*answers: tuple[int, dict[str, str]]) -> WebhookReceiver:
    """A loopback endpoint answering each POST with the next of `answers` (the last once they run out): a
    status, and its headers."""
    return WebhookReceiver(
        statuses=tuple(status for status, _headers in answers),
        headers=tuple(headers for _status, headers in answers),
    )


@pytest.fixture(autouse=True)
def attempts_made_here(monkeypatch: pytest.MonkeyPatch, settings: Any) -> None:
    """Each try is made by the test itself (no task queued for a worker another test left running), with
    the hub's default caps."""
    monkeypatch.setattr(webhooks, "enqueue_on_commit", lambda *args, **kwargs: None)
    monkeypatch.setattr(notifications, "enqueue_on_commit", lambda *args, **kwargs: None)
    settings.ELICIT_WEBHOOK_RETRY_MAX = 600
    settings.ELICIT_WEBHOOK_MAX_ATTEMPTS = 8
    settings.ELICIT_NOTIFY_MAX_ATTEMPTS = 5
    settings.ELICIT_MCP_RETRY_MAX = 60
    settings.ELICIT_MCP_RETRY_BASE = 2
    settings.ELICIT_MCP_MAX_RETRIES = 4


def delivery_to(url: str, slug: str = "deploy") -> WebhookDelivery:
    call = factories.call(
        factories.server(slug),
        callback_url=url,
        status=ToolCall.Status.COMPLETED,
        result={"content": [], "isError": False},
        finished_at=timezone.now(),
    )
    return WebhookDelivery.objects.create(
        call=call, event_type="call.completed", url=url, payload={"type": "call.completed", "data": {}}
    )


def http_date(seconds_from_now: float) -> str:
    return email.utils.formatdate(time.time() + seconds_from_now, usegmt=True)


# ---- agent webhooks -------------------------------------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("status", "retry_after", "low", "high"),
    [
        (429, "120", 120, 132),  # what it asked, and up to a tenth more
        (503, "30", 30, 33),
        (429, None, 329, 363),  # an HTTP date 330 s ahead (written below, to the second)
        (503, "99999999999999999999999999", 540, 600),  # longer than the cap: the cap's last tenth
        (429, "9" * 400, 540, 600),  # beyond any float: the same
        (429, "-5", 1, 2),  # unreadable: the first backoff (2 s, jittered down to half)
        (503, "soon", 1, 2),
        (429, "Wed, 21 Oct 2015 07:28:00 GMT", 1, 2),  # a date long past: no wait left, the backoff
    ],
)
def test_a_webhook_receiver_that_asks_to_wait_is_not_tried_sooner_nor_past_the_cap(
    status: int, retry_after: str | None, low: float, high: float
) -> None:
    asked = retry_after if retry_after is not None else http_date(330)
    with answering((status, {"retry-after": asked})) as agent:
        delivery = delivery_to(agent.url)
        countdown = webhooks.webhook_attempt(delivery_id=delivery.pk)
    assert len(agent.received) == 1
    assert countdown is not None and low <= countdown <= high, countdown
    (attempt,) = WebhookAttempt.objects.filter(delivery=delivery)
    assert attempt.status_code == status and attempt.error.startswith(f"HTTP {status}")
    if low > 2:  # the wait it asked for is on the record, which the next try honours
        assert "the receiver asked to wait" in attempt.error
    delivery.refresh_from_db()
    assert delivery.status == WebhookDelivery.Status.PENDING and delivery.attempts == 1


@pytest.mark.django_db
def test_webhooks_failing_together_do_not_retry_together() -> None:
    """Twelve deliveries refused at once, asking for the same wait or for none: their retries spread."""
    countdowns: dict[str, list[float]] = {"asked": [], "backoff": []}
    with answering((429, {"retry-after": "60"})) as limited, answering((500, {})) as broken:
        for number in range(12):
            for kind, receiver in (("asked", limited), ("backoff", broken)):
                delivery = delivery_to(receiver.url, slug=f"{kind}-{number}")
                countdown = webhooks.webhook_attempt(delivery_id=delivery.pk)
                assert countdown is not None
                countdowns[kind].append(countdown)
    assert all(60 <= c <= 66 for c in countdowns["asked"]), countdowns
    assert all(1 <= c <= 2 for c in countdowns["backoff"]), countdowns
    assert len(set(countdowns["asked"])) > 1 and len(set(countdowns["backoff"])) > 1, countdowns


@pytest.mark.django_db
def test_a_webhook_receiver_that_keeps_asking_to_wait_is_given_up_after_its_attempts(settings: Any) -> None:
    settings.ELICIT_WEBHOOK_MAX_ATTEMPTS = 3
    with answering((503, {"retry-after": "45"})) as agent:
        delivery = delivery_to(agent.url)
        countdowns = [webhooks.webhook_attempt(delivery_id=delivery.pk) for _ in range(4)]
    assert len(agent.received) == 3
    assert [c is not None and 45 <= c <= 50 for c in countdowns[:2]] == [True, True]
    assert countdowns[2:] == [None, None]
    delivery.refresh_from_db()
    assert delivery.status == WebhookDelivery.Status.FAILED and delivery.attempts == 3
    errors = list(WebhookAttempt.objects.filter(delivery=delivery).order_by("number").values_list("error"))
    assert errors == [("HTTP 503; the receiver asked to wait 45 s",)] * 3


@pytest.mark.django_db
def test_the_sweep_does_not_queue_again_a_delivery_waiting_out_the_receivers_retry_after() -> None:
    """Its retry waits up to the cap: queued again STALE_AFTER past its backoff (8 s), it would be posted
    before the receiver's time, beside the retry still waiting."""
    with answering((429, {"retry-after": "600"})) as agent:
        delivery = delivery_to(agent.url)
        assert webhooks.webhook_attempt(delivery_id=delivery.pk) is not None
    last = WebhookAttempt.objects.get(delivery=delivery).at
    ToolCall.objects.filter(pk=delivery.call_id).update(finished_at=last - timedelta(minutes=1))
    assert webhooks.webhooks_recover(now=last + webhooks.STALE_AFTER + timedelta(seconds=10)) == 0
    assert webhooks.webhooks_recover(now=last + webhooks.STALE_AFTER + timedelta(seconds=300)) == 0
    assert webhooks.webhooks_recover(now=last + webhooks.STALE_AFTER + timedelta(seconds=601)) == 1


# ---- team notices ---------------------------------------------------------------------------------------


def chat_notice(url: str) -> Notification:
    team = factories.team("release")
    Team.objects.filter(pk=team.pk).update(chat_webhook_url=url)
    team.refresh_from_db()
    notifications.notify(ir=pending_request(team), team=team, event="routed")
    return Notification.objects.get(team=team, kind=Notification.Kind.CHAT)


@pytest.mark.django_db
def test_a_chat_that_asks_to_wait_is_not_posted_again_sooner_nor_swept_early() -> None:
    with answering((429, {"retry-after": http_date(240)})) as chat:
        notice = chat_notice(chat.url)
        countdown = notifications.notification_send(notification_id=notice.pk)
    assert countdown is not None and 238 <= countdown <= 265, countdown
    notice.refresh_from_db()
    assert notice.status == Notification.Status.PENDING and notice.attempts == 1
    assert "HTTP 429" in notice.last_error and "the receiver asked to wait" in notice.last_error

    # Its retry may wait up to the cap (600 s) after its try: the sweep waits that and STALE_AFTER more.
    tried = notice.last_attempt_at
    assert tried is not None
    assert notifications.notifications_recover(now=tried + timedelta(seconds=400)) == 0
    assert notifications.notifications_recover(now=tried + timedelta(seconds=890)) == 0
    assert notifications.notifications_recover(now=tried + timedelta(seconds=910)) == 1


@pytest.mark.django_db
def test_chat_notices_failing_together_do_not_retry_together() -> None:
    countdowns = []
    with answering((503, {"retry-after": "20"})) as chat:
        ir = pending_request(factories.team("release"))
        for number in range(10):
            team = factories.team(f"team-{number}")
            Team.objects.filter(pk=team.pk).update(chat_webhook_url=chat.url)
            team.refresh_from_db()
            notifications.notify(ir=ir, team=team, event="escalated")
            notice = Notification.objects.get(team=team, kind=Notification.Kind.CHAT)
            countdowns.append(notifications.notification_send(notification_id=notice.pk))
    assert all(c is not None and 20 <= c <= 22 for c in countdowns), countdowns
    assert len(set(countdowns)) > 1, countdowns


# ---- sends to MCP servers -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def scripted() -> Iterator[ScriptedServer]:
    with ScriptedServer() as server:
        yield server


@pytest.mark.django_db(transaction=True)
def test_sends_refused_with_retry_after_come_back_no_sooner_and_apart(scripted: ScriptedServer) -> None:
    """A 429 proves the tool did not run: the call is sent again, no sooner than the server asked, and calls
    refused together spread over a little more, within ELICIT_MCP_RETRY_MAX."""
    server = factories.server(slug="scripted", url=scripted.url, tools=TOOLS)
    countdowns: dict[str, list[float]] = {}
    for asked in ("30", "86400", "-1"):
        scripted.script = Script(steps=[("status", 429, {"Retry-After": asked})])
        for _ in range(6):
            call = factories.call(server, tool="plain", arguments={})
            countdown = sending.call_send(call_id=call.pk)
            assert countdown is not None
            countdowns.setdefault(asked, []).append(countdown)
            call.refresh_from_db()
            assert call.status == ToolCall.Status.QUEUED
    assert all(30 <= c <= 33 for c in countdowns["30"]), countdowns
    assert all(54 <= c <= 60 for c in countdowns["86400"]), countdowns  # the cap, not a day
    assert all(1 <= c <= 2 for c in countdowns["-1"]), countdowns  # unreadable: the first backoff
    assert all(len(set(each)) > 1 for each in countdowns.values()), countdowns


# ---- through the Celery worker --------------------------------------------------------------------------


def test_the_worker_retries_a_webhook_after_the_wait_its_receiver_asked(worker: Any) -> None:
    """The worker's cap here is 2 s (tests.conftest.WORKER_ENV): a receiver asking for an hour is tried
    again within it, and the delivery is made on the third try, every wait asked for on the record."""
    from approvals import tasks

    with answering((503, {"retry-after": "3600"}), (429, {"retry-after": "1"}), (204, {})) as agent:
        delivery = delivery_to(agent.url)
        tasks.deliver_webhook.delay(str(delivery.pk))
        wait_until(
            lambda: WebhookDelivery.objects.get(pk=delivery.pk).status == WebhookDelivery.Status.DELIVERED,
            30,
            0.1,
            what="the delivery marked delivered",
        )
    assert len(agent.received) == 3
    errors = list(WebhookAttempt.objects.filter(delivery=delivery).order_by("number").values_list("error"))
    assert errors == [
        ("HTTP 503; the receiver asked to wait 3600 s",),
        ("HTTP 429; the receiver asked to wait 1 s",),
        ("",),
    ]


# ---- the holder's sessions ------------------------------------------------------------------------------


class BusyServer(LoopbackMcpServer):
    """A handshake-era MCP server (2025-11-25 over Streamable HTTP, in this process) whose ``tools/call``
    answers the next of `refusals` (a 429 with Retry-After) while they last, then the tool's result."""

    what = "the busy MCP server"

    def __init__(self, *refusals: str) -> None:
        self.refusals = list(refusals)
        self.calls = 0
        self.sessions: set[str] = set()
        super().__init__()

    async def endpoint(self, request: Request) -> Response:
        if request.method == "GET":
            return Response(status_code=405)
        if request.method == "DELETE":
            return Response(status_code=200)
        body = json.loads(await request.body())
        method, rid = body.get("method"), body.get("id")
        if method == "initialize":
            session = secrets.token_hex(8)
            self.sessions.add(session)
            result = {
                "protocolVersion": "2025-11-25",
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "busy", "version": "1.0"},
            }
            return JSONResponse(
                {"jsonrpc": "2.0", "id": rid, "result": result}, headers={"mcp-session-id": session}
            )
        if request.headers.get("mcp-session-id") not in self.sessions:
            return JSONResponse(
                {"jsonrpc": "2.0", "id": None, "error": {"code": -32001, "message": "no"}}, 404
            )
        if method is None or method.startswith("notifications/"):
            return Response(status_code=202)
        if method == "tools/list":
            tools = [{"name": "busy", "inputSchema": {"type": "object", "properties": {}}}]
            return JSONResponse({"jsonrpc": "2.0", "id": rid, "result": {"tools": tools}})
        self.calls += 1
        if self.calls <= len(self.refusals):
            return Response(
                "slow down", status_code=429, headers={"retry-after": self.refusals[self.calls - 1]}
            )
        result = {"content": [{"type": "text", "text": "ran"}], "isError": False}
        return JSONResponse({"jsonrpc": "2.0", "id": rid, "result": result})


def test_a_holder_refused_with_retry_after_sends_the_call_again_no_sooner(live_db: None) -> None:
    """A 429 to the held call's tools/call proves it did not run: the holder sends it on a new session, after
    the wait the server asked for (within ELICIT_MCP_RETRY_MAX), not its own one-second backoff."""
    with BusyServer("4", "86400") as busy:
        hub = set_up_handshake_hub(busy.url, slug="busy")
        holder = HolderRunner(
            child_env(
                ELICIT_HOLDER_POLL="1",
                ELICIT_HOLDER_HEARTBEAT="1",
                ELICIT_MCP_RETRY_BASE="1",
                ELICIT_MCP_RETRY_MAX="6",
                ELICIT_MCP_MAX_RETRIES="2",
            )
        ).start()
        try:
            call_id = hub.agent.call("busy", {}, server="busy")
            wait_until(
                lambda: ToolCall.objects.get(pk=call_id).status == ToolCall.Status.COMPLETED,
                60,
                0.2,
                what="the held call to complete",
            )
        finally:
            holder.stop()
    assert busy.calls == 3
    waits = [
        float(w) for w in re.findall(rf"call {call_id}: rate_limited; retrying in ([0-9.]+) s", holder.log())
    ]
    assert len(waits) == 2, holder.log()[-3000:]
    assert 4 <= waits[0] <= 5  # what it asked, and up to a tenth more (a second at least)
    assert 5 <= waits[1] <= 6  # a day asked: the cap's last tenth (a second at least)
