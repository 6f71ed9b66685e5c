"""Probing an MCP server: which protocol era it speaks, who it is, which tools it offers, how fast it answers.

Pure (no Django). `probe` never raises for a server that cannot be reached or understood: it returns a
`ProbeResult` with ``ok`` false, the error and a hint for the admin. Under era ``auto`` it tries
2026-07-28 (``server/discover``) first and falls back to the ``initialize`` handshake; ``2026-07-28``
and ``handshake`` try only that era (and look at the other one only to say what to change).

The target is a `ServerConfig` (Streamable HTTP, through the outbound guard) or a factory returning a
fresh SDK transport for each connection (a stdio server's, say), so the probe does not care how bytes
reach the server.
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

import anyio
import httpx2
import mcp_types
from mcp import Client
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS, MODERN_PROTOCOL_VERSIONS

from approvals import netguard, safejson
from approvals.mcp_client.client import (
    CLIENT_INFO,
    _check_url,
    _classify,
    _guarded_http,
    _leaves,
    _list_all,
    _refuse_elicitation,
    _secrets,
    discover_on,
)
from approvals.mcp_client.outcomes import McpError, PermanentError, ServerConfig, TransientError
from approvals.mcp_client.session import list_tools_on
from approvals.mcp_client.toollist import ToolList, bounded
from approvals.mcp_client.transport import TeeTransport, Wire, http_stream
from approvals.mcp_client.wire import MAX_DEPTH, PROTOCOL_VERSION, handshake_hint

T = TypeVar("T")

AUTO = "auto"
MODERN = PROTOCOL_VERSION
HANDSHAKE = "handshake"
# Listing the tools on a session that is already open (the caller bounds the whole probe as well).
OPEN_LIST_TIMEOUT = 60.0
Era = Literal["auto", "2026-07-28", "handshake"]

# A fresh SDK transport (an async context manager yielding the read and write streams) per connection.
TransportFactory = Callable[[], Any]
Target = ServerConfig | TransportFactory

MODERN_ONLY_HINT = (
    f"this server speaks only MCP {PROTOCOL_VERSION}; set its era to {PROTOCOL_VERSION} or auto"
)
HINTS = {
    "connect_failed": "the server is unreachable: check its URL and that it is running",
    "timeout": "the server did not answer in time: check that it is running and not overloaded",
    "network_error": "the connection failed: check the URL and any proxy between the hub and the server",
    "auth_failed": "the server refused the hub's credentials: set the right headers for this server",
    "url_refused": "the outbound guard refuses this address (ELICIT_OUTBOUND_ALLOW lists exceptions)",
    "invalid_url": "the server URL cannot be used: check it",
    "invalid_headers": "set this server's credentials again (printable ASCII only)",
    "redirect_not_followed": (
        "the hub follows no redirect: if the address the server redirects to is the intended server, "
        "register that address"
    ),
    "http_5xx": "the server failed: look at its logs",
    "rate_limited": "the server is rate limiting the hub: try again later",
    "protocol_unsupported": (
        f"the server and the hub share no protocol version (the hub speaks {PROTOCOL_VERSION} and the "
        f"handshake era, {', '.join(HANDSHAKE_PROTOCOL_VERSIONS)})"
    ),
}
MAX_TEXT = 200  # a server's name, title or version
MAX_CAPABILITIES = 20_000  # bytes of capabilities JSON kept in full; beyond, only their names
MAX_DISCOVER = 100_000  # bytes of server/discover result stored for later calls
DEFAULT_HINT = "the server answered in a way the hub does not understand: check that it is an MCP server"


@dataclass(frozen=True)
class ProbeResult:
    """What one probe found. `as_json()` is what the hub stores in ``McpServer.probe``.

    `tools` (the tools as received, as many as the hub keeps: `toollist`) and `discover` (the
    ``server/discover`` result, for 2026-07-28 servers) are stored on their own, not in the probe JSON.
    `tools_truncated`: the server listed more tools than the hub keeps (the probe JSON says so only then).
    `tools_duplicates`: how many tools were left out because a tool of the same name was listed before them
    (the first definition of a name is the one kept), `tools_duplicated` the first of those names; the probe
    JSON says so, as ``tools_duplicated`` (the count) and ``tools_duplicated_names``, only when there were.
    """

    ok: bool
    era: str | None
    protocol_version: str | None
    server_info: dict[str, Any] | None
    capabilities: dict[str, Any]
    tool_count: int | None
    latency_ms: int | None
    error: dict[str, str] | None
    hint: str | None
    probed_at: str
    tools: list[dict[str, Any]] | None = field(default=None, repr=False)
    discover: dict[str, Any] | None = field(default=None, repr=False)
    tools_truncated: bool = False
    tools_duplicates: int = 0
    tools_duplicated: tuple[str, ...] = ()

    @property
    def reachable(self) -> bool:
        """The server answered something (even if the hub cannot use it as configured)."""
        return self.ok or self.era is not None or (self.error or {}).get("code") not in UNREACHABLE

    def as_json(self) -> dict[str, Any]:
        found: dict[str, Any] = {
            "ok": self.ok,
            "era": self.era,
            "protocol_version": self.protocol_version,
            "server_info": self.server_info,
            "capabilities": self.capabilities,
            "tool_count": self.tool_count,
            "latency_ms": self.latency_ms,
            "error": self.error,
            "hint": self.hint,
            "probed_at": self.probed_at,
        }
        if self.tools_truncated:
            found["tools_truncated"] = True
        if self.tools_duplicates:
            found["tools_duplicated"] = self.tools_duplicates
            found["tools_duplicated_names"] = list(self.tools_duplicated)
        return found


UNREACHABLE = {"connect_failed", "timeout", "network_error", "url_refused", "invalid_url"}


@dataclass
class _Found:
    era: str
    protocol_version: str | None
    server_info: dict[str, Any] | None
    capabilities: dict[str, Any]
    latency_ms: int
    tools: list[dict[str, Any]]
    discover: dict[str, Any] | None = None


def _dump(model: Any) -> dict[str, Any] | None:
    if model is None:
        return None
    dumped: dict[str, Any] = model.model_dump(by_alias=True, mode="json", exclude_none=True)
    return dumped


async def _connect(
    target: Target,
    mode: str,
    op: Callable[[Client, Wire], Awaitable[T]],
    *,
    what: str,
    timeout: float,
    prior: mcp_types.DiscoverResult | None = None,
) -> tuple[T, int]:
    """Open a client on `target` in `mode`, run `op`; (its value, the connect time in ms).

    Every failure becomes an `McpError` named after `what` (the method that failed)."""
    wire = Wire(None)
    secret: list[str] = []
    http: httpx2.AsyncClient | None = None
    failure: BaseException | None = None
    value: Any = None
    elapsed = 0
    started = time.monotonic()
    try:
        if isinstance(target, ServerConfig):
            secret = _secrets(target)
            checked = await _check_url(target.url)
            http = _http_client(target, wire, checked)
            transport = TeeTransport(http_stream(target.url, http), wire)
        else:
            transport = TeeTransport(target(), wire)
        with anyio.fail_after(timeout * 4):
            client = Client(
                transport,
                mode=mode,
                prior_discover=prior,
                client_info=CLIENT_INFO,
                elicitation_callback=_refuse_elicitation,
                read_timeout_seconds=timeout,
                cache=None,
            )
            if http is not None:
                await http.__aenter__()
            try:
                async with client:
                    elapsed = round((time.monotonic() - started) * 1000)
                    try:
                        value = await op(client, wire)
                    except Exception as exc:  # classified below, outside the SDK's task groups
                        failure = exc
            finally:
                if http is not None:
                    await http.aclose()
    except Exception as exc:
        raise _classify(exc, wire, what, secret) from None
    except BaseExceptionGroup as group:
        cancelled = anyio.get_cancelled_exc_class()
        if all(isinstance(leaf, cancelled) for leaf in _leaves(group)):
            raise
        raise _classify(group, wire, what, secret) from None
    if failure is not None:
        raise _classify(failure, wire, what, secret) from None
    return value, elapsed


def _http_client(target: ServerConfig, wire: Wire, checked: netguard.Checked) -> httpx2.AsyncClient:
    """The guarded HTTP client for `target`; headers HTTP cannot carry (stored before they were checked)
    are an error for the admin, never named by their value."""
    return _guarded_http(target, wire, httpx2.Timeout(target.timeout), checked)


async def _modern(target: Target, timeout: float) -> _Found:
    """``server/discover``, then ``tools/list`` (its pages: `toollist`) on the same client."""
    timings: dict[str, int] = {}

    async def op(client: Client, wire: Wire) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        started = time.monotonic()
        discover = await discover_on(client, wire)
        timings["discover"] = round((time.monotonic() - started) * 1000)
        client.session.adopt(mcp_types.DiscoverResult.model_validate(discover, by_name=False))
        wire.method = "tools/list"
        tools, _ = await _list_all(client, wire)
        return discover, tools

    (discover, tools), _ = await _connect(target, MODERN, op, what="server/discover", timeout=timeout)
    supported = discover.get("supportedVersions") or []
    versions = [v for v in MODERN_PROTOCOL_VERSIONS if v in supported]
    info = (discover.get("_meta") or {}).get("io.modelcontextprotocol/serverInfo")
    return _Found(
        era=MODERN,
        protocol_version=versions[-1] if versions else PROTOCOL_VERSION,
        server_info=info if isinstance(info, dict) else None,
        capabilities=dict(discover.get("capabilities") or {}),
        latency_ms=timings.get("discover", 0),
        tools=tools,
        discover=discover,
    )


async def _handshake(target: Target, timeout: float) -> _Found:
    """``initialize`` (the SDK's legacy mode), then ``tools/list`` (its pages: `toollist`) on the same
    session."""
    found: dict[str, Any] = {}

    async def op(client: Client, wire: Wire) -> list[dict[str, Any]]:
        found["protocol_version"] = client.protocol_version
        found["server_info"] = _dump(client.server_info)
        found["capabilities"] = _dump(client.server_capabilities) or {}
        wire.method = "tools/list"
        tools, _ = await _list_all(client, wire)
        return tools

    tools, latency = await _connect(target, "legacy", op, what="initialize", timeout=timeout)
    version = found.get("protocol_version")
    if version not in HANDSHAKE_PROTOCOL_VERSIONS:
        raise PermanentError(
            "protocol_unsupported",
            f"the server answered initialize with an unknown protocol version {str(version)[:40]!r}",
        )
    return _Found(
        era=HANDSHAKE,
        protocol_version=version,
        server_info=found.get("server_info"),
        capabilities=found.get("capabilities") or {},
        latency_ms=latency,
        tools=tools,
    )


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat()


def _identity(info: dict[str, Any] | None) -> dict[str, Any] | None:
    """The server's name and version (and title), as short storable strings."""
    if not isinstance(info, dict):
        return None
    kept = {
        key: value[:MAX_TEXT]
        for key in ("name", "title", "version")
        if isinstance(value := info.get(key), str) and safejson.text_problem(value) is None
    }
    return kept or None


def _bounded(value: dict[str, Any], limit: int) -> dict[str, Any]:
    """`value` if it is storable and small; else only its top-level keys (capability names)."""
    if safejson.problem(value, max_depth=MAX_DEPTH) is None and safejson.size(value) <= limit:
        return value
    return {str(key)[:MAX_TEXT]: {} for key in list(value)[:50] if safejson.text_problem(str(key)) is None}


def _success(
    found: _Found, *, ok: bool = True, error: McpError | None = None, hint: str | None = None
) -> ProbeResult:
    tools = bounded(found.tools)  # listed under the rule already; a list from elsewhere is checked here
    discover = found.discover
    if discover is not None and (
        safejson.problem(discover, max_depth=MAX_DEPTH) is not None or safejson.size(discover) > MAX_DISCOVER
    ):
        discover = None  # the client synthesizes one instead
    return ProbeResult(
        ok=ok,
        era=found.era,
        protocol_version=found.protocol_version,
        server_info=_identity(found.server_info),
        capabilities=_bounded(found.capabilities, MAX_CAPABILITIES),
        tool_count=len(tools),
        latency_ms=found.latency_ms,
        error={"code": error.code, "message": error.message} if error else None,
        hint=hint,
        probed_at=_now(),
        tools=tools,
        discover=discover,
        tools_truncated=tools.truncated,
        tools_duplicates=tools.duplicates,
        tools_duplicated=tuple(tools.duplicated),
    )


def _failure(error: McpError, hint: str | None = None, latency_ms: int | None = None) -> ProbeResult:
    return ProbeResult(
        ok=False,
        era=None,
        protocol_version=None,
        server_info=None,
        capabilities={},
        tool_count=None,
        latency_ms=latency_ms,
        error={"code": error.code, "message": error.message},
        hint=hint or HINTS.get(error.code, DEFAULT_HINT),
        probed_at=_now(),
    )


def _era_verdict(exc: McpError) -> bool:
    """True when the failure says the server does not speak the era tried (not that it is unreachable)."""
    return not exc.transient and exc.code in (
        "protocol_unsupported",
        "rpc_error",
        "http_4xx",
        "malformed_response",
    )


async def probe(target: Target, *, era: str = AUTO, timeout: float | None = None) -> ProbeResult:
    """Probe the server at `target` for `era` (``auto``, ``2026-07-28`` or ``handshake``). Never raises an
    `McpError`: an unreachable or incompatible server gives ``ok`` false with the error and a hint."""
    if era not in (AUTO, MODERN, HANDSHAKE):
        raise ValueError(f"unknown era {era!r}")
    limit = timeout if timeout is not None else (target.timeout if isinstance(target, ServerConfig) else 30.0)
    modern_error: McpError | None = None
    if era != HANDSHAKE:
        try:
            return _success(await _modern(target, limit))
        except McpError as exc:
            if not _era_verdict(exc):
                return _failure(exc)
            modern_error = exc
    try:
        found = await _handshake(target, limit)
    except McpError as exc:
        if era == HANDSHAKE and _era_verdict(exc):
            # Does it speak 2026-07-28 instead? Only to tell the admin what to change.
            try:
                modern = await _modern(target, limit)
            except McpError:
                return _failure(exc)
            return _success(modern, ok=False, error=exc, hint=MODERN_ONLY_HINT)
        # Pinned to 2026-07-28, what failed there is what matters; the handshake was only a diagnosis.
        return _failure(modern_error if era == MODERN and modern_error is not None else exc)
    if era == MODERN:
        # The server answers only the handshake: calls pinned to 2026-07-28 cannot work.
        assert modern_error is not None
        error = PermanentError(
            "protocol_unsupported",
            f"this server does not speak MCP {PROTOCOL_VERSION}; "
            f"it speaks the handshake era ({found.protocol_version})",
        )
        return _success(found, ok=False, error=error, hint=handshake_hint(found.protocol_version))
    return _success(found)


async def probe_open(
    client: Client,
    *,
    latency_ms: int | None = None,
    secrets: Sequence[str] = (),
    timeout: float = OPEN_LIST_TIMEOUT,
) -> ProbeResult:
    """Describe the server behind an already open client (a stdio server's session, say): its era,
    version, identity and capabilities as negotiated, and the tools listed on it now (`toollist`). Never
    raises an `McpError`: a failed listing gives ``ok`` false, its message without `secrets` (the server's
    own credentials, which its errors may quote); a listing not done within `timeout` seconds (all its
    pages) gives ``ok`` false with the error ``timeout``, so a caller bounding the probe should give it a
    `timeout` within its own bound (the probe then says why nothing was listed)."""
    version = client.protocol_version
    era = HANDSHAKE if version in HANDSHAKE_PROTOCOL_VERSIONS else MODERN
    discover = client.session.discover_result
    wire = Wire(None)
    try:
        tools = await _list_open(client, wire, secrets, timeout)
    except McpError as exc:
        return _failure(exc)
    found = _Found(
        era=era,
        protocol_version=version,
        server_info=_dump(client.server_info),
        capabilities=_dump(client.server_capabilities) or {},
        latency_ms=latency_ms or 0,
        tools=tools,
        discover=_dump(discover) if era == MODERN else None,
    )
    return _success(found)


async def _list_open(client: Client, wire: Wire, secrets: Sequence[str], timeout: float) -> ToolList:
    """The tools listed on an open client (not wired through a `Wire`: the tools are read from the SDK's
    models)."""
    try:
        return await list_tools_on(client, timeout=timeout)
    except Exception as exc:
        raise _classify(exc, wire, "tools/list", list(secrets)) from None


__all__ = [
    "AUTO",
    "HANDSHAKE",
    "MODERN",
    "MODERN_ONLY_HINT",
    "ProbeResult",
    "TransientError",
    "probe",
    "probe_open",
]
