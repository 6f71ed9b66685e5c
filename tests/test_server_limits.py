"""What an MCP server may send: bounded rounds, messages, schemas and results, and only storable JSON.

A real MCP test server (tests/mcp_test_server.py, over HTTP) sends too much; the hub's send path
(`sending.call_send`) runs here against it. A round over a limit is declined to the server and shown as
unsupported, a result over the limit is stored truncated with its full size, a result the hub cannot store
(NUL, lone surrogates) or read (too large) fails the call, its outcome unknown (the tool ran). Then the
inbox: lists never load rounds' raw answers, and they come a page at a time.
"""

from __future__ import annotations

import base64
import json
import uuid
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from approvals.models import AuditEvent, InputRequest, McpServer, Round, ToolCall
from approvals.services import sending, tokens
from tests import factories
from tests.hub import Agent, Reviewer
from tests.test_mcp_client import LiveServer

pytestmark = pytest.mark.django_db


@pytest.fixture
def hub(mcp_test_server: LiveServer) -> dict[str, Any]:
    alice = factories.user("alice")
    release = factories.team("release", (alice, "reviewer"))
    agent_row, agent_token = factories.agent("ci-bot")
    _, reviewer_token = tokens.personal_token_create(user=alice)

    def call(mode: str, n: int) -> ToolCall:
        server = McpServer.objects.create(
            slug=mode.replace("_", "-"),
            name=mode,
            url=f"{mcp_test_server.base}/scripted/{mode}?n={n}",
            default_team=release,
        )
        agent_row.servers.add(server)
        row = factories.call(server, agent_row, tool="scripted", arguments={})
        sending.call_send(call_id=row.pk)
        row.refresh_from_db()
        return row

    return {
        "call": call,
        "agent": Agent(agent_token),
        "reviewer": Reviewer(reviewer_token),
        "alice": alice,
        "team": release,
    }


def test_a_round_of_2000_input_requests_is_declined_to_the_server_and_shown(hub: dict[str, Any]) -> None:
    call = hub["call"]("many_inputs", 2000)
    assert call.status == ToolCall.Status.COMPLETED
    assert call.result["content"][0]["text"] == "answered 2000: decline"  # every key declined, in one resume
    requests = InputRequest.objects.filter(round__call=call)
    assert requests.count() == 1  # one row says why the round was refused, not one per request
    assert set(requests.values_list("status", flat=True)) == {InputRequest.Status.UNSUPPORTED}
    problem = requests.first().problem  # type: ignore[union-attr]
    assert "2000 inputs in one round" in problem and "at most 50" in problem
    assert requests.filter(params={"mode": "form"}).count() == 1  # nothing of the oversized round kept
    # One audit event for the refused round, not one per request.
    verbs = list(AuditEvent.objects.filter(call_id=call.pk).values_list("verb", flat=True))
    assert verbs.count("round.opened") == 1 and "input.unsupported" not in verbs
    opened = AuditEvent.objects.get(call_id=call.pk, verb="round.opened").data
    assert opened["key_count"] == 2000 and len(opened["keys"]) == 50
    assert hub["reviewer"].inbox() == []
    detail = hub["agent"].get(f"/calls/{call.pk}").json()
    assert "2000 inputs in one round" in detail["rounds"][0]["input_requests"][0]["problem"]


def test_a_message_over_the_limit_is_unsupported_and_kept_short(hub: dict[str, Any]) -> None:
    call = hub["call"]("long_message", 50_000)
    assert call.status == ToolCall.Status.AWAITING_INPUT
    fine = InputRequest.objects.get(round__call=call, key="fine")
    long = InputRequest.objects.get(round__call=call, key="long")
    assert fine.status == InputRequest.Status.PENDING
    assert long.status == InputRequest.Status.UNSUPPORTED
    assert long.action == InputRequest.Action.DECLINE
    assert "message is 50000 characters" in long.problem
    assert len(long.message) == 10_000 and long.params == {"mode": "form"}
    assert [item["key"] for item in hub["reviewer"].inbox()] == ["fine"]


def test_a_schema_over_the_limit_is_unsupported_and_not_stored(hub: dict[str, Any]) -> None:
    call = hub["call"]("big_schema", 100_000)
    big = InputRequest.objects.get(round__call=call, key="big")
    assert big.status == InputRequest.Status.UNSUPPORTED
    assert "requestedSchema is" in big.problem and "at most 65536" in big.problem
    assert big.requested_schema == {} and big.params == {"mode": "form"}
    assert InputRequest.objects.get(round__call=call, key="fine").status == InputRequest.Status.PENDING


def test_a_result_over_the_limit_is_stored_truncated_with_its_size(hub: dict[str, Any], client: Any) -> None:
    call = hub["call"]("big_result", 3_000_000)
    assert call.status == ToolCall.Status.COMPLETED
    assert call.result_truncated is True
    assert call.result_size > 3_000_000
    text = call.result["content"][0]["text"]
    assert 512 * 1024 < len(text) <= 1024 * 1024 and set(text) == {"x"}
    assert call.result["isError"] is True
    with connection.cursor() as cursor:
        cursor.execute("SELECT octet_length(result::text) FROM approvals_toolcall WHERE id = %s", [call.pk])
        assert cursor.fetchone()[0] <= 1024 * 1024
    detail = hub["agent"].get(f"/calls/{call.pk}").json()
    assert detail["result_truncated"] is True and detail["result_size"] == call.result_size
    finished = AuditEvent.objects.get(call_id=call.pk, verb="call.completed").data
    assert finished["result_truncated"] is True and finished["result_size"] == call.result_size
    client.force_login(factories.user("root", is_superuser=True, is_staff=True))
    page = client.get(f"/calls/{call.pk}/")
    assert page.status_code == 200
    assert "Truncated: the server sent" in page.content.decode()


