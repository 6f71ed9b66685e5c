"""The one guard on every URL the hub sends requests to: agent callbacks, MCP servers, team chat webhooks.

A URL passes when it is ``http``/``https`` without credentials and its host resolves only to public
addresses: loopback, link-local, private, shared, multicast, reserved and unspecified addresses are
refused, in IPv4, IPv6 and the IPv6 forms that carry an IPv4 address (mapped, 6to4, NAT64, Teredo; the
local-use NAT64 prefix ``64:ff9b:1::/48`` whole, as where its IPv4 address sits is the operator's choice).
Decimal, hex and octal host forms (``2130706433``, ``0x7f.1``) resolve to the address they stand for
and are judged by it. ``ELICIT_OUTBOUND_ALLOW`` lists the networks (``10.0.0.0/8``, ``::1``) and host
names (``deploy.internal``, or ``.internal`` for a whole domain) let through all the same.

`check_url` judges a URL when it is stored (a field error for the caller to show); `client` /
`async_transport` judge it again just before each request and connect to the address that was checked,
so a name that resolves elsewhere later (DNS rebinding) cannot move a request. Redirects are never
followed here.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import ipaddress
import os
import socket
import time
from collections.abc import AsyncIterator, Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

import httpcore
import httpx
import httpx2
import idna

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network
Resolver = Callable[[str, int], list[str]]

SCHEMES = ("http", "https")
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
# IPv6 networks that are not public though Python's tables may call them global: the local-use NAT64 prefix
# (RFC 8215), where the IPv4 address inside sits wherever the operator's prefix length puts it (a /48 takes
# it from the middle: 64:ff9b:1:a00:7:0:808:808 is 10.0.0.7 to such a translator, not 8.8.8.8), so it cannot
# be judged; and the documentation range (RFC 9637), never routed, as 2001:db8::/32.
_NOT_PUBLIC_V6 = (
    (ipaddress.ip_network("64:ff9b:1::/48"), "a local-use NAT64 address"),
    (ipaddress.ip_network("3fff::/20"), "a documentation address"),
)
_SHARED = ipaddress.ip_network("100.64.0.0/10")


class Refused(ValueError):
    """The URL may not be used. `message` is safe to show (it never repeats credentials or the path);
    `transient` is true when only the name lookup failed, which may succeed later."""

    def __init__(self, message: str, *, transient: bool = False, reason: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.transient = transient
        self.reason = reason or message  # what is wrong with the address, without what the hub does about it


@dataclass(frozen=True)
class Allow:
    """What ``ELICIT_OUTBOUND_ALLOW`` lets through besides public addresses."""

    networks: tuple[Network, ...] = ()
    hosts: frozenset[str] = frozenset()

    @classmethod
    def parse(cls, spec: str | Iterable[str]) -> Allow:
        items = spec.split(",") if isinstance(spec, str) else spec
        networks: list[Network] = []
        hosts: set[str] = set()
        for raw in (item.strip() for item in items):
            if not raw:
                continue
            try:
                networks.append(ipaddress.ip_network(raw.strip("[]"), strict=False))
            except ValueError:
                hosts.add(raw.lower().rstrip("."))
        return cls(tuple(networks), frozenset(hosts))

    def host(self, host: str) -> bool:
        host = host.lower().rstrip(".")
        return host in self.hosts or any(
            entry.startswith(".") and (host.endswith(entry) or host == entry[1:]) for entry in self.hosts
        )

    def address(self, ip: Address) -> bool:
        return any(ip.version == net.version and ip in net for net in self.networks)


@functools.lru_cache(maxsize=8)
def _parsed(spec: str) -> Allow:
    return Allow.parse(spec)


def configured() -> Allow:
    """The allowlist from the settings (``ELICIT_OUTBOUND_ALLOW``), or the environment outside Django."""
    from django.conf import settings

    if settings.configured:
        return _parsed(settings.ELICIT_OUTBOUND_ALLOW)
    return _parsed(os.environ.get("ELICIT_OUTBOUND_ALLOW", ""))


def system_resolver(host: str, port: int) -> list[str]:
    """Every address `host` resolves to, as the operating system resolves it (numeric forms included)."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


# Tests swap this for a stub to give names addresses; everything else uses the system's resolver.
resolver: Resolver = system_resolver


