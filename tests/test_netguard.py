"""The outbound URL guard: agent callbacks, MCP server URLs and team chat webhooks go only where allowed.

The table is pure logic (a stub resolver gives names their addresses; numeric host forms go through the
system's resolver, which needs no network). The rest runs on the real engines and real listeners: the
API, webhook delivery, chat notices, the MCP client against the demo server, `add_server` and the admin.
"""

from __future__ import annotations

import io
from typing import Any

import anyio
import httpx2
import pytest
from django.core.management import CommandError, call_command

from approvals import mcp_client as mcp
from approvals import netguard
from approvals.admin import McpServerForm, TeamForm
from approvals.models import McpServer, Notification, ToolCall, WebhookAttempt, WebhookDelivery
from approvals.netguard import Allow, Refused, check_url
from approvals.services import notifications, webhooks
from tests import demo_support, factories
from tests.hub import Agent, WebhookReceiver

NAMES = {
    "public.test": ["93.184.216.34"],
    "public6.test": ["2606:4700:4700::1111"],
    "rebind.test": ["10.0.0.7"],
    "metadata.test": ["169.254.169.254"],
    "mixed.test": ["93.184.216.34", "192.168.1.10"],
    "deploy.internal": ["10.1.2.3"],
    "api.deploy.internal": ["10.1.2.4"],
}


def stub(host: str, port: int) -> list[str]:
    return NAMES[host] if host in NAMES else netguard.system_resolver(host, port)


REFUSED = [
    # IPv4: loopback, private, link-local (cloud metadata), shared, multicast, reserved, unspecified
    "https://127.0.0.1/hook",
    "https://127.8.9.10/hook",
    "https://10.0.0.1/hook",
    "https://172.16.5.4/hook",
    "https://192.168.0.1/hook",
    "https://169.254.169.254/latest/meta-data/",
    "https://100.64.0.1/hook",
    "https://224.0.0.1/hook",
    "https://240.0.0.1/hook",
    "https://255.255.255.255/hook",
    "https://0.0.0.0/hook",
    "https://192.0.2.1/hook",
    # the same loopback written as decimal, hex, octal and short forms
    "http://2130706433/",
    "http://0x7f.1/",
    "http://0x7f000001/",
    "http://017700000001/",
    "http://127.1/",
    # IPv6: loopback, unspecified, link-local, unique-local, site-local, multicast, documentation
    "https://[::1]/hook",
    "https://[::]/hook",
    "https://[fe80::1]/hook",
    "https://[fd00::1]/hook",
    "https://[fec0::1]/hook",
    "https://[ff02::1]/hook",
    "https://[2001:db8::1]/hook",
    # IPv4 inside IPv6: mapped, 6to4, NAT64 (well-known and local-use prefixes), Teredo
    "https://[::ffff:127.0.0.1]/hook",
    "https://[::ffff:a9fe:a9fe]/hook",
    "https://[2002:7f00:1::1]/hook",
    "https://[2002:a00:1::]/hook",
    "https://[64:ff9b::a9fe:a9fe]/hook",
    "https://[64:ff9b:1::a00:1]/hook",
    "https://[2001:0:4136:e378:8000:63bf:3fff:fdd2]/hook",
    # names: the system's localhost, and names a resolver points inside
    "http://localhost:8000/hook",
    "https://rebind.test/hook",
    "https://metadata.test/hook",
    "https://mixed.test/hook",  # one public address is not enough: every address must pass
    # credentials, other schemes, no host
    "https://user:pw@public.test/hook",
    "https://user@public.test/hook",
    "ftp://public.test/file",
    "file:///etc/passwd",
    "https:///hook",
]

ALLOWED = [
    "https://93.184.216.34/hook",
    "https://public.test/hook",
    "http://public.test:8080/hook",
    "https://public6.test/hook",
    "https://[2606:4700:4700::1111]/hook",
    "https://[::ffff:93.184.216.34]/hook",
    "https://[2002:5db8:d822::1]/hook",  # 6to4 of a public address
    "https://[64:ff9b::5db8:d822]/hook",  # NAT64 of a public address
]


