"""Pure helpers for `approvals.mcp_client`: no I/O, no SDK session, easy to unit-test.

- reading a ``tools/call`` result (complete / isError / input_required, a missing ``resultType``)
- checking the input requests of an ``input_required`` round (the hub answers elicitations only)
- the ``x-mcp-header`` rules (``Mcp-Param-*`` headers), delegated to the SDK's own codec
- turning JSON-RPC errors and HTTP facts into `TransientError` / `PermanentError`
"""

from __future__ import annotations

import email.utils
import re
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import mcp_types
from mcp.shared.inbound import (
    encode_header_value,
    find_invalid_x_mcp_header,
    mcp_param_headers,
    x_mcp_header_map,
)
from mcp_types import (
    CONNECTION_CLOSED,
    HEADER_MISMATCH,
    INTERNAL_ERROR,
    INVALID_PARAMS,
    INVALID_REQUEST,
    PARSE_ERROR,
    REQUEST_TIMEOUT,
    UNSUPPORTED_PROTOCOL_VERSION,
)
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS, MODERN_PROTOCOL_VERSIONS
from pydantic import ValidationError

from approvals import netguard, safejson
from approvals.mcp_client.outcomes import (
    REDACTED,
    Completed,
    InputRequired,
    McpError,
    Outcome,
    PermanentError,
    ToolError,
    TransientError,
    storable_text,
)

PROTOCOL_VERSION = "2026-07-28"
ELICITATION_METHOD = "elicitation/create"
MAX_MESSAGE = 300
# How deep a server's answer may nest (objects and arrays); deeper ones are malformed. Generous: results of
# real tools are far shallower, and the hub walks what it stores without recursion anyway.
MAX_DEPTH = 64
MAX_KEY = 500  # the longest inputRequests key the hub stores
# How much of a value from the server an error message quotes (a key, a method, a version), and how many
# versions it lists: a server's answer may be megabytes, and the message is stored, audited and logged.
MAX_QUOTED = 80
MAX_LISTED = 5

__all__ = [
    "PROTOCOL_VERSION",
    "HttpFacts",
    "check_input_requests",
    "classify_rpc_error",
    "encode_header_value",
    "handshake_hint",
    "invalid_header_reason",
    "listed",
    "names_unknown_tool",
    "param_headers",
    "parse_retry_after",
    "read_call_result",
    "scrub",
    "validation_summary",
]


# ---- x-mcp-header / Mcp-Param-* ----------------------------------------------------------------


def invalid_header_reason(input_schema: Any) -> str | None:
    """Why a tool's ``x-mcp-header`` annotations are invalid (such tools are dropped), or None."""
    return find_invalid_x_mcp_header(input_schema)


def param_headers(input_schema: Any, arguments: Mapping[str, Any] | None) -> dict[str, str]:
    """The ``Mcp-Param-*`` headers a ``tools/call`` with `arguments` carries (what the SDK sends).

    Each argument whose schema property has ``x-mcp-header: Name`` goes out as ``Mcp-Param-Name``:
    booleans as ``true``/``false``, numbers as written, strings verbatim unless they are not header
    safe (non-ASCII, control characters, leading/trailing spaces, the sentinel itself), which are sent
    as ``=?base64?<base64 of UTF-8>?=``. Null or absent values send no header. A schema with an invalid
    annotation yields no headers (the tool is dropped from the listing anyway).
    """
    if invalid_header_reason(input_schema) is not None:
        return {}
    return mcp_param_headers(x_mcp_header_map(input_schema), arguments or {})


# ---- results -----------------------------------------------------------------------------------


def quoted(value: Any) -> str:
    """A value from the server as an error message quotes it: a string as its repr, at most `MAX_QUOTED`
    characters of it, storable; any other value only by its JSON type (its repr may be huge, or raise)."""
    if isinstance(value, str):
        more = "..." if len(value) > MAX_QUOTED else ""
        return repr(storable_text(value[:MAX_QUOTED])) + more
    if value is None or isinstance(value, bool):
        return "null" if value is None else str(value).lower()
    if isinstance(value, int | float):
        return "a number"
    return "an array" if isinstance(value, list | tuple) else "an object"


