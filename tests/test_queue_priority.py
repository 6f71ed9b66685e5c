"""Work under way goes before new work: a retry a person answered is not queued behind every call submitted
since. The services give a call's first send a lower priority than a resume; the broker (Redis, kombu's
priority lists) hands the worker the resume first although it was queued last."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from celery import current_app
from kombu.simple import SimpleQueue

from approvals.queueing import NEW_WORK, RUN_CALL, UNDER_WAY
from approvals.services import answers, calls
from tests import factories

pytestmark = pytest.mark.django_db


def _queued(callbacks: list[Any]) -> list[tuple[str, int]]:
    """(task, priority) of each task the committed transactions queued."""
    return [
        (cb.args[0], cb.keywords["priority"])
        for cb in callbacks
        if getattr(cb, "func", None) == current_app.send_task
    ]


def test_a_first_send_is_new_work_and_an_answer_s_retry_is_work_under_way(
    django_capture_on_commit_callbacks: Any,
) -> None:
    alice = factories.user("alice")
    release = factories.team("release", (alice, "reviewer"))
    server = factories.server(default_team=release)
    agent, _ = factories.agent("ci-bot", servers=[server])

    with django_capture_on_commit_callbacks() as submitted:
        calls.call_submit(agent=agent, server_slug=server.slug, tool="create_deployment", arguments={})
    assert _queued(submitted) == [(RUN_CALL, NEW_WORK)]

    waiting = factories.call(server, agent)
    ir = factories.open_round(waiting, team_=release).input_requests.get()
    with django_capture_on_commit_callbacks() as answered:
        answers.input_respond(
            input_request_id=ir.pk, user=alice, action="accept", content={"environment": "staging"}
        )
    assert (RUN_CALL, UNDER_WAY) in _queued(answered)
    assert UNDER_WAY < NEW_WORK  # on Redis the lower number is served first


@pytest.fixture
def queue_name() -> Iterator[str]:
    name = f"test-priority-{uuid.uuid4().hex}"
    yield name
    with current_app.connection_for_write() as conn:
        channel = conn.default_channel
        channel.client.delete(*[channel._q_for_pri(name, step) for step in channel.priority_steps])


def test_the_broker_hands_out_work_under_way_before_new_work_queued_earlier(queue_name: str) -> None:
    for call_id, priority in (("first-send-1", NEW_WORK), ("first-send-2", NEW_WORK), ("resume", UNDER_WAY)):
        current_app.send_task(RUN_CALL, args=[call_id], queue=queue_name, priority=priority)

    received = []
    with current_app.connection_for_read() as conn, SimpleQueue(conn, queue_name) as queue:
        for _ in range(3):
            message = queue.get(block=True, timeout=5)  # a worker's BRPOP over the priority lists
            received.append(message.payload[0][0])
            message.ack()
    assert received == ["resume", "first-send-1", "first-send-2"]