def _embedded(ip: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    if ip.sixtofour is not None:
        return ip.sixtofour
    if ip in _NAT64:
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    return None


def address_problem(ip: Address) -> str | None:
    """Why a request may not go to `ip` (ignoring the allowlist), or None for a public address."""
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.teredo is not None:
            return "a Teredo address"
        for net, reason in _NOT_PUBLIC_V6:
            if ip in net:
                return reason
        inner = _embedded(ip)
        if inner is not None:  # the packets end up at the IPv4 address inside
            return address_problem(inner)
        if ip.is_site_local:
            return "a site-local address"
    checks = (
        (ip.is_unspecified, "an unspecified address"),
        (ip.is_loopback, "a loopback address"),
        (ip.is_link_local, "a link-local address"),
        (ip.is_multicast, "a multicast address"),
        (isinstance(ip, ipaddress.IPv4Address) and ip in _SHARED, "a shared (carrier-grade NAT) address"),
        (ip.is_private, "a private address"),
        (ip.is_reserved, "a reserved address"),
        (not ip.is_global, "not a public address"),
    )
    return next((reason for failed, reason in checks if failed), None)


def _allowed(ip: Address, allow: Allow) -> bool:
    if allow.address(ip):
        return True
    inner = _embedded(ip) if isinstance(ip, ipaddress.IPv6Address) else None
    return inner is not None and allow.address(inner)


@dataclass(frozen=True)
class Checked:
    """A URL that passed, with the addresses its host resolved to (the ones a request may use)."""

    url: str
    scheme: str
    host: str  # as it appears in the URL (IDNA-encoded), without brackets
    port: int
    addresses: tuple[str, ...]


def check_url(
    url: str,
    *,
    allow: Allow | None = None,
    resolve: Resolver | None = None,
    schemes: Iterable[str] = SCHEMES,
    lookup_timeout: float | None = None,
) -> Checked:
    """Judge `url`; raise `Refused` with a message fit for a field error, or return what was checked.

    With `lookup_timeout`, the name's lookup waits that many seconds at most (on this process's resolver
    threads; one that never ends is left to finish there): the system's resolver, with a name server that
    does not answer, takes as long as its own retries (tens of seconds), which a request's timeout did not
    cover. Not from a resolver thread itself (`acheck_url`), which would wait on its own pool."""
    allow = configured() if allow is None else allow
    try:
        parsed = httpx.URL(url)
    except (httpx.InvalidURL, TypeError, ValueError):
        raise Refused("not a valid URL") from None
    schemes = tuple(schemes)
    if parsed.scheme not in schemes:
        raise Refused(f"must be an {' or '.join(schemes)} URL")
    if parsed.userinfo:
        raise Refused("must not carry a user name or password")
    host = parsed.raw_host.decode("ascii").strip("[]")
    if not host:
        raise Refused("has no host")
    if parsed.port is not None and not 1 <= parsed.port <= 65535:
        # The parser takes any integer (0, -1, 99999999999999999999): looked up, the last overflows the
        # resolver, and 0 would have been judged as the scheme's port.
        raise Refused("has a port outside 1-65535")
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    try:
        literal: Address | None = ipaddress.ip_address(host)
    except ValueError:
        literal = None
    if literal is not None:
        addresses = [str(literal)]
    else:
        try:
            addresses = _lookup(resolve or resolver, host, port, lookup_timeout)
        except (OSError, UnicodeError):
            raise Refused(f"the host {host} does not resolve", transient=True) from None
        if not addresses:
            raise Refused(f"the host {host} does not resolve", transient=True)
    if literal is None and allow.host(host):
        return Checked(url, parsed.scheme, host, port, tuple(addresses))
    for raw in addresses:
        ip = ipaddress.ip_address(raw.split("%", 1)[0])
        if _allowed(ip, allow):
            continue
        problem = address_problem(ip)
        if problem:
            shown = host if literal is not None else f"{host} ({ip})"
            reason = f"the host {shown} is {problem}"
            raise Refused(f"{reason}; the hub does not send requests there", reason=reason)
    return Checked(url, parsed.scheme, host, port, tuple(addresses))


def _lookup(resolve: Resolver, host: str, port: int, timeout: float | None) -> list[str]:
    if timeout is None:
        return resolve(host, port)
    lookup = _resolver_threads().submit(resolve, host, port)
    try:
        return lookup.result(timeout=timeout)
    except TimeoutError:
        lookup.cancel()  # still queued behind lookups that hang: never started
        raise Refused(f"the host {host} did not resolve in time", transient=True) from None


def _numeric_only(host: str, port: int) -> list[str]:
    """The addresses a host stands for without a lookup: an address in any numeric form, or a ``localhost``
    name (always the loopback, RFC 6761); a name that needs DNS raises ``OSError``. A trailing dot changes
    neither (``127.0.0.1.`` and ``localhost.`` are where a browser goes for them)."""
    host = host.rstrip(".")
    if host == "localhost" or host.endswith(".localhost"):
        return ["127.0.0.1", "::1"]
    flags = socket.AI_NUMERICHOST
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP, flags=flags)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


