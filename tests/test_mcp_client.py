"""Tests of `approvals.mcp_client`: pure helpers, then real HTTP against an SDK-built MCP server.

The server (tests/mcp_test_server.py) runs in a subprocess under uvicorn on a free loopback port,
once answering in JSON and once in SSE.
"""

from __future__ import annotations

import base64
import json
import logging
import pickle
import socket
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from jsonschema.validators import Draft202012Validator

from approvals.mcp_client import (
    PROTOCOL_VERSION,
    Completed,
    InputRequired,
    PermanentError,
    ServerConfig,
    ToolError,
    TransientError,
    call_tool,
    classify_rpc_error,
    discover,
    invalid_header_reason,
    list_tools,
    param_headers,
    parse_retry_after,
    read_call_result,
    run,
)
from approvals.mcp_client.wire import HttpFacts
from tests.live import start_script

SERVER_SCRIPT = Path(__file__).with_name("mcp_test_server.py")
TOKEN = "Bearer s3cret-token-value"
FORM = {
    "method": "elicitation/create",
    "params": {
        "mode": "form",
        "message": "Your name?",
        "requestedSchema": {"type": "object", "properties": {"name": {"type": "string"}}},
    },
}


def b64(text: str) -> str:
    return f"=?base64?{base64.b64encode(text.encode()).decode()}?="


# ---- pure helpers: x-mcp-header ----------------------------------------------------------------

HEADER_SCHEMA = {
    "type": "object",
    "properties": {
        "region": {"type": "string", "x-mcp-header": "Region"},
        "priority": {"type": "integer", "x-mcp-header": "Priority"},
        "verbose": {"type": "boolean", "x-mcp-header": "Verbose"},
        "debug": {"type": "boolean", "x-mcp-header": "Debug"},
        "empty": {"type": "string", "x-mcp-header": "Empty"},
        "query": {"type": "string"},
        "float_val": {"type": "number"},
    },
}


def test_param_headers_plain_values_and_types() -> None:
    headers = param_headers(
        HEADER_SCHEMA,
        {
            "region": "us-west1",
            "priority": 42,
            "verbose": False,
            "debug": True,
            "empty": "",
            "query": "unannotated",
            "float_val": 3.14,
        },
    )
    assert headers == {
        "Mcp-Param-Region": "us-west1",
        "Mcp-Param-Priority": "42",
        "Mcp-Param-Verbose": "false",
        "Mcp-Param-Debug": "true",
        "Mcp-Param-Empty": "",
    }


@pytest.mark.parametrize(
    "value",
    [
        "Hello, 世界",
        " padded ",
        " leading",
        "trailing ",
        "line1\nline2",
        "a\r\nb",
        "tab\there",
        "=?base64?eA==?=",
    ],
)
def test_param_headers_base64_for_unsafe_values(value: str) -> None:
    assert param_headers(HEADER_SCHEMA, {"region": value}) == {"Mcp-Param-Region": b64(value)}


def test_param_headers_internal_space_is_plain() -> None:
    assert param_headers(HEADER_SCHEMA, {"region": "us west 1"}) == {"Mcp-Param-Region": "us west 1"}


def test_param_headers_null_or_absent_sends_nothing() -> None:
    assert param_headers(HEADER_SCHEMA, {"region": None}) == {}
    assert param_headers(HEADER_SCHEMA, {}) == {}
    assert param_headers(HEADER_SCHEMA, None) == {}


@pytest.mark.parametrize(
    "prop",
    [
        {"type": "string", "x-mcp-header": ""},
        {"type": "object", "x-mcp-header": "Data"},
        {"type": "array", "items": {"type": "string"}, "x-mcp-header": "Items"},
        {"type": "null", "x-mcp-header": "Nil"},
        {"type": "number", "x-mcp-header": "Score"},
        {"type": "string", "x-mcp-header": "My Region"},
        {"type": "string", "x-mcp-header": "Region:Primary"},
        {"type": "string", "x-mcp-header": "Région"},
        {"type": "string", "x-mcp-header": "Region\t1"},
    ],
)
def test_invalid_header_annotations_are_detected(prop: dict[str, Any]) -> None:
    schema = {"type": "object", "properties": {"value": prop}}
    assert invalid_header_reason(schema) is not None
    assert param_headers(schema, {"value": "x"}) == {}


def test_duplicate_header_names_are_invalid_case_insensitively() -> None:
    for a, b in (("Region", "Region"), ("MyField", "myfield")):
        schema = {
            "type": "object",
            "properties": {
                "f1": {"type": "string", "x-mcp-header": a},
                "f2": {"type": "string", "x-mcp-header": b},
            },
        }
        assert invalid_header_reason(schema) is not None


def test_valid_header_annotations_pass() -> None:
    assert invalid_header_reason(HEADER_SCHEMA) is None
    assert invalid_header_reason({"type": "object", "properties": {}}) is None


# ---- pure helpers: results ---------------------------------------------------------------------