def test_an_answer_over_the_read_limit_is_not_read_and_fails_the_call_clearly(
    hub: dict[str, Any], settings: Any
) -> None:
    settings.ELICIT_MAX_MCP_RESPONSE = 256 * 1024
    call = hub["call"]("big_result", 2_000_000)
    assert call.status == ToolCall.Status.FAILED
    # The server ran the tool and its answer was not read: its outcome is unknown.
    assert call.error["code"] == "outcome_unknown" and call.error["tool_may_have_run"] is True
    assert "larger than 262144 bytes" in call.error["message"]
    assert "ELICIT_MAX_MCP_RESPONSE" in call.error["message"]
    assert call.result is None
    assert (
        AuditEvent.objects.get(call_id=call.pk, verb="call.failed").data["error"]["code"] == "outcome_unknown"
    )


def test_a_small_result_is_stored_whole(hub: dict[str, Any]) -> None:
    call = hub["call"]("big_result", 1000)
    assert call.result_truncated is False and call.result["content"][0]["text"] == "x" * 1000


@pytest.mark.parametrize(
    ("mode", "what"),
    [
        ("nul_result", "a NUL character at $.content[0].text"),
        ("surrogate_result", "is not valid JSON-RPC"),  # the SDK's own parse refuses lone surrogates
    ],
)
def test_a_result_that_cannot_be_stored_fails_the_call_as_malformed(
    hub: dict[str, Any], mode: str, what: str
) -> None:
    call = hub["call"](mode, 1)
    assert call.status == ToolCall.Status.FAILED
    assert call.error["code"] == "outcome_unknown" and call.error["tool_may_have_run"] is True
    assert "malformed" in call.error["message"] or "not valid JSON-RPC" in call.error["message"]
    assert what in call.error["message"]
    assert call.result is None


# --- the inbox ------------------------------------------------------------------------------------------


@pytest.fixture
def pending(hub: dict[str, Any]) -> list[InputRequest]:
    server = factories.server("deploy")
    call = factories.call(server)
    rnd = factories.open_round(call, keys=("a", "b", "c", "d", "e"), team_=hub["team"])
    Round.objects.filter(pk=rnd.pk).update(raw={"huge": "r" * 100_000})
    return list(InputRequest.objects.filter(round=rnd).order_by("created_at", "key", "id"))


def test_the_inbox_never_loads_raw_answers(hub: dict[str, Any], pending: list[InputRequest]) -> None:
    with CaptureQueriesContext(connection) as queries:
        items = hub["reviewer"].inbox()
    assert len(items) == 5
    sql = " ".join(q["sql"] for q in queries.captured_queries)
    assert '"approvals_round"."raw"' not in sql
    assert '"approvals_round"."request_state"' not in sql
    assert '"approvals_toolcall"."result"' not in sql


def test_the_inbox_pages_with_a_limit_and_a_cursor(hub: dict[str, Any], pending: list[InputRequest]) -> None:
    reviewer = hub["reviewer"]
    seen: list[str] = []
    response = reviewer.get("/inbox", limit=2)
    pages = 0
    while True:
        pages += 1
        assert response.status_code == 200, response.content
        seen += [item["id"] for item in response.json()]
        if response["Inbox-More"] == "false":
            assert "Next-Cursor" not in response
            break
        assert response["Link"].endswith('rel="next"')
        response = reviewer.get("/inbox", limit=2, cursor=response["Next-Cursor"])
    assert pages == 3
    assert seen == [str(ir.pk) for ir in pending]


def test_the_inbox_without_a_limit_is_capped_and_says_more_exist(
    hub: dict[str, Any], pending: list[InputRequest], settings: Any
) -> None:
    settings.ELICIT_INBOX_MAX = 3
    response = hub["reviewer"].get("/inbox")
    assert [item["id"] for item in response.json()] == [str(ir.pk) for ir in pending[:3]]
    assert response["Inbox-More"] == "true"
    assert len(hub["reviewer"].get("/inbox", limit=100).json()) == 3  # a limit never lifts the cap


def _b64(value: Any) -> str:
    return base64.urlsafe_b64encode(json.dumps(value).encode()).decode()


@pytest.mark.parametrize(
    "cursor",
    [
        "nonsense!",
        _b64(["not a date", "k", str(uuid.uuid4())]),
        _b64(["2026-01-01T00:00:00+00:00", "k\u0000", str(uuid.uuid4())]),  # NUL would reach PostgreSQL
        _b64(["2026-01-01T00:00:00+00:00", "k", "not a uuid"]),
        _b64({"not": "a list"}),
    ],
)
def test_a_bad_cursor_is_a_json_error(hub: dict[str, Any], cursor: str) -> None:
    response = hub["reviewer"].get("/inbox", cursor=cursor)
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "invalid_cursor"


def test_a_long_poll_with_a_bad_cursor_is_refused_before_it_waits(
    hub: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cursor is checked before the wait, not after up to a minute of it."""
    from approvals import broadcast

    async def waited(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("the long-poll waited on a cursor the inbox never gave")

    monkeypatch.setattr(broadcast, "wait_until", waited)
    version = hub["reviewer"].get("/inbox")["Inbox-Version"]
    response = hub["reviewer"].get("/inbox", cursor="nonsense!", version=version, wait=60)
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "invalid_cursor"