@pytest.mark.parametrize("url", REFUSED)
def test_the_guard_refuses_internal_addresses_credentials_and_other_schemes(url: str) -> None:
    with pytest.raises(Refused) as caught:
        check_url(url, allow=Allow(), resolve=stub)
    assert "pw" not in caught.value.message and "/hook" not in caught.value.message


@pytest.mark.parametrize("url", ALLOWED)
def test_the_guard_lets_public_addresses_through(url: str) -> None:
    checked = check_url(url, allow=Allow(), resolve=stub)
    assert checked.addresses


@pytest.mark.parametrize(
    ("spec", "url", "allowed"),
    [
        ("127.0.0.0/8,::1", "http://127.0.0.1:8765/mcp", True),
        ("127.0.0.0/8,::1", "http://2130706433:8765/mcp", True),
        ("127.0.0.0/8,::1", "http://[::1]:8765/mcp", True),
        ("127.0.0.0/8,::1", "http://[::ffff:127.0.0.1]:8765/mcp", True),
        ("127.0.0.0/8,::1", "http://localhost:8765/mcp", True),
        ("127.0.0.0/8,::1", "http://10.0.0.1/mcp", False),
        ("127.0.0.0/8,::1", "http://169.254.169.254/", False),
        ("127.0.0.0/8,::1", "http://user:pw@127.0.0.1/", False),  # credentials never pass
        ("10.1.0.0/16", "https://deploy.internal/mcp", True),
        ("deploy.internal", "https://deploy.internal/mcp", True),
        ("deploy.internal", "https://api.deploy.internal/mcp", False),
        (".deploy.internal", "https://api.deploy.internal/mcp", True),
        ("deploy.internal", "https://rebind.test/mcp", False),
        ("", "http://127.0.0.1:8765/mcp", False),
    ],
)
def test_the_allowlist_names_networks_and_hosts(spec: str, url: str, allowed: bool) -> None:
    if allowed:
        check_url(url, allow=Allow.parse(spec), resolve=stub)
    else:
        with pytest.raises(Refused):
            check_url(url, allow=Allow.parse(spec), resolve=stub)


@pytest.mark.parametrize("port", ["0", "-1", "65536", "99999999999999999999"])
def test_a_port_outside_the_tcp_range_is_refused_before_any_lookup(port: str) -> None:
    # The system's resolver: a port too large for it raised OverflowError, a 500 for the agent.
    for host in ("public.test", "93.184.216.34"):
        with pytest.raises(Refused) as caught:
            check_url(f"https://{host}:{port}/hook", allow=Allow())
        assert not caught.value.transient and "port outside 1-65535" in caught.value.message


def test_an_unresolvable_name_is_refused_as_transient() -> None:
    with pytest.raises(Refused) as caught:
        check_url("https://no-such-host.invalid/hook", allow=Allow())
    assert caught.value.transient and "does not resolve" in caught.value.message


# ---- agent callbacks, on the real stack ---------------------------------------------------------------


@pytest.fixture
def agent(db) -> Agent:
    _, token = factories.agent("ci-bot", servers=[factories.server("deploy")])
    return Agent(token)


def test_callbacks_into_the_hubs_network_are_refused_at_submit(agent: Agent, settings, fake_dns) -> None:
    settings.ELICIT_OUTBOUND_ALLOW = ""
    fake_dns["public.test"] = ["93.184.216.34"]
    with WebhookReceiver() as listener:
        port = listener.httpd.server_address[1]
        for url in [
            listener.url,
            f"https://127.0.0.1:{port}/hook",
            f"http://2130706433:{port}/hook",
            f"http://0x7f.1:{port}/hook",
            f"http://[::ffff:127.0.0.1]:{port}/hook",
            f"http://localhost:{port}/hook",
            "https://169.254.169.254/latest/meta-data/",
            "https://10.0.0.1/hook",
            "https://[::1]/hook",
            "https://user:pw@public.test/hook",
        ]:
            response = agent.post("/calls", {"server": "deploy", "tool": "x", "callback_url": url})
            assert response.status_code == 400, url
            error = response.json()["error"]
            assert error["code"] == "invalid_callback_url"
            assert set(error["fields"]) == {"callback_url"}
            assert "pw" not in response.content.decode()
        assert listener.received == []
    assert not ToolCall.objects.exists()


