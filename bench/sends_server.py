"""The MCP server of the sends benchmark: the demo server's tools, plus one whose result has the output schema
a typical typed tool declares (a model with nested models, enums and optional fields, as the SDK derives it).

    python bench/sends_server.py --port PORT      (http://127.0.0.1:PORT/mcp, stateless, 2026-07-28)
"""

from __future__ import annotations

import argparse
import socket
from typing import Literal

import uvicorn
from mcp.types import ToolAnnotations
from pydantic import BaseModel
from starlette.requests import Request
from starlette.responses import JSONResponse

from approvals.demo.server import build_server


class Environment(BaseModel):
    name: str
    region: Literal["eu", "us", "ap"]
    replicas: int
    tags: list[str]


class Step(BaseModel):
    id: int
    title: str
    status: Literal["ok", "failed", "skipped"]
    log: str | None = None


class Deployment(BaseModel):
    id: str
    branch: str
    environment: Environment
    steps: list[Step]
    url: str | None = None
    started: str
    finished: str | None = None
    ok: bool


def deployment_report(branch: str) -> Deployment:
    """The last deployment of a branch (made up), as structured content."""
    return Deployment(
        id=f"dep-{branch}",
        branch=branch,
        environment=Environment(name="staging", region="eu", replicas=2, tags=["bench"]),
        steps=[Step(id=1, title="build", status="ok"), Step(id=2, title="roll out", status="ok")],
        started="2026-01-01T00:00:00Z",
        finished="2026-01-01T00:01:00Z",
        ok=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    mcp = build_server()
    mcp.add_tool(deployment_report, annotations=ToolAnnotations(read_only_hint=True))

    @mcp.custom_route("/healthz", methods=["GET"])
    async def healthz(request: Request) -> JSONResponse:
        return JSONResponse({"ok": True})

    sock = socket.create_server((args.host, args.port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    app = mcp.streamable_http_app(json_response=True, stateless_http=True, host=args.host)
    uvicorn.Server(uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=2)).run(sockets=[sock])


if __name__ == "__main__":
    main()
