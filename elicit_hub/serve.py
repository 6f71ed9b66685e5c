"""Run Daphne as the hub needs it: `python -m elicit_hub.serve [daphne options]`.

- **TCP_NODELAY on every connection.** Daphne (Twisted) leaves Nagle's algorithm on, so on a kept-alive
  connection each response's small writes wait for the client's delayed ACK: about 40 ms per request, more
  than everything else the hub does (the benchmark showed it). Twisted exposes the option per connection,
  so it is set as each one is made.
- **Request bodies over ELICIT_MAX_BODY are refused as they arrive.** Twisted collects a whole body (in a
  temporary file past 100 KB) before Daphne hands the request to the application, so the hub's
  `BodyLimitMiddleware` only answered 413 once a client had sent, and the machine stored, all of it. Here a
  request whose ``Content-Length`` is over the limit is answered 413 as soon as its headers are in, and a
  chunked body as soon as it passes the limit: nothing more is read, and the connection is closed. The
  answer has the middleware's shapes: JSON ``body_too_large`` under /api/, a short page elsewhere.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import django
from daphne import http_protocol
from daphne.cli import CommandLineInterface

from elicit_hub import door, heap

_build_protocol = http_protocol.HTTPFactory.buildProtocol


def refusal(path: bytes, limit: int) -> bytes:
    """The whole 413 answer (status line, headers, body) for a request to `path`."""
    kind, body = door.refusal(path.decode("latin-1"), limit)
    return door.raw_response(b"HTTP/1.1 413 Content Too Large\r\n", kind, body)


class LimitedRequest(http_protocol.WebRequest):
    """Daphne's request, refusing a body over ``limit`` bytes before it is stored (see the module's notes)."""

    limit: int = 0  # set by main() from the settings; 0: no limit here (the middleware still applies)
    _refused = False
    _received = 0

    def gotLength(self, length: int | None) -> None:
        if self.limit and length is not None and length > self.limit:
            self._refuse()
            # Twisted answers "100 Continue" to an Expect header right after this: not to a refused body.
            self.requestHeaders.removeHeader(b"expect")
        super().gotLength(0 if self._refused else length)

    def handleContentChunk(self, data: bytes) -> None:
        if self._refused:
            return
        self._received += len(data)
        if self.limit and self._received > self.limit:
            self._refuse()
            return
        super().handleContentChunk(data)

    def process(self) -> Any:
        if self._refused:
            return None  # answered already; the application never sees this request
        return super().process()

    def _refuse(self) -> None:
        self._refused = True
        channel = self.channel
        channel.transport.write(refusal(getattr(channel, "_path", b""), self.limit))
        channel.loseConnection()


def _build_protocol_as_the_hub_needs(self: Any, addr: Any) -> Any:
    protocol = _build_protocol(self, addr)
    if protocol is None:
        return None
    protocol.requestFactory = LimitedRequest
    made = protocol.connectionMade

    def connection_made() -> None:
        made()
        if hasattr(protocol.transport, "setTcpNoDelay"):
            protocol.transport.setTcpNoDelay(True)

    protocol.connectionMade = connection_made
    return protocol


def main(argv: list[str]) -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "elicit_hub.settings")
    from django.conf import settings  # the settings the application (elicit_hub.asgi) loads next

    LimitedRequest.limit = settings.ELICIT_MAX_BODY
    django.setup(set_prefix=False)  # as the application does when Daphne loads it next
    heap.settle(routes=True)
    http_protocol.HTTPFactory.buildProtocol = _build_protocol_as_the_hub_needs
    CommandLineInterface().run(argv)


if __name__ == "__main__":
    main(sys.argv[1:])