def test_result_without_result_type_is_complete() -> None:
    outcome = read_call_result({"content": [{"type": "text", "text": "hi"}]})
    assert isinstance(outcome, Completed)
    assert outcome.result["content"] == [{"type": "text", "text": "hi"}]
    assert outcome.result["isError"] is False


def test_is_error_result_is_a_tool_error() -> None:
    outcome = read_call_result({"resultType": "complete", "content": [], "isError": True})
    assert isinstance(outcome, ToolError)
    assert outcome.result["isError"] is True


def test_unknown_result_type_is_malformed() -> None:
    with pytest.raises(PermanentError) as info:
        read_call_result({"resultType": "task", "content": []})
    assert info.value.code == "malformed_response"
    assert "task" in info.value.message


def test_wrong_shape_is_malformed_without_echoing_values() -> None:
    with pytest.raises(PermanentError) as info:
        read_call_result({"resultType": "complete", "content": "sekrit-value"})
    assert info.value.code == "malformed_response"
    assert "sekrit-value" not in str(info.value)


def test_input_required_keeps_raw_without_state_and_hides_state_from_repr() -> None:
    raw = {
        "resultType": "input_required",
        "inputRequests": {"pkg.mod:Resolver": FORM},
        "requestState": '{"nonce":"abc","x":1}',
        "_meta": {"vendor/x": True},
    }
    outcome = read_call_result(raw)
    assert isinstance(outcome, InputRequired)
    assert outcome.request_state == '{"nonce":"abc","x":1}'
    assert "requestState" not in outcome.raw
    assert outcome.raw["_meta"] == {"vendor/x": True}
    assert outcome.input_requests == {"pkg.mod:Resolver": FORM}
    assert "nonce" not in repr(outcome)


def test_state_only_round_has_no_input_requests() -> None:
    outcome = read_call_result({"resultType": "input_required", "requestState": "later"})
    assert isinstance(outcome, InputRequired)
    assert outcome.input_requests == {}
    assert outcome.request_state == "later"


def test_input_required_with_nothing_is_malformed() -> None:
    with pytest.raises(PermanentError) as info:
        read_call_result({"resultType": "input_required"})
    assert info.value.code == "malformed_response"


def test_mode_defaults_to_form_and_url_mode_is_accepted() -> None:
    no_mode = {
        "method": "elicitation/create",
        "params": {"message": "m", "requestedSchema": {"type": "object"}},
    }
    url = {
        "method": "elicitation/create",
        "params": {"mode": "url", "message": "m", "url": "https://x.test/a"},
    }
    outcome = read_call_result({"resultType": "input_required", "inputRequests": {"a": no_mode, "b": url}})
    assert isinstance(outcome, InputRequired)
    assert set(outcome.input_requests) == {"a", "b"}
    assert outcome.request_state is None


@pytest.mark.parametrize(
    ("request_", "key", "method"),
    [
        (
            {"method": "sampling/createMessage", "params": {"messages": [], "maxTokens": 5}},
            "capital_question",
            "sampling/createMessage",
        ),
        ({"method": "roots/list"}, "client_roots", "roots/list"),
    ],
)
def test_sampling_and_roots_are_unsupported(request_: dict[str, Any], key: str, method: str) -> None:
    with pytest.raises(PermanentError) as info:
        read_call_result({"resultType": "input_required", "inputRequests": {"ok": FORM, key: request_}})
    assert info.value.code == "unsupported_input_request"
    assert key in info.value.message
    assert method in info.value.message


@pytest.mark.parametrize(
    "params",
    [
        {"mode": "popup", "message": "m"},
        {"mode": "form", "requestedSchema": {"type": "object"}},
        {"mode": "form", "message": "m"},
        {"mode": "form", "message": "m", "requestedSchema": "not an object"},
        {"mode": "url", "message": "m"},
        {"mode": "url", "message": "m", "url": 5},
        {"mode": "url", "message": "m", "url": "not a url"},
    ],
)
def test_badly_shaped_elicitations_are_malformed(params: dict[str, Any]) -> None:
    request_ = {"method": "elicitation/create", "params": params}
    with pytest.raises(PermanentError) as info:
        read_call_result({"resultType": "input_required", "inputRequests": {"k": request_}})
    assert info.value.code == "malformed_response"


# ---- pure helpers: errors ----------------------------------------------------------------------


def test_http_5xx_and_429_are_transient_with_retry_after() -> None:
    err = classify_rpc_error(
        -32603, "Server returned an error response", None, HttpFacts(503, "text/plain", 12.0)
    )
    assert isinstance(err, TransientError) and err.code == "http_5xx" and err.retry_after == 12.0
    err = classify_rpc_error(-32603, "x", None, HttpFacts(429, "text/plain", 7.0))
    assert isinstance(err, TransientError) and err.code == "rate_limited" and err.retry_after == 7.0


