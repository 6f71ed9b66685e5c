"""A gateway whose PostgreSQL takes no writes (a standby reached after a failover) answers the REST API's
503 with Retry-After, not a bare 500: recording the token's use is a write, and fails with
ReadOnlySqlTransaction, which the guard took for the server's own fault. The gateway process runs on a
connection whose transactions are read-only (the suite's database, as it is)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from urllib.parse import quote

import httpx
import pytest

from approvals import outage
from approvals.models import ToolCall
from approvals.services import servers, tokens
from tests import demo_support, live
from tests.hub import set_up_hub
from tests.live import child_env
from tests.test_gateway import Gateway
from tests.test_outage_gateway_redis import INITIALIZE

pytestmark = pytest.mark.timeout(180)


@pytest.fixture
def read_only_gateway(live_db: None) -> Iterator[Gateway]:
    url = live.test_database_url() + "?options=" + quote("-c default_transaction_read_only=on", safe="")
    process = Gateway(child_env(DATABASE_URL=url))
    process.start()
    try:
        yield process
    finally:
        process.stop()


def test_a_read_only_database_gets_the_503_not_a_500(
    demo_server: demo_support.DemoServer, read_only_gateway: Gateway
) -> None:
    hub = set_up_hub(demo_server.url)
    servers.server_refresh_tools(server=hub.server)
    token = tokens.agent_token_rotate(agent=hub.server.agents.get())
    headers = {"Authorization": f"Bearer {token}", "Accept": "application/json, text/event-stream"}

    for path in ("/mcp", "/mcp/demo"):
        refused = httpx.post(read_only_gateway.url + path, json=INITIALIZE, headers=headers, timeout=30)
        assert refused.status_code == 503, (path, refused.status_code, refused.text)
        assert refused.headers.get("retry-after") == str(outage.RETRY_AFTER)
        assert json.loads(refused.content)["error"]["code"] == "engine_unavailable"
    assert not ToolCall.objects.exists()