# Dropped by a browser from a link: around it, C0 controls and spaces; anywhere in it, tabs and line breaks.
_AROUND = "".join(map(chr, range(0x21)))
_ANYWHERE = str.maketrans("", "", "\t\n\r")


def browser_url(url: str) -> str:
    """`url` as a browser reads an http(s) link (the WHATWG URL standard), written so that any parser finds
    the host the browser goes to: tabs and line breaks dropped, a backslash read as a slash (it ends the
    host), and the host percent-decoded and mapped as IDNA's UTS 46 maps it (full-width characters,
    ideographic full stops, capitals). Other URLs come back as they are."""
    url = url.strip(_AROUND).translate(_ANYWHERE)
    scheme, colon, rest = url.partition(":")
    if not colon or scheme.lower() not in SCHEMES:
        return url
    rest = rest.replace("\\", "/")
    if not rest.startswith("//"):
        return f"{scheme}:{rest}"  # no host for the URL parser (a browser would take one: refused either way)
    rest = rest[2:]
    end = min((i for i in map(rest.find, "/?#") if i >= 0), default=len(rest))
    userinfo, at, hostport = rest[:end].rpartition("@")
    if hostport.startswith("["):
        return f"{scheme}://{rest}"
    host, colon, port = hostport.partition(":")
    # A host a browser cannot read either is left as it is, for the URL parser to refuse.
    with contextlib.suppress(idna.IDNAError, UnicodeError, ValueError):
        host = idna.uts46_remap(unquote(host), std3_rules=False, transitional=False)
    return f"{scheme}://{userinfo}{at}{host}{colon}{port}{rest[end:]}"


def private_link(url: str, *, allow: Allow | None = None) -> str:
    """Why a link the hub would send a reviewer's browser to points into a private network, or "": the same
    rule and allowlist as the hub's own requests, judged without a lookup (the browser resolves names for
    itself, elsewhere), so only addresses written as numbers and ``localhost`` names are caught. The host
    judged is the one the browser goes to (`browser_url`): ``http://127.0.0.1./``,
    ``http://%31%32%37.0.0.1/`` and ``http://127.0.0.1\\.example.com/`` are all the loopback to it."""
    try:
        check_url(browser_url(url), allow=allow, resolve=_numeric_only)
    except Refused as refused:
        return "" if refused.transient else refused.reason
    return ""


def _pinned(checked: Checked, request: Any) -> Any:
    """`request` (an ``httpx`` or ``httpx2`` request) sent to the checked address, verifying TLS for its
    host name."""
    url = request.url
    host = url.raw_host.decode("ascii").strip("[]")
    port = url.port or (443 if url.scheme == "https" else 80)
    if (url.scheme, host, port) != (checked.scheme, checked.host, checked.port):
        raise Refused(f"a request left the checked origin for {host}")
    # One address, so the connection goes where the check looked; IPv4 first, as most hosts reach it.
    address = min(checked.addresses, key=lambda a: ":" in a)
    extensions = dict(request.extensions)
    if address != host:
        extensions["sni_hostname"] = host
    return type(request)(
        request.method,
        url.copy_with(host=address),
        headers=request.headers,
        stream=request.stream,
        extensions=extensions,
    )


