"""Plain data crossing the boundary of `approvals.mcp_client`: server settings, call outcomes, errors.

Everything here is picklable/JSON-friendly plain data so Celery tasks can pass it around. Secrets
(header values, `requestState`) never appear in a `repr` or an exception message.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from approvals import safejson, urlparts

REDACTED = "[redacted]"
# The longest error message kept: what quotes a server (`wire.quoted`, `wire.scrub`) is far shorter; this
# bounds whatever else may one day carry a server's text into a call's error, the audit log and the logs.
MAX_ERROR_MESSAGE = 2000


# Every text a server sends that ends up in an outcome or an error passes here.
storable_text = safejson.storable_text


@dataclass(frozen=True)
class ServerConfig:
    """How to reach one MCP server.

    `headers` holds credentials (e.g. ``{"Authorization": "Bearer ..."}``): its values are secret and
    are redacted from `repr`. `discover` is a cached ``server/discover`` result (JSON) used instead of a
    synthesized one; `timeout` bounds each HTTP exchange, in seconds.
    """

    url: str
    headers: Mapping[str, str] = field(default_factory=dict)
    discover: dict[str, Any] | None = None
    timeout: float = 30.0

    def __repr__(self) -> str:
        shown = {name: REDACTED for name in self.headers}
        cached = "yes" if self.discover is not None else "no"
        return (
            f"ServerConfig(url={urlparts.shown(self.url)!r}, headers={shown!r}, discover={cached}, "
            f"timeout={self.timeout!r})"
        )


@dataclass(frozen=True)
class Completed:
    """The tool finished (``isError`` false). `result` is the CallToolResult as JSON.

    `output_schema_error` is set when the result does not match the tool's declared output schema:
    the tool has run all the same, so this is an outcome, never something to retry.
    """

    result: dict[str, Any]
    output_schema_error: str | None = None


@dataclass(frozen=True)
class ToolError:
    """The tool ran and reported a failure (``isError`` true). `result` is the CallToolResult as JSON."""

    result: dict[str, Any]


@dataclass(frozen=True)
class InputRequired:
    """The server needs input before it can finish the call.

    `raw` is the result JSON exactly as received, minus ``requestState``. `input_requests` maps each of
    the server's (opaque) keys to ``{"method": "elicitation/create", "params": {...}}``; it may be empty
    when the server only sent a state (the caller may retry at once). `request_state` must be echoed
    byte for byte on the retry; it is kept out of `repr`.
    """

    raw: dict[str, Any]
    input_requests: dict[str, dict[str, Any]]
    request_state: str | None = field(default=None, repr=False)


Outcome = Completed | ToolError | InputRequired


class McpError(Exception):
    """A call that did not reach an outcome.

    `code` is a stable snake_case reason (``connect_failed``, ``timeout``, ``http_5xx``,
    ``rate_limited``, ``network_error``, ``rpc_error``, ``request_state_rejected``,
    ``malformed_response``, ``unsupported_input_request``, ``protocol_unsupported``, ``auth_failed``,
    ``http_4xx``, ``redirect_not_followed``, ``unknown_tool``, ``header_mismatch``, ``session_expired``,
    ``unexpected_error``); `message` is for a human and
    carries no secret; `rpc_code` is the JSON-RPC error code when the server sent one;
    `retry_after` is the server's Retry-After in seconds, when given. `may_have_run` is true when a
    ``tools/call`` left the hub (its request headers were written) and then failed in any way that does not
    prove the server refused it before running it (`client.REFUSALS`): a time-out, a lost connection or
    stream, a 5xx, an answer lost or unreadable after the server accepted the request. The server may have
    run the tool, so sending it again is safe only for a tool that may be repeated. `message` is always
    storable (`storable_text`), whatever the server put in its own error text, and at most
    `MAX_ERROR_MESSAGE` characters long.
    """

    transient = False

    def __init__(
        self,
        code: str,
        message: str,
        *,
        rpc_code: int | None = None,
        retry_after: float | None = None,
        may_have_run: bool = False,
    ) -> None:
        message = storable_text(message)
        if len(message) > MAX_ERROR_MESSAGE:
            message = message[:MAX_ERROR_MESSAGE] + "..."
        super().__init__(code, message)
        self.code = code
        self.message = message
        self.rpc_code = rpc_code
        self.retry_after = retry_after
        self.may_have_run = may_have_run

    def __str__(self) -> str:
        return f"{self.code}: {self.message}"

    def __repr__(self) -> str:
        extra = ""
        if self.rpc_code is not None:
            extra += f", rpc_code={self.rpc_code}"
        if self.retry_after is not None:
            extra += f", retry_after={self.retry_after}"
        if self.may_have_run:
            extra += ", may_have_run=True"
        return f"{type(self).__name__}({self.code!r}, {self.message!r}{extra})"

    def __reduce__(self) -> tuple[Any, ...]:
        # Keyword-only arguments do not survive the default exception pickling (Celery results).
        return (
            _rebuild_error,
            (type(self), self.code, self.message, self.rpc_code, self.retry_after, self.may_have_run),
        )


def _rebuild_error(
    cls: type[McpError],
    code: str,
    message: str,
    rpc_code: int | None,
    retry_after: float | None,
    may_have_run: bool = False,
) -> McpError:
    return cls(code, message, rpc_code=rpc_code, retry_after=retry_after, may_have_run=may_have_run)


class TransientError(McpError):
    """Connection failures, time-outs, HTTP 5xx and 429: retry later with backoff (unless `may_have_run`)."""

    transient = True


class PermanentError(McpError):
    """JSON-RPC errors, a rejected requestState, malformed answers, unsupported input requests: final."""
