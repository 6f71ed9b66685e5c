"""URL-mode analysis: what must be refused, and what deserves a warning before a reviewer opens it."""

from __future__ import annotations

import pytest

from approvals.urlsafety import analyse, registrable_domain

SERVER = "https://mcp.example.com/mcp"


@pytest.mark.parametrize(
    ("url", "domain", "codes"),
    [
        ("https://login.example.com/authorize?x=1", "example.com", []),
        ("https://accounts.example.co.uk/a", "example.co.uk", ["other_domain"]),
        ("https://example.github.io/page", "example.github.io", ["other_domain"]),
        ("http://login.example.com/", "example.com", ["http"]),
        ("https://93.184.215.14/login", "93.184.215.14", ["ip_address", "other_domain"]),
        ("https://[2606:4700:4700::1111]:8443/x", "2606:4700:4700::1111", ["ip_address", "other_domain"]),
        # A Cyrillic a in front of Latin "pple": punycode and mixed scripts, in either spelling.
        ("https://\u0430pple.com/", "xn--pple-43d.com", ["punycode", "mixed_script", "other_domain"]),
        ("https://xn--pple-43d.com/", "xn--pple-43d.com", ["punycode", "mixed_script", "other_domain"]),
        # One script throughout (Japanese Han + Hiragana) is international, not mixed.
        ("https://\u4f8b\u3048.jp/", "xn--r8jz45g.jp", ["punycode", "other_domain"]),
        ("https://LOGIN.Example.COM./x", "example.com", []),
    ],
)
def test_domain_and_warnings(url: str, domain: str, codes: list[str]) -> None:
    result = analyse(url, server_url=SERVER)
    assert result.openable
    assert result.domain == domain
    assert result.codes == codes


def test_the_unicode_form_is_shown_second() -> None:
    result = analyse("https://xn--pple-43d.com/", server_url=SERVER)
    assert (result.host, result.host_unicode, result.domain_unicode) == (
        "xn--pple-43d.com",
        "\u0430pple.com",
        "\u0430pple.com",
    )
    assert "xn--pple-43d.com" in result.warnings[0].message


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("https://user:secret@example.com/", "user name or password"),
        ("https://user@example.com/", "user name or password"),
        ("javascript:alert(1)", "javascript"),
        ("data:text/html,hi", "data"),
        ("ftp://example.com/file", "ftp"),
        ("https:///nohost", "no host"),
        ("https://example.com:99999/", "cannot be read"),
    ],
)
def test_addresses_that_are_never_opened(url: str, reason: str) -> None:
    result = analyse(url, server_url=SERVER)
    assert not result.openable
    assert reason in result.refused


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("http://127.0.0.1:8000/admin/", "127.0.0.1 is a loopback address"),
        ("http://localhost:8000/admin/", "localhost (127.0.0.1) is a loopback address"),
        ("https://login.localhost/", "is a loopback address"),
        ("http://2130706433/", "2130706433 (127.0.0.1) is a loopback address"),
        ("http://0x7f.1/", "(127.0.0.1) is a loopback address"),
        ("https://[::1]/", "::1 is a loopback address"),
        ("http://[::ffff:127.0.0.1]/", "is a loopback address"),
        ("http://169.254.169.254/latest/meta-data/", "169.254.169.254 is a link-local address"),
        ("https://10.0.0.7/login", "10.0.0.7 is a private address"),
    ],
)
def test_an_address_into_a_private_network_is_never_opened(settings, url: str, reason: str) -> None:
    """A server must not use a reviewer's browser to reach what the hub itself may not (its one guard)."""
    settings.ELICIT_OUTBOUND_ALLOW = ""
    result = analyse(url, server_url=SERVER)
    assert not result.openable
    assert "private network" in result.refused and reason in result.refused


def test_the_outbound_allowlist_lets_a_private_address_be_opened(settings) -> None:
    settings.ELICIT_OUTBOUND_ALLOW = "10.0.0.0/8,sso.localhost"
    assert analyse("https://10.0.0.7/login", server_url=SERVER).openable
    assert analyse("https://sso.localhost/login", server_url=SERVER).openable
    assert not analyse("https://10.0.0.7.nip.io.localhost/", server_url=SERVER).openable


def test_a_name_is_not_looked_up_to_judge_it(settings, monkeypatch) -> None:
    """The browser resolves names itself, elsewhere: the analysis makes no lookup (and stays pure)."""
    from approvals import netguard

    settings.ELICIT_OUTBOUND_ALLOW = ""

    def no_lookup(*args: object, **kwargs: object) -> None:
        raise AssertionError("looked up")

    monkeypatch.setattr(netguard, "resolver", no_lookup)
    assert analyse("https://login.example.com/authorize", server_url=SERVER).openable


def test_a_server_the_hub_has_no_address_for_is_said_so() -> None:
    assert analyse("https://example.com/", server_url="").codes == ["unknown_server"]


def test_registrable_domain_uses_the_public_suffix_list_offline() -> None:
    assert registrable_domain("a.b.c.example.co.uk") == "example.co.uk"
    assert registrable_domain("foo.s3.amazonaws.com") == "foo.s3.amazonaws.com"
    assert registrable_domain("127.0.0.1") == "127.0.0.1"


# --- the same check decides what the hub shows for consent (one home: urlsafety) -------------------------


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        (None, "sent no address"),
        ("", "sent no address"),
        ("javascript:alert(1)", "“javascript:”"),
        ("https://user:pw@example.com/", "user name or password"),
        ("https:///path-only", "has no host"),
        ("https://a..example.com/", "host name is not valid"),
    ],
)
def test_a_url_the_hub_would_refuse_to_open_is_never_shown_for_consent(url, problem: str) -> None:
    from approvals.models import InputRequest
    from approvals.services.rounds import _describe

    ir = _describe("login", {"method": "elicitation/create", "params": {"mode": "url", "url": url}})
    assert ir.status == InputRequest.Status.UNSUPPORTED and ir.action == InputRequest.Action.DECLINE
    assert problem in ir.problem and ".." not in ir.problem
    assert ir.problem.startswith("Not shown to reviewers:")


def test_an_openable_url_is_shown_for_consent() -> None:
    from approvals.models import InputRequest
    from approvals.services.rounds import _describe

    url = "https://login.example.com/authorize?x=1"
    ir = _describe("login", {"method": "elicitation/create", "params": {"mode": "url", "url": url}})
    assert ir.status == InputRequest.Status.PENDING and ir.problem == "" and ir.url == url