def test_a_public_callback_is_accepted(agent: Agent, settings, fake_dns) -> None:
    settings.ELICIT_OUTBOUND_ALLOW = ""
    fake_dns["hooks.agent.test"] = ["93.184.216.34"]
    body = {"server": "deploy", "tool": "x", "callback_url": "https://hooks.agent.test/hook"}
    assert agent.post("/calls", body).status_code == 202


def _delivery(url: str) -> WebhookDelivery:
    srv = McpServer.objects.get(slug="deploy")
    call = factories.call(srv, callback_url=url)
    return WebhookDelivery.objects.create(
        call=call, event_type="call.completed", url=url, payload={"type": "call.completed"}
    )


def test_delivery_judges_the_callback_again_and_connects_to_the_checked_address(
    agent: Agent, settings, fake_dns
) -> None:
    """The name passed at submit (public then); by delivery it points at the hub's own loopback."""
    with WebhookReceiver() as listener:
        port = listener.httpd.server_address[1]
        url = f"http://hooks.agent.test:{port}/hook"
        fake_dns["hooks.agent.test"] = ["93.184.216.34"]
        settings.ELICIT_OUTBOUND_ALLOW = ""
        assert agent.post("/calls", {"server": "deploy", "tool": "x", "callback_url": url}).status_code == 202

        fake_dns["hooks.agent.test"] = ["127.0.0.1"]  # DNS rebinding
        refused = _delivery(url)
        assert webhooks.webhook_attempt(delivery_id=refused.pk) is None  # no retry
        refused.refresh_from_db()
        assert refused.status == WebhookDelivery.Status.FAILED
        attempt = WebhookAttempt.objects.get(delivery=refused)
        assert attempt.status_code is None and attempt.error.startswith("refused: ")
        assert "loopback" in attempt.error
        assert listener.received == []

        # Where loopback is allowed, the request goes to the address the guard checked (the name has
        # no address in the real DNS), with the name in the Host header.
        settings.ELICIT_OUTBOUND_ALLOW = "127.0.0.0/8"
        allowed = WebhookDelivery.objects.create(
            call=refused.call, event_type="call.failed", url=url, payload={"type": "call.failed"}
        )
        assert webhooks.webhook_attempt(delivery_id=allowed.pk) is None
        allowed.refresh_from_db()
        assert allowed.status == WebhookDelivery.Status.DELIVERED
        assert [r.headers["host"] for r in listener.received] == [f"hooks.agent.test:{port}"]


# ---- team chat webhooks -----------------------------------------------------------------------------


def test_chat_webhooks_go_through_the_guard(db, settings) -> None:
    srv = factories.server("deploy")
    team = factories.team("ops")
    rnd = factories.open_round(factories.call(srv), team_=team)
    ir = rnd.input_requests.get()
    with WebhookReceiver() as chat:
        team.chat_webhook_url = chat.url
        team.save()
        settings.ELICIT_OUTBOUND_ALLOW = ""
        notice = Notification.objects.create(
            team=team, input_request=ir, kind=Notification.Kind.CHAT, event="routed"
        )
        assert notifications.notification_send(notification_id=notice.pk) is None  # no retry
        notice.refresh_from_db()
        assert notice.status == Notification.Status.FAILED
        assert "loopback" in notice.last_error and "/hook" not in notice.last_error
        assert chat.received == []

        settings.ELICIT_OUTBOUND_ALLOW = "127.0.0.0/8"
        sent = Notification.objects.create(
            team=team, input_request=ir, kind=Notification.Kind.CHAT, event="expiring"
        )
        assert notifications.notification_send(notification_id=sent.pk) is None
        sent.refresh_from_db()
        assert sent.status == Notification.Status.SENT and len(chat.received) == 1


def test_the_admin_refuses_internal_chat_webhooks(db, settings) -> None:
    settings.ELICIT_OUTBOUND_ALLOW = ""
    form = TeamForm(data={"slug": "ops", "name": "Ops", "chat_webhook_url": "https://10.0.0.1/hook"})
    assert not form.is_valid()
    assert "private address" in str(form.errors["chat_webhook_url"])