def listed(values: Iterable[Any]) -> str:
    """The versions (or names) a server listed, as an error message shows them: at most `MAX_LISTED`, each
    cut short."""
    shown: list[str] = []
    for number, value in enumerate(values):
        if number == MAX_LISTED:
            shown.append("...")
            break
        text = storable_text(value if isinstance(value, str) else quoted(value))
        shown.append(text if len(text) <= MAX_QUOTED else text[:MAX_QUOTED] + "...")
    return ", ".join(shown)


def _malformed(what: str, detail: str) -> PermanentError:
    return PermanentError("malformed_response", f"the server's answer to {what} is malformed: {detail}")


def validation_summary(error: ValidationError, limit: int = 5) -> str:
    """Where a pydantic validation failed, without echoing any input value (it may hold secrets)."""
    parts = []
    for item in error.errors()[:limit]:
        loc = storable_text(".".join(str(p) for p in item.get("loc", ()))) or "(root)"
        parts.append(f"{loc}: {item.get('type', 'invalid')}")
    more = len(error.errors()) - limit
    if more > 0:
        parts.append(f"and {more} more")
    return "; ".join(parts)


def check_input_requests(value: Any, what: str = "tools/call") -> dict[str, dict[str, Any]]:
    """Validate an ``inputRequests`` object and return ``{key: {"method": ..., "params": ...}}``.

    Raises `PermanentError`: ``unsupported_input_request`` for anything but ``elicitation/create``
    (sampling, roots), ``malformed_response`` for a badly shaped elicitation. What the messages quote of the
    server's answer is bounded (`quoted`).
    """
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise _malformed(what, "inputRequests is not an object")
    checked: dict[str, dict[str, Any]] = {}
    for key, request in value.items():
        if len(key) > MAX_KEY:
            raise _malformed(what, f"an input request key is longer than {MAX_KEY} characters")
        if not isinstance(request, dict) or not isinstance(request.get("method"), str):
            raise _malformed(what, f"input request {quoted(key)} has no method")
        method = request["method"]
        if method != ELICITATION_METHOD:
            raise PermanentError(
                "unsupported_input_request",
                f"the server asked for {quoted(method)} (input request {quoted(key)}); the hub can only "
                f"answer {ELICITATION_METHOD!r} (forms and URLs for a human), not sampling or roots requests",
            )
        params = request.get("params")
        if not isinstance(params, dict):
            raise _malformed(what, f"elicitation {quoted(key)} has no params object")
        mode = params.get("mode", "form")
        if mode not in ("form", "url"):
            raise _malformed(what, f"elicitation {quoted(key)} has an unknown mode {quoted(mode)}")
        if not isinstance(params.get("message"), str):
            raise _malformed(what, f"elicitation {quoted(key)} has no message text")
        if mode == "form":
            schema = params.get("requestedSchema")
            if not isinstance(schema, dict) or not isinstance(schema.get("properties", {}), dict):
                raise _malformed(what, f"form elicitation {quoted(key)} has no requestedSchema object")
        else:
            url = params.get("url")
            if not isinstance(url, str) or not _looks_like_url(url):
                raise _malformed(what, f"URL elicitation {quoted(key)} has no valid url")
        checked[key] = {"method": method, "params": params}
    return checked


def _looks_like_url(url: str) -> bool:
    try:
        parts = urlsplit(url)
    except ValueError:
        return False
    return bool(parts.scheme) and bool(parts.netloc or parts.path)


