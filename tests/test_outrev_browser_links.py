"""URL-mode links are judged by the host a reviewer's browser goes to (the WHATWG URL standard), not by the
host another parser reads: a trailing dot, a percent-encoded or full-width host and a backslash ending the
host all lead a browser into the hub's network, and a backslash must not let the consent show one domain
while the browser opens another."""

from __future__ import annotations

import pytest

from approvals import netguard
from approvals.urlsafety import analyse, refusal

SERVER = "https://mcp.bank.example/mcp"


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("http://127.0.0.1./admin/", "loopback"),
        ("http://localhost./admin/", "loopback"),
        ("http://app.localhost./", "loopback"),
        ("http://2130706433./", "loopback"),
        ("http://0x7f.1./", "loopback"),
        ("http://169.254.169.254./latest/meta-data/", "link-local"),
        ("http://0.0.0.0./", "unspecified"),
        ("http://%31%32%37.0.0.1/", "loopback"),
        ("http://loc%61lhost/", "loopback"),
        ("http://localhost%2e/", "loopback"),
        ("http://%EF%BC%91%EF%BC%92%EF%BC%97.0.0.1/", "loopback"),  # full-width digits, percent-encoded
        ("http://127%E3%80%820.0.1/", "loopback"),  # an ideographic full stop
        ("http://127.0.0.1\\.example.com/", "loopback"),  # a browser ends the host at a backslash
        ("https://10.0.0.7\\@example.com/", "private"),
        ("http://127.0.0.1\t./", "loopback"),  # a browser drops tabs and line breaks anywhere
    ],
)
def test_outrev_a_private_address_as_a_browser_reads_it_is_never_opened(
    settings, url: str, reason: str
) -> None:
    settings.ELICIT_OUTBOUND_ALLOW = ""
    assert reason in netguard.private_link(url)
    result = analyse(url, server_url=SERVER)
    assert not result.openable
    assert "private network" in result.refused
    assert refusal(url) == result.refused


def test_outrev_the_allowlist_still_applies_to_the_browsers_reading(settings) -> None:
    settings.ELICIT_OUTBOUND_ALLOW = "10.0.0.0/8"
    assert netguard.private_link("https://10.0.0.7./login") == ""
    assert analyse("https://10.0.0.7./login", server_url=SERVER).openable


@pytest.mark.parametrize(
    ("url", "domain"),
    [
        # The browser opens evil.example: the consent must not say bank.example (the server's own domain).
        ("https://evil.example\\.bank.example/login", "evil.example"),
        ("https://evil.example\\@bank.example/login", "evil.example"),
        ("https://bank.example%2eevil.example/login", "evil.example"),
        ("https://%65vil.example/login", "evil.example"),
        ("https://\uff45vil.example/login", "evil.example"),  # a full-width e is an e to a browser
    ],
)
def test_outrev_the_consent_names_the_domain_the_browser_opens(settings, url: str, domain: str) -> None:
    settings.ELICIT_OUTBOUND_ALLOW = ""
    result = analyse(url, server_url=SERVER)
    assert result.openable, result.refused
    assert result.domain == domain
    assert "other_domain" in result.codes


def test_outrev_ordinary_links_read_as_before(settings) -> None:
    settings.ELICIT_OUTBOUND_ALLOW = ""
    result = analyse("https://login.bank.example/authorize?next=a\\b&x=%2F", server_url=SERVER)
    assert result.openable
    assert (result.host, result.domain, result.codes) == ("login.bank.example", "bank.example", [])
    assert result.url == "https://login.bank.example/authorize?next=a\\b&x=%2F"


@pytest.mark.parametrize(
    ("url", "where"),
    [
        # What follows a backslash is the path to a browser, where a sign-in link keeps its token.
        ("https://login.example\\sign-in-token-4f9a8b7c6d5e/next", "https://login.example"),
        ("https://evil.example\\@bank.example/login", "https://evil.example"),
        ("https://%65vil.example:8443/x?t=1", "https://evil.example:8443"),
        ("https://login.example/x?t=secret", "https://login.example"),
    ],
)
def test_outrev_the_origin_shown_and_audited_is_where_the_browser_goes(url: str, where: str) -> None:
    from approvals.urlsafety import origin

    assert origin(url) == where