def test_json_rpc_errors_are_permanent() -> None:
    err = classify_rpc_error(-32602, "Invalid arguments", None, HttpFacts(400, "application/json"))
    assert isinstance(err, PermanentError) and err.code == "rpc_error" and err.rpc_code == -32602
    err = classify_rpc_error(-32603, "boom", None, HttpFacts(200, "application/json"))
    assert isinstance(err, PermanentError) and err.code == "rpc_error" and err.rpc_code == -32603


def test_rejected_request_state_is_its_own_error() -> None:
    err = classify_rpc_error(
        -32602,
        "Invalid or expired requestState",
        {"reason": "invalid_request_state"},
        HttpFacts(400, "application/json"),
    )
    assert isinstance(err, PermanentError)
    assert err.code == "request_state_rejected" and err.rpc_code == -32602


def test_unsupported_version_names_the_revision() -> None:
    err = classify_rpc_error(
        -32022, "Unsupported", {"supported": ["2025-11-25"]}, HttpFacts(400, "application/json")
    )
    assert isinstance(err, PermanentError) and err.code == "protocol_unsupported"
    assert "this server does not speak MCP 2026-07-28" in err.message
    assert "2025-11-25" in err.message


def test_sdk_synthesized_errors_are_classified() -> None:
    assert classify_rpc_error(-32001, "Request timed out", None).code == "timeout"
    assert isinstance(classify_rpc_error(-32001, "Request timed out", None), TransientError)
    assert classify_rpc_error(-32000, "Connection closed", None).code == "network_error"
    parse = classify_rpc_error(
        -32700, "Failed to parse JSON response: ...", None, HttpFacts(200, "application/json")
    )
    assert parse.code == "malformed_response"
    ctype = classify_rpc_error(
        -32600, "Unexpected content type: text/html", None, HttpFacts(200, "text/html")
    )
    assert ctype.code == "malformed_response"
    assert classify_rpc_error(-32601, "Not Found", None, HttpFacts(404, "text/plain")).code == "http_4xx"
    assert classify_rpc_error(-32603, "x", None, HttpFacts(401, "text/plain")).code == "auth_failed"


def test_error_messages_scrub_secrets() -> None:
    err = classify_rpc_error(-32603, f"bad token {TOKEN} here", None, HttpFacts(200), secrets=[TOKEN])
    assert TOKEN not in err.message and "[redacted]" in err.message


def test_retry_after_parsing() -> None:
    assert parse_retry_after("7") == 7.0
    assert parse_retry_after(None) is None
    assert parse_retry_after("soon") is None
    when = parse_retry_after("Wed, 21 Oct 2015 07:28:30 GMT", now=1445412480.0)  # 30 s before that date
    assert when == pytest.approx(30.0)


# ---- plain data ---------------------------------------------------------------------------------


def test_server_config_repr_redacts_header_values() -> None:
    config = ServerConfig(url="https://mcp.test/mcp", headers={"Authorization": TOKEN})
    assert "s3cret" not in repr(config)
    assert "Authorization" in repr(config)


def test_errors_pickle_for_celery() -> None:
    err = TransientError("rate_limited", "slow down", rpc_code=None, retry_after=3.0)
    copy = pickle.loads(pickle.dumps(err))  # noqa: S301 - our own bytes, as Celery's result backend does
    assert isinstance(copy, TransientError)
    assert (copy.code, copy.message, copy.retry_after) == ("rate_limited", "slow down", 3.0)
    assert copy.transient and not PermanentError("x", "y").transient


def test_module_does_not_import_django() -> None:
    code = "import sys, approvals.mcp_client; print('django' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        cwd=Path(__file__).parents[1],
    )
    assert out.stdout.strip() == "False"


# ---- real HTTP ----------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class LiveServer:
    def __init__(self, base: str) -> None:
        self.base = base

    def config(self, path: str = "/mcp", **kwargs: Any) -> ServerConfig:
        kwargs.setdefault("headers", {"Authorization": TOKEN})
        kwargs.setdefault("timeout", 10.0)
        return ServerConfig(url=self.base + path, **kwargs)

    def reset(self) -> None:
        urllib.request.urlopen(urllib.request.Request(self.base + "/_reset", method="POST"), timeout=5).read()

    def seen(self, path: str | None = None) -> list[dict[str, Any]]:
        with urllib.request.urlopen(self.base + "/_seen", timeout=5) as response:
            records = json.load(response)
        for record in records:
            record["headers"] = {k: v for k, v in record["headers"]}
        return [r for r in records if path is None or r["path"] == path]

    def calls(self) -> list[dict[str, Any]]:
        return [r for r in self.seen() if (r.get("body") or {}).get("method") == "tools/call"]


def _start(args: list[str]) -> tuple[subprocess.Popen[bytes], LiveServer]:
    port = _free_port()
    server = LiveServer(f"http://127.0.0.1:{port}")
    return start_script(SERVER_SCRIPT, [str(port), *args], server.seen, "the MCP test server"), server


