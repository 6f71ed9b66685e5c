"""The demo MCP server at its edges, over real HTTP: bodies and stored answers are bounded in size, and a form
answer is checked as strictly as the schema's formats say (and only what the form asked for is used)."""

from __future__ import annotations

import json
import socket
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
from mcp_types import CallToolResult, InputRequiredResult

from tests.demo_support import executions
from tests.test_demo_server import MEETING, accept, call, elicitation, post, raw_call

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def first_answer_line(url: str, head: bytes, body: bytes) -> bytes:
    """Send a request's head and the start of its body, and read the status line the server answers with
    while the rest of the body has not been sent."""
    parts = urlsplit(url)
    assert parts.port is not None
    with socket.create_connection((parts.hostname, parts.port), timeout=30) as sock:
        sock.sendall(head + body)
        return sock.recv(4096).split(b"\r\n", 1)[0]


def request_head(url: str, length: int, **headers: str) -> bytes:
    parts = urlsplit(url)
    lines = [f"POST {parts.path} HTTP/1.1", f"host: {parts.netloc}", f"content-length: {length}"]
    lines += [f"{name.replace('_', '-')}: {value}" for name, value in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


async def test_a_huge_body_with_an_idempotency_key_is_refused_before_it_is_read(url: str) -> None:
    head = request_head(
        url,
        2**40,
        content_type="application/json",
        accept="application/json, text/event-stream",
        mcp_protocol_version="2026-07-28",
        mcp_method="tools/call",
        idempotency_key="one-terabyte",
    )

    status = first_answer_line(url, head, b'{"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {')

    assert status == b"HTTP/1.1 413 Request Entity Too Large"


async def test_stored_idempotent_answers_are_bounded_in_bytes_oldest_first(url: str) -> None:
    text = "x" * 3_000_000  # each answer carries it twice (text and structured content): about 6 MB
    keys = [f"big-{n}" for n in range(13)]  # about 78 MB of answers: more than the server keeps (64 MiB)
    for n, key in enumerate(keys):
        headers, body = raw_call(n, "echo", {"text": text})
        assert post(url, body, headers, key=key).status_code == 200

    headers, body = raw_call(100, "echo", {"text": text})
    newest = post(url, body, headers, key=keys[-1])
    headers, body = raw_call(101, "echo", {"text": text})
    oldest = post(url, body, headers, key=keys[0])

    assert newest.headers.get("idempotent-replayed") == "true"
    assert "idempotent-replayed" not in oldest.headers  # forgotten, so it ran again
    assert oldest.json()["result"]["content"][0]["text"] == text
    assert executions(url) == {"echo": len(keys) + 1}


def meeting_post(url: str, raw_content: str) -> dict[str, Any]:
    """A schedule_meeting retry whose accepted content is `raw_content`, JSON as the client wrote it."""
    marker = "__CONTENT__"
    headers, body = raw_call(
        1, "schedule_meeting", {}, inputResponses={"meeting": {"action": "accept", "content": marker}}
    )
    raw = json.dumps(body).replace(json.dumps(marker), raw_content)
    answer = httpx.post(url, content=raw, headers=headers, timeout=30)
    assert answer.status_code == 200, answer.text
    return answer.json()["result"]


async def test_a_nan_number_is_asked_again_not_scheduled(url: str) -> None:
    raw = json.dumps({**MEETING, "duration_hours": "NAN"}).replace('"NAN"', "NaN")

    result = meeting_post(url, raw)

    assert result["resultType"] == "input_required"
    assert "duration_hours: expected a number" in result["inputRequests"]["meeting"]["params"]["message"]
    assert executions(url) == {}


async def test_an_integer_too_large_for_a_float_is_asked_again_not_a_tool_failure(url: str) -> None:
    raw = json.dumps({**MEETING, "attendees": "HUGE"}).replace('"HUGE"', "1" + "0" * 400)

    result = meeting_post(url, raw)

    assert result["resultType"] == "input_required"
    assert "attendees: must be at most 50" in result["inputRequests"]["meeting"]["params"]["message"]
    assert executions(url) == {}


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("date", "2026-W36-2"),  # an ISO week date, not an RFC 3339 full-date
        ("date", "2026-244"),  # an ordinal date
        ("starts_at", "2026-09-01T09:30+02:00"),  # no seconds
        ("starts_at", "2026-09-01T09:30:00"),  # no offset
        ("starts_at", "20260901T093000Z"),  # the basic format
        ("agenda_url", "https://docs.example.com/the agenda"),  # a space
    ],
)
async def test_a_value_outside_its_format_is_asked_again(url: str, field: str, value: str) -> None:
    again = await call(url, "schedule_meeting", {}, {"meeting": accept(**{**MEETING, field: value})})

    assert isinstance(again, InputRequiredResult)
    assert f"{field}: {value!r} is not a valid" in elicitation(again, "meeting").message
    assert executions(url) == {}


async def test_rfc_3339_values_are_accepted_with_lower_case_letters_fractions_and_offsets(url: str) -> None:
    meeting = {**MEETING, "starts_at": "2026-09-01t09:30:00.250+02:00"}

    done = await call(url, "schedule_meeting", {}, {"meeting": accept(**meeting)})

    assert isinstance(done, CallToolResult) and not done.is_error
    assert done.structured_content == meeting


async def test_keys_the_form_did_not_ask_for_are_left_out_of_the_meeting(url: str) -> None:
    answer = {**MEETING, "owner": "mallory", "budget_code": "x" * 5000}

    done = await call(url, "schedule_meeting", {}, {"meeting": accept(**answer)})

    assert isinstance(done, CallToolResult) and not done.is_error
    assert done.structured_content == MEETING
    assert json.loads(done.content[0].text) == MEETING  # type: ignore[union-attr]


async def test_a_long_wrong_value_is_quoted_shortened_when_asked_again(url: str) -> None:
    wrong = "not-an-email-" + "y" * 100_000

    again = await call(
        url, "schedule_meeting", {}, {"meeting": accept(**{**MEETING, "organizer_email": wrong})}
    )

    message = elicitation(again, "meeting").message
    assert "organizer_email: 'not-an-email-yyy" in message and "...' is not a valid email" in message
    assert len(message) < 500