def read_call_result(raw: Any, what: str = "tools/call") -> Outcome:
    """Turn a raw ``tools/call`` result (JSON, as received) into an outcome.

    A missing ``resultType`` means ``complete`` (spec; conformance issue #475); an unknown one is
    malformed. ``input_required`` keeps the result verbatim (minus ``requestState``) and checks its
    input requests.
    """
    if not isinstance(raw, dict):
        raise _malformed(what, "the result is not an object")
    unstorable = safejson.problem(raw, max_depth=MAX_DEPTH)
    if unstorable is not None:
        # NUL, lone surrogates, NaN or absurd nesting: nothing the hub could store or show.
        raise _malformed(what, f"{unstorable[0]} at {unstorable[1]}")
    result_type = raw.get("resultType", "complete")
    if result_type == "input_required":
        state = raw.get("requestState")
        if state is not None and not isinstance(state, str):
            raise _malformed(what, "requestState is not a string")
        requests = check_input_requests(raw.get("inputRequests"), what)
        if not requests and state is None:
            raise _malformed(what, "an input_required result carries neither inputRequests nor requestState")
        kept = {k: v for k, v in raw.items() if k != "requestState"}
        return InputRequired(raw=kept, input_requests=requests, request_state=state)
    if result_type != "complete":
        raise _malformed(what, f"unknown resultType {quoted(result_type)}")
    try:
        parsed = mcp_types.CallToolResult.model_validate({**raw, "resultType": "complete"}, by_name=False)
    except ValidationError as exc:
        raise _malformed(what, validation_summary(exc)) from None
    dumped = parsed.model_dump(by_alias=True, mode="json", exclude_none=True)
    return ToolError(dumped) if parsed.is_error else Completed(dumped)


# ---- errors ------------------------------------------------------------------------------------


# What servers of the handshake era answer a request that arrives without a session (the TypeScript SDK,
# mcp 1.x / FastMCP 2.x, the Go SDK), or with a 2026-07-28 MCP-Protocol-Version header they do not know.
SESSION_REFUSALS = (
    "server not initialized",
    "missing session id",
    "no valid session id",
    "session id required",
    "mcp-session-id header is required",
    "invalid or missing session id",
)
VERSION_REFUSALS = ("unsupported protocol version", "unsupported mcp-protocol-version")
# What the SDK's transport puts in place of an HTTP error's JSON body it cannot read as JSON-RPC (an error
# without an ``id``), with code INTERNAL_ERROR: the server's own words are in `HttpFacts.said`.
SDK_STAND_IN = "Server returned an error response"
# How the SDK's transport says an event of an SSE answer went past its bound (httpx2's SSEError).
SSE_EVENT_TOO_LARGE = "Server-sent event exceeded the"
# How the SDK says, with code CONNECTION_CLOSED (-32000), that a request's answer can no longer arrive: its
# session or connection closed, its SSE stream ended or broke. A server's own error may carry -32000 too
# (JSON-RPC's first "server error" code, which many servers use for any failure): that is its answer.
SDK_CLOSED = ("Connection closed", "SSE stream ended", "SSE stream failed")


def sdk_closed(message: str | None) -> bool:
    """Whether an error with code CONNECTION_CLOSED is the SDK's word that the connection or stream closed
    (not a server's own -32000 error)."""
    return message is not None and message.startswith(SDK_CLOSED)


_UNKNOWN_TOOL = re.compile(
    r"unknown tool|tool\b.{0,200}\bnot found|no such tool|tool not found", re.IGNORECASE
)


def names_unknown_tool(text: str) -> bool:
    """True when a server's error text says the tool it was asked to call does not exist."""
    return bool(_UNKNOWN_TOOL.search(text[:2000]))


def handshake_hint(version: str | None = None) -> str:
    """What to tell an admin whose server speaks only the handshake era."""
    named = version or "2025-11-25 or earlier"
    return f"this server speaks the handshake era ({named}); set its era to handshake or auto"


def _handshake_version(text: str) -> str | None:
    """The newest handshake-era version a refusal names, if any."""
    named = [v for v in HANDSHAKE_PROTOCOL_VERSIONS if v in text]
    return max(named) if named else None


def _handshake_refusal(code: int, message: str, status: int | None) -> str | None:
    """The hint when an error says the server wants a handshake-era session, else None."""
    if status is not None and not 400 <= status < 500:
        return None
    lowered = message.lower()
    if any(phrase in lowered for phrase in SESSION_REFUSALS):
        return handshake_hint(_handshake_version(message))
    if any(phrase in lowered for phrase in VERSION_REFUSALS) and code != UNSUPPORTED_PROTOCOL_VERSION:
        return handshake_hint(_handshake_version(message))
    return None


