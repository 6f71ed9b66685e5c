"""`python -m approvals.demo [--host HOST] [--port PORT]`: run the demo MCP server under uvicorn."""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import socket
import sys

import uvicorn

from approvals.demo.server import build_app

logger = logging.getLogger("approvals.demo")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m approvals.demo", description=__doc__)
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument(
        "--port", type=int, default=8765, help="port to bind, 0 for any free one (default 8765)"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("mcp").setLevel(logging.WARNING)

    try:
        app = build_app(host=args.host)
    except ValueError as error:  # a setting from the environment that cannot be used
        sys.exit(f"{parser.prog}: {error}")
    # Bound here rather than by uvicorn so the start-up line names the real port, even for --port 0.
    family = socket.AF_INET6 if ":" in args.host else socket.AF_INET
    try:
        sock = socket.create_server((args.host, args.port), family=family)
    except OSError as error:
        # Without the address again (create_server adds it to the system's reason); a name that does not
        # resolve has a negative errno of its own.
        code = error.errno or 0
        reason = os.strerror(code) if code > 0 else (error.strerror or str(error))
        sys.exit(f"{parser.prog}: cannot listen on {args.host} port {args.port}: {reason}")
    # Accepted connections inherit this: without it a response's small writes wait ~40 ms on the
    # client's delayed ACK, which would dominate every latency the hub measures.
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    port = sock.getsockname()[1]
    shown = f"[{args.host}]" if family == socket.AF_INET6 else args.host
    config = uvicorn.Config(
        app,
        log_level="warning",
        # Held test requests and open streams must not keep a SIGTERM waiting.
        timeout_graceful_shutdown=2,
    )
    logger.info("Elicit demo MCP server listening on http://%s:%d/mcp", shown, port)
    # Ctrl-C while a held test request is being cancelled ends in KeyboardInterrupt after uvicorn
    # has already shut down: nothing left to report.
    with contextlib.suppress(KeyboardInterrupt):
        uvicorn.Server(config).run(sockets=[sock])


if __name__ == "__main__":
    main()