@pytest.fixture(scope="module", params=["json", "sse"])
def live(request: pytest.FixtureRequest) -> Iterator[LiveServer]:
    proc, server = _start(["--sse"] if request.param == "sse" else [])
    try:
        yield server
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.fixture
def srv(live: LiveServer) -> LiveServer:
    live.reset()
    return live


def test_complete_result(srv: LiveServer) -> None:
    outcome = run(call_tool(srv.config(), "echo", {"text": "hi"}))
    assert isinstance(outcome, Completed)
    assert outcome.result["content"] == [{"type": "text", "text": "echo: hi"}]
    assert outcome.result["isError"] is False
    assert outcome.output_schema_error is None


def test_every_request_carries_meta_and_standard_headers(srv: LiveServer) -> None:
    run(call_tool(srv.config(), "echo", {"text": "hi"}))
    records = srv.seen("/mcp")
    assert [r["body"]["method"] for r in records] == ["tools/list", "tools/call"]
    for record in records:
        meta = record["body"]["params"]["_meta"]
        assert meta["io.modelcontextprotocol/protocolVersion"] == PROTOCOL_VERSION
        assert meta["io.modelcontextprotocol/clientInfo"]["name"] == "elicit-hub"
        assert meta["io.modelcontextprotocol/clientCapabilities"] == {"elicitation": {"form": {}, "url": {}}}
        headers = record["headers"]
        assert headers["mcp-protocol-version"] == PROTOCOL_VERSION
        assert headers["mcp-method"] == record["body"]["method"]
        assert headers["authorization"] == TOKEN
        assert "application/json" in headers["accept"] and "text/event-stream" in headers["accept"]
    assert records[1]["headers"]["mcp-name"] == "echo"


def test_input_required_round_then_retry_echoes_state(srv: LiveServer) -> None:
    config = srv.config()
    first = run(call_tool(config, "ask_name", {"greeting": "Hello"}))
    assert isinstance(first, InputRequired)
    assert set(first.input_requests) == {"user_name"}
    request_ = first.input_requests["user_name"]
    assert request_["method"] == "elicitation/create"
    assert request_["params"]["requestedSchema"]["properties"]["name"]["type"] == "string"
    assert first.request_state and "requestState" not in first.raw
    assert first.raw["resultType"] == "input_required"

    answers = {"user_name": {"action": "accept", "content": {"name": "Bob"}}}
    second = run(
        call_tool(
            config,
            "ask_name",
            {"greeting": "Hello"},
            input_responses=answers,
            request_state=first.request_state,
        )
    )
    assert isinstance(second, Completed)
    assert second.result["content"][0]["text"] == "Hello, Bob! (state=round-1)"

    calls = srv.calls()
    assert len(calls) == 2
    assert "requestState" not in calls[0]["body"]["params"]
    assert "inputResponses" not in calls[0]["body"]["params"]
    assert calls[1]["body"]["params"]["requestState"] == first.request_state
    assert calls[1]["body"]["params"]["inputResponses"] == answers
    assert calls[1]["body"]["params"]["arguments"] == {"greeting": "Hello"}
    assert calls[0]["body"]["id"] != calls[1]["body"]["id"]


def test_multi_round_loop_with_new_state_each_round(srv: LiveServer) -> None:
    config = srv.config()
    outcome = run(call_tool(config, "two_rounds", {}))
    states = []
    while isinstance(outcome, InputRequired):
        states.append(outcome.request_state)
        answers = {key: {"action": "accept", "content": {"name": "Ann"}} for key in outcome.input_requests}
        outcome = run(
            call_tool(config, "two_rounds", {}, input_responses=answers, request_state=outcome.request_state)
        )
    assert isinstance(outcome, Completed)
    assert len(states) == 2 and states[0] != states[1]
    ids = [call["body"]["id"] for call in srv.calls()]
    assert len(ids) == 3 and len(set(ids)) == 3


def test_state_only_round_retried_without_input_responses(srv: LiveServer) -> None:
    config = srv.config()
    first = run(call_tool(config, "state_only", {}))
    assert isinstance(first, InputRequired) and first.input_requests == {}
    second = run(call_tool(config, "state_only", {}, request_state=first.request_state))
    assert isinstance(second, Completed)
    retry = srv.calls()[1]["body"]["params"]
    assert retry["requestState"] == first.request_state
    assert "inputResponses" not in retry


def test_tool_error(srv: LiveServer) -> None:
    outcome = run(call_tool(srv.config(), "fail", {"reason": "disk full"}))
    assert isinstance(outcome, ToolError)
    assert outcome.result["isError"] is True
    assert "disk full" in outcome.result["content"][0]["text"]