# ---- MCP server URLs ----------------------------------------------------------------------------------


def test_the_mcp_client_refuses_a_server_url_before_connecting(demo_server, settings) -> None:
    demo_support.reset(demo_server.url)
    settings.ELICIT_OUTBOUND_ALLOW = ""
    with pytest.raises(mcp.PermanentError) as caught:
        mcp.run(mcp.list_tools(mcp.ServerConfig(url=demo_server.url, timeout=5)))
    assert caught.value.code == "url_refused" and "loopback" in caught.value.message
    assert demo_support.recorded_requests(demo_server.url) == []


def test_the_mcp_client_reaches_an_allowed_server_by_name(demo_server, settings) -> None:
    settings.ELICIT_OUTBOUND_ALLOW = "127.0.0.0/8,::1"
    url = demo_server.url.replace("127.0.0.1", "localhost")
    tools = mcp.run(mcp.list_tools(mcp.ServerConfig(url=url, timeout=5)))
    assert any(tool["name"] == "create_deployment" for tool in tools)


def _get_through_guard(url: str, allow: Allow) -> Any:
    async def get() -> Any:
        async with httpx2.AsyncClient(transport=netguard.AsyncGuardedTransport(allow=allow)) as http:
            return await http.get(url)

    return anyio.run(get)


def test_every_request_of_the_mcp_client_is_judged_and_pinned(demo_server, fake_dns) -> None:
    """The MCP client's transport judges each request itself and connects to the address it checked."""
    health = demo_server.url.rsplit("/", 1)[0] + "/healthz"
    with pytest.raises(netguard.AsyncOutboundRefused, match="loopback"):
        _get_through_guard(health, Allow())
    fake_dns["demo.mcp.test"] = ["127.0.0.1"]  # a name the real DNS does not know
    response = _get_through_guard(health.replace("127.0.0.1", "demo.mcp.test"), Allow.parse("127.0.0.0/8"))
    assert response.status_code == 200
    assert response.request.url.host == "demo.mcp.test"


def test_a_transport_keeps_the_address_it_checked_for_a_url(demo_server, fake_dns) -> None:
    """One transport (one send, one held session) resolves a URL once: its next requests go to the address
    that check judged, even if the name now points somewhere the guard refuses (DNS rebinding)."""
    health = demo_server.url.rsplit("/", 1)[0] + "/healthz"
    url = health.replace("127.0.0.1", "demo.mcp.test")
    fake_dns["demo.mcp.test"] = ["127.0.0.1"]

    async def twice() -> list[Any]:
        guarded = netguard.AsyncGuardedTransport(allow=Allow.parse("127.0.0.0/8"))
        async with httpx2.AsyncClient(transport=guarded) as http:
            first = await http.get(url)
            fake_dns["demo.mcp.test"] = ["10.0.0.1"]  # the name moves to a private address
            return [first, await http.get(url)]

    assert [r.status_code for r in anyio.run(twice)] == [200, 200]
    # A new transport checks again and refuses the private address.
    with pytest.raises(netguard.AsyncOutboundRefused, match="private address"):
        _get_through_guard(url, Allow.parse("127.0.0.0/8"))


def test_a_send_resolves_its_servers_name_once(demo_server, settings, fake_dns, monkeypatch) -> None:
    """The client checks the server URL before connecting and hands that check to its transport: a send
    resolves the server's name once, not once more for each of its requests."""
    settings.ELICIT_OUTBOUND_ALLOW = "127.0.0.0/8,::1"
    fake_dns["localhost"] = ["127.0.0.1"]  # the demo server answers only to its own host names
    lookups: list[str] = []
    resolve = netguard.resolver

    def counted(host: str, port: int) -> list[str]:
        lookups.append(host)
        return resolve(host, port)

    monkeypatch.setattr(netguard, "resolver", counted)
    demo_support.reset(demo_server.url)
    # Written as an admin might: the request's URL is normalised, and the check is still found for it.
    config = mcp.ServerConfig(url=demo_server.url.replace("127.0.0.1", "LocalHost"), timeout=5)
    tools = mcp.run(mcp.list_tools(config))
    assert any(tool["name"] == "create_deployment" for tool in tools)
    assert "tools/list" in [r["body"].get("method") for r in demo_support.recorded_requests(demo_server.url)]
    assert lookups == ["localhost"]  # the check before connecting; the request went to its address


