"""Run Daphne with TCP_NODELAY on every connection: `python -m elicit_hub.serve [daphne options]`.

Daphne (Twisted) leaves Nagle's algorithm on, so on a kept-alive connection each response's small writes
wait for the client's delayed ACK: about 40 ms per request, more than everything else the hub does (the
benchmark showed it). Twisted exposes the option per connection, so it is set as each one is made.
"""

from __future__ import annotations

import sys
from typing import Any

from daphne import http_protocol
from daphne.cli import CommandLineInterface

_build_protocol = http_protocol.HTTPFactory.buildProtocol


def _build_protocol_without_nagle(self: Any, addr: Any) -> Any:
    protocol = _build_protocol(self, addr)
    if protocol is None:
        return None
    made = protocol.connectionMade

    def connection_made() -> None:
        made()
        if hasattr(protocol.transport, "setTcpNoDelay"):
            protocol.transport.setTcpNoDelay(True)

    protocol.connectionMade = connection_made
    return protocol


def main(argv: list[str]) -> None:
    http_protocol.HTTPFactory.buildProtocol = _build_protocol_without_nagle
    CommandLineInterface().run(argv)


if __name__ == "__main__":
    main(sys.argv[1:])