def test_tampered_state_is_rejected(srv: LiveServer) -> None:
    config = srv.config()
    first = run(call_tool(config, "ask_name", {"greeting": "Hi"}))
    assert isinstance(first, InputRequired) and first.request_state
    tampered = first.request_state[:-4] + ("AAAA" if not first.request_state.endswith("AAAA") else "BBBB")
    answers = {"user_name": {"action": "accept", "content": {"name": "Eve"}}}
    with pytest.raises(PermanentError) as info:
        run(
            call_tool(config, "ask_name", {"greeting": "Hi"}, input_responses=answers, request_state=tampered)
        )
    assert info.value.code == "request_state_rejected"
    assert info.value.rpc_code == -32602
    assert tampered not in str(info.value) and first.request_state not in repr(info.value)


def test_sampling_input_request_is_unsupported(srv: LiveServer) -> None:
    with pytest.raises(PermanentError) as info:
        run(call_tool(srv.config(), "ask_sampling", {}))
    assert info.value.code == "unsupported_input_request"
    assert "capital_question" in info.value.message and "sampling/createMessage" in info.value.message


def test_idempotency_key_on_every_send_of_a_round(srv: LiveServer) -> None:
    config = srv.config()
    first = run(call_tool(config, "ask_name", {"greeting": "Yo"}, idempotency_key="call-42-round-1"))
    assert isinstance(first, InputRequired)
    answers = {"user_name": {"action": "accept", "content": {"name": "Kim"}}}
    run(
        call_tool(
            config,
            "ask_name",
            {"greeting": "Yo"},
            input_responses=answers,
            request_state=first.request_state,
            idempotency_key="call-42-round-2",
        )
    )
    calls = srv.calls()
    assert [c["headers"].get("idempotency-key") for c in calls] == ["call-42-round-1", "call-42-round-2"]
    lists = [r for r in srv.seen("/mcp") if r["body"]["method"] == "tools/list"]
    assert lists and all("idempotency-key" not in r["headers"] for r in lists)


def test_no_idempotency_key_when_not_given(srv: LiveServer) -> None:
    run(call_tool(srv.config(), "echo", {"text": "x"}))
    assert "idempotency-key" not in srv.calls()[0]["headers"]


def test_mcp_param_headers_on_the_wire(srv: LiveServer) -> None:
    outcome = run(call_tool(srv.config(), "deploy", {"region": "eu west ", "dry_run": True, "note": "n"}))
    assert isinstance(outcome, Completed)
    call = srv.calls()[0]
    headers = call["headers"]
    assert headers["mcp-name"] == "deploy"
    assert headers["mcp-param-region"] == b64("eu west ")
    assert headers["mcp-param-dry-run"] == "true"
    assert "mcp-param-priority" not in headers  # absent argument: no header
    assert not any(name.startswith("mcp-param-note") for name in headers)  # unannotated
    assert call["body"]["params"]["arguments"] == {"region": "eu west ", "dry_run": True, "note": "n"}


def test_mcp_param_integer_and_false(srv: LiveServer) -> None:
    run(call_tool(srv.config(), "deploy", {"region": "us-west1", "dry_run": False, "priority": 7}))
    headers = srv.calls()[0]["headers"]
    assert headers["mcp-param-region"] == "us-west1"
    assert headers["mcp-param-dry-run"] == "false"
    assert headers["mcp-param-priority"] == "7"


def _stored(srv: LiveServer) -> dict[str, dict[str, Any]]:
    """The server's tools as the hub stores them (a tools/list), then a clean request record."""
    tools = {tool["name"]: tool for tool in run(list_tools(srv.config()))}
    srv.reset()
    return tools


def test_stored_tool_definition_sends_only_the_call_with_its_param_headers(srv: LiveServer) -> None:
    stored = _stored(srv)
    arguments = {"region": "us-west1", "dry_run": False, "priority": 7}
    outcome = run(call_tool(srv.config(), "deploy", arguments, tool=stored["deploy"]))
    assert isinstance(outcome, Completed)
    assert [r["body"]["method"] for r in srv.seen("/mcp")] == ["tools/call"]
    headers = srv.calls()[0]["headers"]
    assert headers["mcp-param-region"] == "us-west1"
    assert headers["mcp-param-dry-run"] == "false"
    assert headers["mcp-param-priority"] == "7"


def test_stored_tool_definition_still_checks_the_output_schema(srv: LiveServer) -> None:
    stored = _stored(srv)
    outcome = run(call_tool(srv.config(), "typed_out", {}, tool=stored["typed_out"]))
    assert isinstance(outcome, Completed)
    assert outcome.output_schema_error and "typed_out" in outcome.output_schema_error
    assert [r["body"]["method"] for r in srv.seen("/mcp")] == ["tools/call"]


@pytest.mark.parametrize("given", ["another_tool", "invalid_headers", "malformed"])
def test_unusable_stored_tool_definition_lists_the_tools_first(srv: LiveServer, given: str) -> None:
    stored = _stored(srv)
    tool: dict[str, Any] = {
        "another_tool": stored["echo"],
        "invalid_headers": {
            **stored["deploy"],
            "inputSchema": {"type": "object", "properties": {"r": {"type": "object", "x-mcp-header": "R"}}},
        },
        "malformed": {"name": "deploy", "inputSchema": "not a schema"},
    }[given]
    outcome = run(call_tool(srv.config(), "deploy", {"region": "eu"}, tool=tool))
    assert isinstance(outcome, Completed)
    assert [r["body"]["method"] for r in srv.seen("/mcp")] == ["tools/list", "tools/call"]
    assert srv.calls()[0]["headers"]["mcp-param-region"] == "eu"