@dataclass
class HttpFacts:
    """What the last HTTP exchange looked like (the SDK folds these into generic JSON-RPC errors).

    `session`: the request carried an ``Mcp-Session-Id`` (a handshake-era session). `said` and `said_code`:
    the message and code of the JSON error an HTTP error status came with, as the server wrote them: the SDK
    replaces an error it cannot read as JSON-RPC (one without an ``id``, as Express servers on the TypeScript
    SDK send when they echo ``req.body.id`` with no body parser) with its own words (`SDK_STAND_IN`)."""

    status: int | None = None
    content_type: str | None = None
    retry_after: float | None = None
    session: bool = False
    said: str | None = None
    said_code: int | None = None


def parse_retry_after(value: str | None, now: float | None = None) -> float | None:
    """Seconds to wait from a Retry-After header (delta-seconds or an HTTP date), or None; never raises."""
    if value is None:
        return None
    value = value.strip()
    # ASCII digits only: str.isdigit() also takes "²", which float() refuses, and this runs in the HTTP
    # client's response hook, where an exception would lose the answer it came with.
    if value.isascii() and value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
        if when is None:
            return None
        delta = when.timestamp() - (time.time() if now is None else now)
    except (TypeError, ValueError, IndexError, OverflowError, OSError):
        return None
    return max(0.0, delta)


# A run of this many characters of a longer secret, quoted in a message, is taken for a piece of it.
SECRET_PIECE = 16


def scrub(text: str, secrets: Iterable[str | None]) -> str:
    """Replace every secret (header values, requestState) occurring in `text`, make it storable (a server's
    NUL or lone surrogate becomes U+FFFD), and shorten it. A server quoting part of a secret ("invalid state
    eyJhbGciOi..." cut short, or the message cut here through it) gives away that part: any run of
    `SECRET_PIECE` or more of a secret's characters is replaced too."""
    text = storable_text(text)
    kept = [secret for secret in secrets if secret and len(secret) >= 4]
    for secret in kept:
        text = text.replace(secret, REDACTED)
    if len(text) > MAX_MESSAGE:
        text = text[:MAX_MESSAGE] + "..."
    for secret in kept:
        if len(secret) > SECRET_PIECE:
            text = _pieces_redacted(text, secret)
    return text


def _pieces_redacted(text: str, secret: str) -> str:
    """`text` with every run of at least `SECRET_PIECE` characters that also occurs in `secret` replaced."""
    covered: list[list[int]] = []
    for start in range(len(text) - SECRET_PIECE + 1):
        if text[start : start + SECRET_PIECE] in secret:
            end = start + SECRET_PIECE
            if covered and start <= covered[-1][1]:
                covered[-1][1] = end
            else:
                covered.append([start, end])
    for start, end in reversed(covered):
        text = text[:start] + REDACTED + text[end:]
    return text