class GuardedTransport(httpx.BaseTransport):
    """Sends each request to the address its host was checked at, just before sending (sync httpx)."""

    def __init__(
        self, *, allow: Allow | None = None, lookup_timeout: float | None = None, **options: Any
    ) -> None:
        self._allow = allow
        self._lookup_timeout = lookup_timeout
        self._inner = httpx.HTTPTransport(trust_env=False, **options)

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        try:
            checked = check_url(str(request.url), allow=self._allow, lookup_timeout=self._lookup_timeout)
            pinned = _pinned(checked, request)
        except Refused as exc:
            raise OutboundRefused(exc.message, transient=exc.transient, request=request) from None
        return self._inner.handle_request(pinned)

    def close(self) -> None:
        self._inner.close()


class OutboundRefused(httpx.TransportError):
    """The guard refused a request as it was about to be sent."""

    def __init__(self, message: str, *, transient: bool = False, request: httpx.Request | None = None):
        super().__init__(message, request=request)
        self.transient = transient


_RESOLVERS: tuple[int, ThreadPoolExecutor] | None = None
RESOLVER_THREADS = 8


def _resolver_threads() -> ThreadPoolExecutor:
    """This process's threads for the guard's checks (made again in a forked child: threads do not fork)."""
    global _RESOLVERS
    if _RESOLVERS is None or _RESOLVERS[0] != os.getpid():
        _RESOLVERS = (os.getpid(), ThreadPoolExecutor(RESOLVER_THREADS, thread_name_prefix="netguard"))
    return _RESOLVERS[1]


async def acheck_url(url: str, *, allow: Allow | None = None) -> Checked:
    """`check_url` off the event loop (its DNS lookup blocks), on this process's resolver threads.

    Not ``anyio.to_thread``: its worker threads belong to one event loop, and a Celery task runs each send
    in an event loop of its own, so every send started (and at its end stopped) a thread. These threads
    outlive the loops. A cancelled wait leaves the lookup to finish on its thread; its answer is dropped.
    """
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(_resolver_threads(), functools.partial(check_url, url, allow=allow))


class AsyncGuardedTransport(httpx2.AsyncBaseTransport):
    """The same guard for the MCP client's ``httpx2.AsyncClient``: every request pinned to a checked address.

    A URL is checked (and its host resolved) once per transport, at its first request or beforehand by the
    caller (`checked`); the transport's later requests to it go to the address that check found. One
    transport serves one exchange with a server (an MCP send: a discovery, the call, in the handshake era
    an ``initialize``, its notification and the answers to the server's questions), so the address stays
    the one judged, whatever the name resolves to meanwhile, and a send resolves its server's name once
    instead of once per request.
    """

    def __init__(self, *, allow: Allow | None = None, checked: Checked | None = None, **options: Any) -> None:
        self._allow = allow
        # Keyed by the URL as a request carries it (normalised: `Deploy.Example.com` is `deploy.example.com`).
        self._checked: dict[str, Checked] = {} if checked is None else {str(httpx2.URL(checked.url)): checked}
        self._inner = httpx2.AsyncHTTPTransport(trust_env=False, **options)

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        url = str(request.url)
        allow = self._allow if self._allow is not None else configured()
        try:
            checked = self._checked.get(url)
            if checked is None:
                checked = self._checked[url] = await acheck_url(url, allow=allow)
            pinned = _pinned(checked, request)
        except Refused as exc:
            raise AsyncOutboundRefused(exc.message, request=request) from None
        response = await self._inner.handle_async_request(pinned)
        if not response.headers.get("content-type", "").startswith("text/event-stream"):
            # An SSE stream is bounded per event by the SDK; any other answer is bounded as a whole.
            response.stream = _Bounded(response.stream, max_response(), request)
        return response

    async def aclose(self) -> None:
        await self._inner.aclose()


class AsyncOutboundRefused(httpx2.TransportError):
    """The guard refused one of the MCP client's requests as it was about to be sent."""


RESPONSE_TOO_LARGE = "the response is larger than the hub reads"
DEFAULT_MAX_RESPONSE = 16 * 1024 * 1024


def max_response() -> int:
    """``ELICIT_MAX_MCP_RESPONSE`` from the settings, or the default outside Django."""
    from django.conf import settings

    if settings.configured:
        return int(settings.ELICIT_MAX_MCP_RESPONSE)
    return DEFAULT_MAX_RESPONSE