@pytest.mark.parametrize("stored_definition", [True, False])
def test_an_output_schema_is_compiled_once_per_process(
    srv: LiveServer, monkeypatch: pytest.MonkeyPatch, stored_definition: bool
) -> None:
    # The SDK compiles a tool's output schema once per session, and each send opens a session of its own:
    # every completed call checked the same schema against its metaschema again (6 ms of CPU for nested
    # models).
    tool = _stored(srv)["typed_out"] if stored_definition else None
    run(call_tool(srv.config(), "typed_out", {}, tool=tool))
    checked: list[Any] = []
    check = Draft202012Validator.check_schema

    def counted(schema: Any, *args: Any, **kwargs: Any) -> None:
        checked.append(schema)
        check(schema, *args, **kwargs)

    monkeypatch.setattr(Draft202012Validator, "check_schema", counted)
    for _ in range(3):
        outcome = run(call_tool(srv.config(), "typed_out", {}, tool=tool))
        assert isinstance(outcome, Completed)
        # The shared validator still judges every result.
        assert outcome.output_schema_error and "typed_out" in outcome.output_schema_error
    assert checked == []


def test_only_small_valid_output_schemas_are_shared() -> None:
    from approvals.mcp_client import client

    small = {"type": "object", "properties": {"count": {"type": "integer"}}}
    shared = client._shared_validator(small)
    assert shared is not None
    assert client._shared_validator(json.loads(json.dumps(small))) is shared  # by content, not identity
    assert shared.is_valid({"count": 1}) and not shared.is_valid({"count": "one"})
    # An invalid schema, and one over the size cap, are left to the SDK (compiled per session) and kept out
    # of the process's cache, whatever a server sends.
    kept = client._compiled_output_schema.cache_info().currsize
    huge = {"type": "object", "description": "x" * client.MAX_SHARED_SCHEMA}
    for schema in ({"type": 12}, huge, ["not", "an", "object"]):
        assert client._shared_validator(schema) is None
    assert client._compiled_output_schema.cache_info().currsize <= kept + 1  # the invalid verdict at most


def test_a_tool_the_server_does_not_list_completes_without_a_second_listing(srv: LiveServer) -> None:
    # The SDK lists the tools again after a call of a tool it has not seen listed, to check its result; that
    # listing's answer took the result's place, and the call, which had run, ended as malformed.
    outcome = run(call_tool(srv.config("/scripted/plain"), "hidden", {}))
    assert isinstance(outcome, Completed)
    assert outcome.result["content"][0]["text"] == "plain ok"
    methods = [record["body"]["method"] for record in srv.seen("/scripted/plain")]
    assert methods == ["tools/list", "tools/call"]


def test_output_schema_violation_is_an_outcome_not_a_failure(srv: LiveServer) -> None:
    outcome = run(call_tool(srv.config(), "typed_out", {}))
    assert isinstance(outcome, Completed)
    assert outcome.output_schema_error and "typed_out" in outcome.output_schema_error
    assert outcome.result["structuredContent"] == {"count": "not a number"}
    assert len(srv.calls()) == 1


def test_timeout_is_transient(srv: LiveServer) -> None:
    with pytest.raises(TransientError) as info:
        run(call_tool(srv.config(timeout=0.5), "slow", {"seconds": 3}))
    assert info.value.code == "timeout"


def test_list_tools_keeps_schemas_verbatim(srv: LiveServer) -> None:
    tools = {tool["name"]: tool for tool in run(list_tools(srv.config()))}
    assert {"echo", "ask_name", "deploy", "fail"} <= set(tools)
    region = tools["deploy"]["inputSchema"]["properties"]["region"]
    assert region["x-mcp-header"] == "Region"


def test_discover_result_round_trips_as_cached_discover(srv: LiveServer) -> None:
    result = run(discover(srv.config()))
    assert PROTOCOL_VERSION in result["supportedVersions"]
    assert srv.seen("/mcp")[0]["headers"]["mcp-method"] == "server/discover"
    assert (
        srv.seen("/mcp")[0]["body"]["params"]["_meta"]["io.modelcontextprotocol/clientInfo"]["name"]
        == "elicit-hub"
    )
    srv.reset()
    outcome = run(call_tool(srv.config(discover=result), "echo", {"text": "cached"}))
    assert isinstance(outcome, Completed)
    assert [r["body"]["method"] for r in srv.seen("/mcp")] == ["tools/list", "tools/call"]


# ---- real HTTP: broken or odd servers ------------------------------------------------------------