def classify_rpc_error(
    code: int,
    message: str,
    data: Any,
    http: HttpFacts | None = None,
    *,
    what: str = "the request",
    secrets: Iterable[str | None] = (),
) -> McpError:
    """Classify a JSON-RPC error (from the server, or synthesized by the SDK's transport)."""
    http = http or HttpFacts()
    status = http.status
    if code == INTERNAL_ERROR and message == SDK_STAND_IN and http.said is not None:
        # The SDK's stand-in for an error it could not read (no ``id``): the server's own error is judged.
        code = http.said_code if http.said_code is not None else code
        message = http.said
    text = scrub(message or "", secrets)
    json_body = (http.content_type or "").lower().startswith("application/json")
    if code == REQUEST_TIMEOUT and (status is None or status < 400):
        # The SDK's own time-out, or a server's error -32001 in a successful answer. Not an HTTP error's: the
        # TypeScript SDK answers a request on a session it no longer knows with HTTP 404 and -32001.
        return TransientError("timeout", f"no answer to {what} in time")
    said = http.said or message or ""
    expired: McpError | None = None
    if status in (400, 404) and (status == 404 or http.session) and "session" in said.lower():
        # A handshake-era session the server ended or forgot (a restart, an idle timeout): it refused the
        # request unread (a 404, the spec's answer; a 400 naming the session, the TypeScript SDK's), and a new
        # session may send it.
        expired = TransientError(
            "session_expired",
            f"the server no longer knows the session of {what} (HTTP {status}: {scrub(said, secrets)})",
        )
    if expired is not None and http.session:
        return expired  # on a session, a refusal naming the session is never a refusal of stateless requests
    hint = _handshake_refusal(code, message or "", status)
    if hint is not None:
        # A handshake-era server refusing a stateless request: resending it can never work.
        return PermanentError(
            "protocol_unsupported",
            f"the server refused {what} without a session ({text}): {hint}",
            rpc_code=code,
        )
    if expired is not None:
        return expired
    if status == 429:
        return TransientError(
            "rate_limited", f"the server is rate limiting {what} (HTTP 429)", retry_after=http.retry_after
        )
    if status is not None and status >= 500:
        return TransientError(
            "http_5xx", f"the server failed on {what} (HTTP {status})", retry_after=http.retry_after
        )
    if (
        code == CONNECTION_CLOSED
        and sdk_closed(message)
        and SSE_EVENT_TOO_LARGE in message
        and (status is None or status < 400)
    ):
        # One event of the answer's stream went past the bound (`transport.http_stream`): it would again.
        return PermanentError(
            "response_too_large",
            f"an event of the server's answer to {what} is larger than {netguard.max_response()} bytes, the "
            "most the hub reads (ELICIT_MAX_MCP_RESPONSE); it was not read",
        )
    if code == CONNECTION_CLOSED and sdk_closed(message) and (status is None or status < 400):
        return TransientError("network_error", f"the connection closed before {what} was answered ({text})")
    if status in (401, 403):
        return PermanentError("auth_failed", f"the server refused our credentials for {what} (HTTP {status})")
    if status is not None and status >= 400 and not json_body:
        return PermanentError("http_4xx", f"the server rejected {what} with HTTP {status}", rpc_code=None)
    if code == UNSUPPORTED_PROTOCOL_VERSION:
        supported = data.get("supported") if isinstance(data, dict) else None
        offered = f" (it offers {listed(supported)})" if isinstance(supported, list) else ""
        named = supported if isinstance(supported, list) else []
        older = [str(v) for v in named if v in HANDSHAKE_PROTOCOL_VERSIONS]
        newer = [str(v) for v in named if v in MODERN_PROTOCOL_VERSIONS]
        advice = f": {handshake_hint(max(older))}" if older and not newer else ""
        return PermanentError(
            "protocol_unsupported",
            f"this server does not speak MCP {PROTOCOL_VERSION} for {what}{offered}{advice}",
            rpc_code=code,
        )
    if code == INVALID_PARAMS and isinstance(data, dict) and data.get("reason") == "invalid_request_state":
        return PermanentError(
            "request_state_rejected",
            "the server no longer accepts the saved state of this call (expired, altered, or bound to other "
            "arguments or credentials); start the call again",
            rpc_code=code,
        )
    if status is None or status < 400:
        if code == PARSE_ERROR and netguard.RESPONSE_TOO_LARGE in message:
            return PermanentError(
                "response_too_large",
                f"the server's answer to {what} is larger than {netguard.max_response()} bytes, the most the "
                "hub reads (ELICIT_MAX_MCP_RESPONSE); it was not read",
            )
        if code == PARSE_ERROR and message.startswith("Failed to parse"):
            return PermanentError(
                "malformed_response", f"the server's answer to {what} is not valid JSON-RPC"
            )
        if code == INVALID_REQUEST and message.startswith("Unexpected content type"):
            return PermanentError(
                "malformed_response", f"the server answered {what} with an unexpected content type"
            )
        if code == INVALID_REQUEST and "202 Accepted" in message:
            return PermanentError(
                "malformed_response", f"the server answered {what} with no result (HTTP 202)"
            )
    if code == INVALID_PARAMS and names_unknown_tool(message or ""):
        return PermanentError(
            "unknown_tool", f"the server does not know the tool of {what}: {text}", rpc_code=code
        )
    if code == HEADER_MISMATCH:
        return PermanentError(
            "header_mismatch",
            f"the server expects other Mcp-Param-* headers for {what}: {text}",
            rpc_code=code,
        )
    if code == INVALID_REQUEST and message.startswith("Redirect to"):
        return PermanentError("redirect_not_followed", text)
    return PermanentError("rpc_error", f"the server answered {what} with error {code}: {text}", rpc_code=code)
