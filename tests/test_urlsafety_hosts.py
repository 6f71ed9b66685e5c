"""A url-mode address whose host holds a character no browser takes in a host (WHATWG's forbidden domain
code points: a space, `|`, `^`, `<`...) is refused as unreadable, not shown for consent with a made-up
domain the reviewer would trust."""

from __future__ import annotations

import pytest

from approvals import urlsafety


@pytest.mark.parametrize(
    "url",
    ["https://exa mple.com/login", "https://ex|ample.com/", "https://bank^.example/", "https://a<b.example/"],
)
def test_a_host_no_browser_takes_is_refused(url: str) -> None:
    found = urlsafety.analyse(url)
    assert found.refused == "The host name is not valid."
    assert found.domain == ""
    assert urlsafety.refusal(url) == "The host name is not valid."


@pytest.mark.parametrize(
    ("url", "domain"),
    [
        ("https://login.example.com/a b?c=d e", "example.com"),  # spaces past the host are the path's
        ("https://bücher.example/", "xn--bcher-kva.example"),
        ("https://my_host.example.com:8443/", "example.com"),
    ],
)
def test_ordinary_hosts_still_read(url: str, domain: str) -> None:
    found = urlsafety.analyse(url)
    assert found.refused == ""
    assert found.domain == domain