def test_http_500_is_transient(srv: LiveServer) -> None:
    with pytest.raises(TransientError) as info:
        run(call_tool(srv.config("/scripted/error500"), "scripted", {}))
    assert info.value.code == "http_5xx"


def test_http_429_is_transient_with_retry_after(srv: LiveServer) -> None:
    with pytest.raises(TransientError) as info:
        run(call_tool(srv.config("/scripted/ratelimited"), "scripted", {}))
    assert info.value.code == "rate_limited"
    assert info.value.retry_after == 7.0


def test_http_401_is_permanent_and_never_shows_the_token(srv: LiveServer) -> None:
    with pytest.raises(PermanentError) as info:
        run(call_tool(srv.config("/scripted/unauthorized"), "scripted", {}))
    assert info.value.code == "auth_failed"
    assert "s3cret" not in str(info.value) and "s3cret" not in repr(info.value)


def test_connection_refused_is_transient() -> None:
    config = ServerConfig(url=f"http://127.0.0.1:{_free_port()}/mcp", timeout=5.0)
    with pytest.raises(TransientError) as info:
        run(call_tool(config, "echo", {"text": "x"}))
    assert info.value.code == "connect_failed"


@pytest.mark.parametrize(
    "mode", ["malformed", "html", "wrong_shape", "unknown_result_type", "bad_elicitation"]
)
def test_malformed_answers_are_permanent(srv: LiveServer, mode: str) -> None:
    with pytest.raises(PermanentError) as info:
        run(call_tool(srv.config(f"/scripted/{mode}"), "scripted", {}))
    assert info.value.code == "malformed_response"


def test_roots_input_request_is_unsupported(srv: LiveServer) -> None:
    with pytest.raises(PermanentError) as info:
        run(call_tool(srv.config("/scripted/roots"), "scripted", {}))
    assert info.value.code == "unsupported_input_request"
    assert "client_roots" in info.value.message and "roots/list" in info.value.message


def test_json_rpc_error_is_permanent(srv: LiveServer) -> None:
    with pytest.raises(PermanentError) as info:
        run(call_tool(srv.config("/scripted/rpc_error"), "scripted", {}))
    assert info.value.code == "rpc_error" and info.value.rpc_code == -32603


def test_missing_result_type_is_complete_over_http(srv: LiveServer) -> None:
    outcome = run(call_tool(srv.config("/scripted/no_result_type"), "scripted", {}))
    assert isinstance(outcome, Completed)
    assert outcome.result["content"][0]["text"] == "complete without resultType"
    assert len(srv.calls()) == 1  # complete: never retried


def test_url_elicitation_keeps_raw_meta(srv: LiveServer) -> None:
    outcome = run(call_tool(srv.config("/scripted/url_elicitation"), "scripted", {}))
    assert isinstance(outcome, InputRequired)
    assert outcome.input_requests["login"]["params"]["url"] == "https://example.invalid/login"
    assert outcome.raw["_meta"] == {"vendor/x": 1}
    assert outcome.request_state == "u"


def test_unsupported_version_is_a_clear_permanent_error(srv: LiveServer) -> None:
    with pytest.raises(PermanentError) as info:
        run(call_tool(srv.config("/scripted/old_version"), "scripted", {}))
    assert info.value.code == "protocol_unsupported"
    assert "this server does not speak MCP 2026-07-28" in info.value.message
    with pytest.raises(PermanentError) as info:
        run(discover(srv.config("/scripted/old_version")))
    assert info.value.code == "protocol_unsupported"


def test_recovers_from_minus_32022_naming_our_version(srv: LiveServer) -> None:
    outcome = run(call_tool(srv.config("/scripted/reject_first_version"), "scripted", {}))
    assert isinstance(outcome, Completed)
    methods = [r["body"]["method"] for r in srv.seen("/scripted/reject_first_version")]
    assert methods == ["tools/list", "tools/list", "tools/call"]
    for record in srv.seen("/scripted/reject_first_version"):
        assert record["headers"]["mcp-protocol-version"] == PROTOCOL_VERSION


def test_list_tools_walks_every_page(srv: LiveServer) -> None:
    names = [tool["name"] for tool in run(list_tools(srv.config("/scripted/paged")))]
    assert names == ["first_page", "second_page"]
    cursors = [(r["body"].get("params") or {}).get("cursor") for r in srv.seen("/scripted/paged")]
    assert cursors == [None, "page-2"]


def test_tools_with_invalid_header_annotations_are_dropped_and_never_called(srv: LiveServer) -> None:
    config = srv.config("/scripted/invalid_headers")
    assert [tool["name"] for tool in run(list_tools(config))] == ["valid_tool"]
    with pytest.raises(PermanentError) as info:
        run(call_tool(config, "invalid_number_header", {"score": 1.5}))
    assert info.value.code == "invalid_tool_headers"
    assert srv.calls() == []
    run(call_tool(config, "valid_tool", {"region": "us-west1"}))
    assert srv.calls()[0]["headers"]["mcp-param-region"] == "us-west1"


