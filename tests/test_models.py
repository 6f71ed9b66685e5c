"""The database refuses impossible states, whatever the code above it does."""

from __future__ import annotations

import pytest
from django.db import IntegrityError, transaction
from django.utils import timezone

from approvals.models import Decision, InputRequest, Round, ToolCall
from tests import factories

pytestmark = pytest.mark.django_db


def refused(fn) -> bool:
    try:
        with transaction.atomic():
            fn()
    except IntegrityError:
        return True
    return False


@pytest.fixture
def call() -> ToolCall:
    srv = factories.server()
    ag, _ = factories.agent(servers=[srv])
    return factories.call(srv, ag)


def test_a_call_has_only_one_open_round(call: ToolCall) -> None:
    factories.open_round(call, 1)
    assert refused(lambda: factories.open_round(call, 2))


def test_a_closed_round_lets_the_next_one_open(call: ToolCall) -> None:
    first = factories.open_round(call, 1)
    Round.objects.filter(pk=first.pk).update(status=Round.Status.CLOSED, closed_at=timezone.now())
    second = factories.open_round(call, 2)
    assert second.number == 2


def test_round_numbers_are_unique_per_call(call: ToolCall) -> None:
    rnd = factories.open_round(call, 1)
    Round.objects.filter(pk=rnd.pk).update(status=Round.Status.CLOSED, closed_at=timezone.now())
    assert refused(lambda: factories.open_round(call, 1))


def test_a_closed_round_must_say_when(call: ToolCall) -> None:
    rnd = factories.open_round(call, 1)
    assert refused(lambda: Round.objects.filter(pk=rnd.pk).update(status=Round.Status.CLOSED))


def test_an_answer_needs_an_action_and_a_time(call: ToolCall) -> None:
    ir = factories.open_round(call).input_requests.get()
    assert refused(lambda: InputRequest.objects.filter(pk=ir.pk).update(status=InputRequest.Status.ANSWERED))
    assert refused(lambda: InputRequest.objects.filter(pk=ir.pk).update(action="accept"))


def test_only_accept_carries_content(call: ToolCall) -> None:
    ir = factories.open_round(call).input_requests.get()
    assert refused(
        lambda: InputRequest.objects.filter(pk=ir.pk).update(
            status="answered",
            action="decline",
            content={"environment": "staging"},
            answered_at=timezone.now(),
        )
    )


def test_keys_are_unique_within_a_round(call: ToolCall) -> None:
    rnd = factories.open_round(call)
    assert refused(lambda: InputRequest.objects.create(round=rnd, key="environment", requested_schema={}))


def test_one_final_decision_per_input_request(call: ToolCall) -> None:
    ir = factories.open_round(call).input_requests.get()
    Decision.objects.create(input_request=ir, action="accept", is_final=True)
    Decision.objects.create(input_request=ir, action="accept", is_final=False)
    assert refused(lambda: Decision.objects.create(input_request=ir, action="decline", is_final=True))


def test_idempotency_keys_are_unique_per_agent(call: ToolCall) -> None:
    ToolCall.objects.filter(pk=call.pk).update(idempotency_key="k1")
    assert refused(lambda: factories.call(call.server, call.agent, idempotency_key="k1"))
    other, _ = factories.agent("other-bot", servers=[call.server])
    assert factories.call(call.server, other, idempotency_key="k1").idempotency_key == "k1"


def test_completed_needs_a_result_and_failed_an_error(call: ToolCall) -> None:
    assert refused(
        lambda: ToolCall.objects.filter(pk=call.pk).update(status="completed", finished_at=timezone.now())
    )
    assert refused(
        lambda: ToolCall.objects.filter(pk=call.pk).update(status="failed", finished_at=timezone.now())
    )


def test_an_open_call_has_no_finish_time(call: ToolCall) -> None:
    assert refused(lambda: ToolCall.objects.filter(pk=call.pk).update(finished_at=timezone.now()))


def test_secrets_stay_out_of_repr_and_str(call: ToolCall) -> None:
    rnd = factories.open_round(call, request_state="SECRET-STATE-123")
    call.server.headers = {"Authorization": "Bearer SECRET-TOKEN"}
    call.server.save()
    texts = [
        repr(rnd),
        str(rnd),
        repr(call.server),
        str(call.server),
        repr(call.agent),
        str(call.agent),
        str(call),
    ]
    for text in texts:
        assert "SECRET" not in text
        assert call.agent.token_hash not in text


def test_final_and_open_statuses_split_every_status_once() -> None:
    finals, opens = ToolCall.Status.finals(), ToolCall.Status.opens()
    assert set(finals) | set(opens) == set(ToolCall.Status.values) and not set(finals) & set(opens)
    assert ToolCall.Status.ANSWERED in finals and ToolCall.Status.RESUMING in opens


def test_every_send_of_a_call_carries_one_idempotency_key_format(call: ToolCall) -> None:
    from approvals.services.sending import Send

    rnd = factories.open_round(call, number=2)
    assert Send(call, None).idempotency_key == f"elicit-{call.pk}-r0"
    assert Send(call, rnd).idempotency_key == rnd.idempotency_key == f"elicit-{call.pk}-r2"


def test_tool_annotations_are_read_from_the_cached_tool_list(call: ToolCall) -> None:
    from approvals.templatetags.approvals_ui import server_claims

    assert call.tool_annotations == {}
    call.server.tools = [
        {"name": "other", "annotations": {"readOnlyHint": True}},
        {"name": call.tool, "annotations": {"destructiveHint": True, "openWorldHint": True}},
    ]
    assert call.tool_annotations == {"destructiveHint": True, "openWorldHint": True}
    assert server_claims(call) == ["may make destructive changes", "reaches outside systems"]