class ResponseTooLarge(httpx2.StreamError):
    """An MCP server's answer went past ``ELICIT_MAX_MCP_RESPONSE`` bytes; the read stopped there."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"{RESPONSE_TOO_LARGE} ({limit} bytes, ELICIT_MAX_MCP_RESPONSE)")
        self.limit = limit


class _Bounded(httpx2.AsyncByteStream):
    """A response body that stops with `ResponseTooLarge` once more than `limit` bytes have arrived."""

    def __init__(self, inner: Any, limit: int, request: httpx2.Request) -> None:
        self._inner, self._limit, self._request = inner, limit, request

    async def __aiter__(self) -> AsyncIterator[bytes]:
        seen = 0
        async for chunk in self._inner:
            seen += len(chunk)
            if seen > self._limit:
                await self.aclose()
                raise ResponseTooLarge(self._limit)
            yield chunk

    async def aclose(self) -> None:
        await self._inner.aclose()


def client(*, timeout: float, allow: Allow | None = None) -> httpx.Client:
    """A sync client for one outbound exchange: guarded, pinned, no redirects, no proxies from the env; the
    host's lookup, like the connection, waits `timeout` seconds at most."""
    return httpx.Client(
        transport=GuardedTransport(allow=allow, lookup_timeout=timeout),
        timeout=timeout,
        follow_redirects=False,
        trust_env=False,
    )


# Bytes of a receiver's answer to `post` read at most. Its callers (agents' webhooks, teams' chat webhooks:
# URLs that outsiders name) want the status alone; reading a short answer to its end spares a well-behaved
# receiver a reset connection.
MAX_REPLY = 64 * 1024


def post(url: str, *, timeout: float, **kwargs: Any) -> httpx.Response:
    """POST to `url` through the guard; raises `OutboundRefused` (an ``httpx.TransportError``) if refused.

    Making the connection (and its TLS handshake) takes `timeout` seconds at most, and every read and write
    on it ends by `timeout` seconds after the call: httpx bounds each read alone, so a receiver trickling
    the head of its answer a byte at a time would hold the worker as long as it liked; here it times out
    (``httpx.ReadTimeout``). The answer's status and headers come back; its body is read as sent (never
    decompressed) up to `MAX_REPLY` bytes, until that deadline or until it breaks off, dropped, and the
    connection closed, so a receiver answering with an endless or trickling body holds neither the worker nor
    its memory, and one whose body is cut short is judged by its status alone. The body is not kept:
    ``.content`` raises ``ResponseNotRead``.
    """
    deadline = time.monotonic() + timeout
    extensions = {**kwargs.pop("extensions", {}), "trace": _deadline_trace(deadline)}
    with (
        client(timeout=timeout) as http,
        http.stream("POST", url, extensions=extensions, **kwargs) as response,
    ):
        read = 0
        try:
            for chunk in response.iter_raw():
                read += len(chunk)
                if read >= MAX_REPLY:
                    break
        except httpx.TransportError:
            # The status is in, and it is the answer: a body still coming at the deadline is left, and one cut
            # short (a reset, a length or chunk that does not add up) is no reason to send the request again.
            pass
    return response


def _deadline_trace(deadline: float) -> Callable[[str, dict[str, Any]], None]:
    """An httpcore ``trace`` extension that bounds each read and write on the request's connection (once
    made, and again once TLS wraps it) by `deadline` (``time.monotonic()``): httpx bounds each alone."""

    def trace(event: str, info: dict[str, Any]) -> None:
        if event in ("connection.connect_tcp.complete", "connection.start_tls.complete"):
            _bound(info["return_value"], deadline)

    return trace


def _bound(stream: Any, deadline: float) -> None:
    read, write = stream.read, stream.write

    def left(timeout: float | None, late: type[Exception]) -> float:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise late("the receiver did not answer in time")
        return remaining if timeout is None else min(timeout, remaining)

    def bounded_read(max_bytes: int, timeout: float | None = None) -> bytes:
        return read(max_bytes, left(timeout, httpcore.ReadTimeout))

    def bounded_write(buffer: bytes, timeout: float | None = None) -> None:
        write(buffer, left(timeout, httpcore.WriteTimeout))

    stream.read, stream.write = bounded_read, bounded_write