def test_add_server_refuses_internal_urls_and_credentials(db, settings, fake_dns) -> None:
    settings.ELICIT_OUTBOUND_ALLOW = ""
    fake_dns["mcp.example.test"] = ["93.184.216.34"]
    for url in ["http://127.0.0.1:8765/mcp", "https://169.254.169.254/mcp", "https://u:pw@mcp.example.test/"]:
        with pytest.raises(CommandError, match="refused") as caught:
            call_command("add_server", "deploy", url, stdout=io.StringIO())
        assert "pw" not in str(caught.value)
    assert not McpServer.objects.exists()
    call_command("add_server", "deploy", "https://mcp.example.test/mcp", stdout=io.StringIO())
    assert McpServer.objects.get(slug="deploy").url == "https://mcp.example.test/mcp"


def test_the_admin_refuses_internal_server_urls(db, settings) -> None:
    settings.ELICIT_OUTBOUND_ALLOW = ""
    form = McpServerForm(
        data={"slug": "deploy", "name": "Deploy", "url": "http://[::ffff:10.0.0.1]/mcp", "enabled": "on"}
    )
    assert not form.is_valid()
    assert "private address" in str(form.errors["url"])


def test_a_refused_server_fails_its_call_with_a_clear_error(db, settings) -> None:
    """Through the sending service: the call ends failed, naming the refusal, without retries."""
    from approvals.services import sending

    settings.ELICIT_OUTBOUND_ALLOW = ""
    call = factories.call(factories.server("deploy", url="http://10.0.0.1/mcp"))
    assert sending.call_send(call_id=call.pk) is None
    call.refresh_from_db()
    assert call.status == ToolCall.Status.FAILED
    assert call.error["code"] == "url_refused"


def test_redirects_are_not_followed(agent: Agent, settings) -> None:
    """A callback that answers 302 towards another address gets no second request from the hub."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    with WebhookReceiver() as target:

        class Redirect(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.send_response(302)
                self.send_header("Location", target.url)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        redirector = ThreadingHTTPServer(("127.0.0.1", 0), Redirect)
        threading.Thread(target=redirector.serve_forever, daemon=True).start()
        try:
            url = f"http://127.0.0.1:{redirector.server_address[1]}/hook"
            delivery = _delivery(url)
            webhooks.webhook_attempt(delivery_id=delivery.pk)
        finally:
            redirector.shutdown()
            redirector.server_close()
        assert WebhookAttempt.objects.get(delivery=delivery).error == "HTTP 302"
        assert target.received == []


def test_the_admin_never_shows_a_stored_chat_webhook_and_keeps_it_unless_told(db, client) -> None:
    """A chat webhook's address is its credential: write-only in the admin, like a server's headers."""
    from django.contrib.auth import get_user_model

    from approvals.models import Team

    root = get_user_model().objects.create_superuser("root", "root@example.com", "pw")
    team = Team.objects.create(
        slug="ops", name="Ops", chat_webhook_url="https://chat.example.com/T0/B0/s3cret"
    )
    client.force_login(root)
    page = client.get(f"/admin/approvals/team/{team.pk}/change/").content.decode()
    assert "s3cret" not in page and "https://chat.example.com" in page
    form = {"slug": "ops", "name": "Ops Team", "notify_emails": "", "chat_webhook_url": ""}
    inline = {"memberships-TOTAL_FORMS": "0", "memberships-INITIAL_FORMS": "0"}
    saved = client.post(f"/admin/approvals/team/{team.pk}/change/", {**form, **inline})
    assert saved.status_code == 302, saved.content.decode()[-2000:]
    team.refresh_from_db()
    assert (team.name, team.chat_webhook_url) == ("Ops Team", "https://chat.example.com/T0/B0/s3cret")
    client.post(
        f"/admin/approvals/team/{team.pk}/change/", {**form, **inline, "clear_chat_webhook_url": "on"}
    )
    team.refresh_from_db()
    assert team.chat_webhook_url == ""
