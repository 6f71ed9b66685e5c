"""Serve the hub's HTTP requests under uvicorn: `python -m elicit_hub.serve_api [--host H] [--port P]`.

The same Django application Daphne serves (``elicit_hub.asgi``), HTTP only, with uvicorn's C parser
(httptools) and event loop (uvloop). Measured against Daphne per request, it spends 10-20 % less CPU, a
quarter to a third on a quieter machine (``docs/performance.md``, ninth pass): Twisted parses HTTP in
Python and Daphne adds a hand-off per request. Behind the reverse proxy, /api/ goes here and the
websockets (/ws/) stay on Daphne, the Channels project's server (README, "Running more than one
process"); `make run` starts one of each.

At the door, as ``elicit_hub.serve`` does for Daphne:
- a body over ELICIT_MAX_BODY is refused before it is stored (``elicit_hub.door.BodyLimit``);
- a request head (request line and headers) over ``MAX_HEAD`` bytes is answered 431 and the connection
  closed. httptools sets no limit of its own: it would collect an endless header in memory;
- a request head not complete within ELICIT_CLIENT_TIMEOUT seconds of the connection (or of the request's
  first byte, on a kept-alive one) is answered 408 and the connection closed; a connection that sent nothing
  is closed. uvicorn times out only the wait between two requests: a client that connected and sent nothing,
  or a head a byte at a time, held its connection (and a file descriptor) for ever. A body that stops coming
  is the door's to time out (``elicit_hub.door.BodyLimit``);
- these refusals, and the 400 for a request that is not HTTP, have the API's JSON shape under /api/ and are
  a short page elsewhere, like the application's own errors;
- Nagle's algorithm is off on every connection (uvloop and asyncio set TCP_NODELAY on TCP transports).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys

import uvicorn
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from elicit_hub import heap
from elicit_hub.door import answer, raw_response

MAX_HEAD = 64 * 1024  # bytes of request line and headers; nginx's default allows 32 KB, Twisted 16 KB a line


class HeadLimitedProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol, refusing a request head over ``MAX_HEAD`` bytes with 431.

    The bytes fed to the parser while a head is open are all head bytes (a head closes inside the feed that
    completes it), so the count is checked after each feed: memory stays within one read of the limit."""

    head_timeout: float | None = None  # seconds; None: ELICIT_CLIENT_TIMEOUT (also the gateway's, a subclass)
    _head_open = True
    _head_size = 0
    _head_deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_head_deadline()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_head_deadline()
        super().connection_lost(exc)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._head_open = True
        self._head_size = 0
        # The first request's head keeps the deadline its connection was given; a later one gets its own.
        if self._head_deadline is None:
            self._arm_head_deadline()

    def on_headers_complete(self) -> None:
        self._head_open = False
        self._disarm_head_deadline()
        super().on_headers_complete()

    def _arm_head_deadline(self) -> None:
        if self.head_timeout is None:
            from django.conf import settings

            self.head_timeout = float(settings.ELICIT_CLIENT_TIMEOUT)
        self._head_deadline = self.loop.call_later(self.head_timeout, self._head_too_slow)

    def _disarm_head_deadline(self) -> None:
        if self._head_deadline is not None:
            self._head_deadline.cancel()
            self._head_deadline = None

    def _head_too_slow(self) -> None:
        self._head_deadline = None
        if not self._head_open or self.transport.is_closing():
            return
        self._head_open = False
        if not self._head_size:
            self.transport.close()  # nothing was asked: nobody to answer
            return
        message = f"The request's line and headers did not arrive within {self.head_timeout:g} seconds."
        self._refuse(408, self._answer("request_timeout", "Too slow", message))

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if not self._head_open or self.transport.is_closing():
            return
        self._head_size += len(data)
        if self._head_size > MAX_HEAD:
            self._refuse_head()

    def _refuse_head(self) -> None:
        self._head_open = False
        message = f"The request's line and headers are larger than {MAX_HEAD} bytes, the most the hub reads."
        self._refuse(431, self._answer("head_too_large", "Too much to send", message))

    def send_400_response(self, msg: str) -> None:
        """uvicorn's answer to a request it cannot parse, in the hub's shapes (JSON under /api/)."""
        message = "The request is not valid HTTP/1.1."
        self._refuse(400, self._answer("bad_request", "Not understood", message))

    def _answer(self, code: str, title: str, message: str) -> tuple[bytes, bytes]:
        """A refusal's content type and body, in the shape of the errors of the request's path."""
        return answer(self._path(), code, title, message)

    def _path(self) -> str:
        return getattr(self, "url", b"").decode("latin-1")  # set at a message's first byte

    def _refuse(self, status: int, content: tuple[bytes, bytes]) -> None:
        self.transport.write(raw_response(STATUS_LINE[status], *content))
        self.transport.close()


def config(host: str, port: int) -> uvicorn.Config:
    from django.conf import settings

    from elicit_hub.asgi import django_asgi_app
    from elicit_hub.door import BodyLimit

    return uvicorn.Config(
        BodyLimit(django_asgi_app, settings.ELICIT_MAX_BODY, settings.ELICIT_CLIENT_TIMEOUT),
        host=host,
        port=port,
        http=HeadLimitedProtocol,
        loop="uvloop",
        ws="none",  # websockets are Daphne's: an upgrade here is an ordinary (unknown) request
        lifespan="off",  # Django has no lifespan handlers
        proxy_headers=False,  # the hub reads X-Forwarded-For itself, by ELICIT_NUM_PROXIES
        server_header=False,
        access_log=False,  # the proxy's log is the place for paths
        timeout_graceful_shutdown=5,
        backlog=2048,
    )


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m elicit_hub.serve_api", description=__doc__.split("\n")[0]
    )
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "elicit_hub.settings")
    from approvals.management.commands._cli import port

    parser.add_argument("--host", default="127.0.0.1")
    # Checked: uvloop would listen on whatever 70000 wraps to, and say it listens on 70000.
    parser.add_argument("--port", type=port, default=8002)
    args = parser.parse_args(argv)
    server = uvicorn.Server(config(args.host, args.port))
    heap.settle(routes=True)  # the application is loaded: its code leaves the collector's way
    server.run()


if __name__ == "__main__":
    main(sys.argv[1:])
