"""Request ids and `_meta` on the hub's MCP endpoint. A request whose id is that of one still being answered
on the same handshake-era session (7 and "7" are one id to the SDK; a tools/call whose client went away is
answered when its call is final) is refused with a JSON-RPC error and starts nothing, and the first request
still gets its own result: passed on, it took the first request's stream, and one call's result answered
the other request, or no one. A progress token or a `_meta` of the wrong type gets an error saying which.
Raw HTTP to the real gateway process (PostgreSQL, Redis, a Celery worker, the demo MCP server)."""

from __future__ import annotations

import json
import threading
from typing import Any

import httpx
import pytest

from approvals.models import ToolCall
from tests import test_gateway as gateway_tests
from tests.live import wait_until
from tests.test_gateway import GatewayHub
from tests.test_gwy_hostile import ENVELOPE, MODERN, SOUND, _event, _legacy_session, _send

gateway_process = gateway_tests.gateway_process
gateway = gateway_tests.gateway
ghub = gateway_tests.ghub

pytestmark = pytest.mark.timeout(180)


def _call(request_id: Any, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {
        "jsonrpc": "2.0",
        "id": request_id,
        "method": "tools/call",
        "params": {"name": name, "arguments": arguments},
    }


def test_a_request_reusing_the_id_of_one_in_flight_is_refused_and_the_first_gets_its_result(
    ghub: GatewayHub,
) -> None:
    session = _legacy_session(ghub)
    lines: list[str] = []

    def first() -> None:
        headers = {"Authorization": f"Bearer {ghub.token}", **SOUND, **session}
        body = json.dumps(_call(7, "demo__create_deployment", {"branch": "first"}))
        with httpx.stream("POST", ghub.url + "/mcp", content=body, headers=headers, timeout=60) as answer:
            for line in answer.iter_lines():
                lines.append(line)
                if line.startswith("data: ") and '"result"' in line:
                    return

    thread = threading.Thread(target=first, daemon=True)
    thread.start()
    call_id = gateway_tests._pending_call(ghub.hub)

    for same in (7, "7"):
        again = _send(ghub, _call(same, "demo__echo", {"text": "second"}), session)
        assert again.status_code == 400, again.text
        error = again.json()
        assert error["id"] is None and error["error"]["code"] == -32600, error
        assert "still being answered" in error["error"]["message"]
    assert list(ToolCall.objects.values_list("tool", flat=True)) == ["create_deployment"]

    # Another id on the same session is served meanwhile.
    other = _event(_send(ghub, _call(8, "demo__echo", {"text": "other"}), session))
    assert other["id"] == 8 and other["result"]["content"][0]["text"] == "other", other

    item = ghub.hub.reviewer.wait_for_request(call_id, "environment")
    ghub.hub.reviewer.respond(item["id"], "accept", {"environment": "staging"})
    thread.join(30)
    results = [json.loads(line[6:]) for line in lines if line.startswith("data: ") and '"result"' in line]
    assert len(results) == 1, lines
    assert results[0]["id"] == 7
    assert "Deployed first to staging" in results[0]["result"]["content"][0]["text"]

    # Once answered, the id no longer blocks anything.
    def reuse() -> httpx.Response | None:
        answer = _send(ghub, _call(7, "demo__echo", {"text": "later"}), session)
        return answer if answer.status_code == 200 else None

    reused = _event(wait_until(reuse, 10, 0.2, what="the id to be free again"))  # type: ignore[arg-type]
    assert reused["id"] == 7 and reused["result"]["content"][0]["text"] == "later", reused


def test_an_id_stays_taken_while_the_call_of_a_client_that_went_away_goes_on(ghub: GatewayHub) -> None:
    session = _legacy_session(ghub)
    headers = {"Authorization": f"Bearer {ghub.token}", **SOUND, **session}
    body = json.dumps(_call(9, "demo__create_deployment", {"branch": "first"}))
    with (
        pytest.raises(httpx.ReadTimeout),
        httpx.stream("POST", ghub.url + "/mcp", content=body, headers=headers, timeout=3) as answer,
    ):
        for _ in answer.iter_lines():  # the client gives up waiting and goes away; its call goes on
            pass
    call_id = gateway_tests._pending_call(ghub.hub)

    # The call's answer is still to be sent to id 9: another request with that id would take it.
    again = _send(ghub, _call(9, "demo__echo", {"text": "second"}), session)
    assert again.status_code == 400 and "still being answered" in again.json()["error"]["message"], again.text
    assert list(ToolCall.objects.values_list("arguments", flat=True)) == [{"branch": "first"}]

    item = ghub.hub.reviewer.wait_for_request(call_id, "environment")
    ghub.hub.reviewer.respond(item["id"], "accept", {"environment": "staging"})
    assert ghub.hub.agent.wait(call_id)["status"] == "completed"

    def reuse() -> httpx.Response | None:
        answer = _send(ghub, _call(9, "demo__echo", {"text": "later"}), session)
        return answer if answer.status_code == 200 else None

    reused = _event(wait_until(reuse, 10, 0.2, what="the id to be free again"))  # type: ignore[arg-type]
    assert reused["id"] == 9 and reused["result"]["content"][0]["text"] == "later", reused


@pytest.mark.parametrize("era", ["legacy", "modern"])
def test_a_progress_token_or_meta_of_the_wrong_type_says_which(ghub: GatewayHub, era: str) -> None:
    cases: list[tuple[Any, str]] = [
        ({"progressToken": {"a": 1}}, "params._meta.progressToken must be a string or an integer"),
        ({"progressToken": 1.5}, "params._meta.progressToken must be a string or an integer"),
        ({"progressToken": True}, "params._meta.progressToken must be a string or an integer"),
        ("x", "params._meta must be an object"),
    ]
    headers = _legacy_session(ghub) if era == "legacy" else {"MCP-Protocol-Version": MODERN}
    for at, (meta, said) in enumerate(cases):
        if era == "modern" and isinstance(meta, dict):
            meta = {**ENVELOPE, **meta}
        params = {"name": "demo__echo", "arguments": {"text": "x"}, "_meta": meta}
        extra = {"Mcp-Method": "tools/call", "Mcp-Name": "demo__echo"} if era == "modern" else {}
        body = {"jsonrpc": "2.0", "id": at, "method": "tools/call", "params": params}
        answer = _send(ghub, body, {**headers, **extra})
        assert answer.status_code == 400, answer.text
        found = answer.json()
        assert found["id"] == at and found["error"]["code"] == -32602, found
        assert said in found["error"]["message"], found
    assert not ToolCall.objects.exists()
    # A string or integer token is served, and so is a null _meta where it may be left out.
    meta = {**ENVELOPE, "progressToken": "p"} if era == "modern" else {"progressToken": 3}
    params = {"name": "demo__echo", "arguments": {"text": "fine"}, "_meta": meta}
    extra = {"Mcp-Method": "tools/call", "Mcp-Name": "demo__echo"} if era == "modern" else {}
    body = {"jsonrpc": "2.0", "id": 50, "method": "tools/call", "params": params}
    served = _send(ghub, body, {**headers, **extra})
    assert served.status_code == 200 and '"text":"fine"' in served.text, served.text
    if era == "legacy":
        listing = {"jsonrpc": "2.0", "id": 51, "method": "tools/list", "params": {"_meta": None}}
        assert "demo__echo" in _send(ghub, listing, headers).text
