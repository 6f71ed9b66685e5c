"""The MCP client offers a server only the content codings it decompresses itself, within the answer's size
limit (gzip, deflate): were a brotli or zstd decoder installed, the HTTP client would offer it too and
decompress what it gets with no bound."""

from __future__ import annotations

import asyncio

import httpx2

from approvals.mcp_client.transport import ACCEPTED_CODINGS, InflatingTransport


def test_only_the_codings_decompressed_within_the_limit_are_offered() -> None:
    seen: list[str] = []

    def answer(request: httpx2.Request) -> httpx2.Response:
        seen.append(request.headers.get("accept-encoding", ""))
        return httpx2.Response(200, json={"jsonrpc": "2.0", "id": 1, "result": {}})

    async def send() -> int:
        transport = InflatingTransport(httpx2.MockTransport(answer))
        async with httpx2.AsyncClient(transport=transport) as client:
            response = await client.post(
                "http://server.example/mcp", json={}, headers={"Accept-Encoding": "br, zstd, gzip"}
            )
            return response.status_code

    assert asyncio.run(send()) == 200
    assert seen == [ACCEPTED_CODINGS] == ["gzip, deflate"]