def test_network_ref_is_never_fetched_and_arguments_pass_untouched(srv: LiveServer) -> None:
    config = srv.config("/scripted/network_ref")
    tools = run(list_tools(config))
    schema = tools[0]["inputSchema"]
    assert schema["properties"]["profile"]["$ref"].endswith("/canary")
    assert schema["$defs"] == {"userId": {"type": "string", "pattern": "^[a-z0-9-]+$"}}
    assert schema["additionalProperties"] is False
    arguments = {
        "id": "u-1",
        "profile": None,
        "flag": False,
        "empty": "",
        "$ref": "#/x",
        "nested": {"a": None},
    }
    run(call_tool(config, "lookup_user", arguments))
    assert srv.calls()[0]["body"]["params"]["arguments"] == arguments
    assert srv.seen("/canary") == []


def test_no_secret_reaches_the_logs(srv: LiveServer, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    config = srv.config()
    first = run(call_tool(config, "ask_name", {"greeting": "Hey"}))
    assert isinstance(first, InputRequired) and first.request_state
    answers = {"user_name": {"action": "accept", "content": {"name": "Lee"}}}
    run(
        call_tool(
            config,
            "ask_name",
            {"greeting": "Hey"},
            input_responses=answers,
            request_state=first.request_state,
        )
    )
    with pytest.raises(PermanentError):
        run(call_tool(srv.config("/scripted/malformed"), "scripted", {}))
    text = caplog.text + "".join(str(r.exc_info) for r in caplog.records)
    assert caplog.records  # the SDK did log, at DEBUG
    assert first.request_state not in text
    assert "s3cret" not in text


def test_wire_gives_each_request_a_fresh_id_and_maps_answers_back() -> None:
    from mcp.shared.message import SessionMessage
    from mcp_types import JSONRPCRequest, JSONRPCResponse

    from approvals.mcp_client.transport import Wire

    first, second = Wire(None), Wire(None)
    sent = [
        w.outbound(SessionMessage(JSONRPCRequest(jsonrpc="2.0", id=1, method="tools/list")))
        for w in (first, second)
    ]
    wire_ids = [s.message.id for s in sent if isinstance(s.message, JSONRPCRequest)]
    assert wire_ids[0] != 1 and wire_ids[1] != 1 and wire_ids[0] != wire_ids[1]  # two processes, two ids
    answer = SessionMessage(JSONRPCResponse(jsonrpc="2.0", id=wire_ids[0], result={"content": []}))
    back = first.inbound(answer)
    assert back.message.id == 1
    assert back.message.result == {"content": [], "resultType": "complete"}  # missing resultType = complete
    assert first.last_result == {"content": []}  # kept verbatim


def test_sends_after_the_first_start_no_thread(srv: LiveServer, monkeypatch: pytest.MonkeyPatch) -> None:
    # Each send runs in an event loop of its own (a Celery task's). The outbound guard's DNS checks ran on
    # anyio's worker threads, which belong to one loop: every send started a thread and stopped it again.
    run(call_tool(srv.config(), "echo", {"text": "first"}))
    started: list[str] = []
    start = threading.Thread.start

    def counted(self: threading.Thread) -> None:
        started.append(self.name)
        start(self)

    monkeypatch.setattr(threading.Thread, "start", counted)
    for i in range(3):
        outcome = run(call_tool(srv.config(), "echo", {"text": f"again {i}"}))
        assert isinstance(outcome, Completed)
    assert started == []


def test_error_messages_scrub_a_quoted_piece_of_a_secret() -> None:
    """A server that quotes only part of a requestState (its start, cut short; or a message cut through it)
    gave that part away in the call's error, shown to agents and reviewers."""
    state = "eyJhbGciOiJIUzI1NiJ9.c2VjcmV0LXN0YXRlLWZvci10aGUtc2VydmVy.sig-0123456789abcdef"
    cut = classify_rpc_error(
        -32602, f"invalid requestState '{state[:40]}...' (expired)", None, HttpFacts(200), secrets=[state]
    )
    assert state[:40] not in cut.message and state[:16] not in cut.message
    assert cut.message.endswith(": invalid requestState '[redacted]...' (expired)")
    middle = classify_rpc_error(-32602, f"bad: {state[20:50]}!", None, HttpFacts(200), secrets=[state])
    assert middle.message.endswith(": bad: [redacted]!")
    # Through the cut at MAX_MESSAGE characters: the part before the cut is still a piece of it.
    long = classify_rpc_error(-32602, "x" * 280 + state, None, HttpFacts(200), secrets=[state])
    assert state[:20] not in long.message and "[redacted]" in long.message
    # Shorter runs are ordinary text: a message sharing a word with the secret keeps it.
    plain = classify_rpc_error(-32602, "state for the server expired", None, HttpFacts(200), secrets=[state])
    assert plain.message.endswith(": state for the server expired")
