"""URL-mode consent: what a reviewer must know about a URL before opening it; and a server's URL as it may be
shown (`shown`), since one may carry a credential (``?api_key=...``, ``user:password@``).

Pure: no database, no network (not even a name lookup). The registrable domain comes from the Public Suffix
List snapshot bundled with ``publicsuffixlist`` (never fetched at run time), so "login.example.co.uk" is
shown as "example.co.uk", not "co.uk". An address into a private network is refused by the hub's one
outbound guard (``netguard.private_link``), allowlist included.
"""

from __future__ import annotations

import ipaddress
import re
import unicodedata
from dataclasses import dataclass, field
from functools import cache
from urllib.parse import urlsplit

from django.utils.translation import gettext as _
from publicsuffixlist import PublicSuffixList

from approvals import netguard
from approvals.urlparts import HIDDEN as HIDDEN  # re-exported: the hub's one place for URLs
from approvals.urlparts import hidden_parts as hidden_parts
from approvals.urlparts import holds_hidden as holds_hidden
from approvals.urlparts import request_origin as request_origin
from approvals.urlparts import shown as shown


@cache
def _psl() -> PublicSuffixList:
    return PublicSuffixList()  # loads the bundled list; it has no download path


@dataclass(frozen=True)
class UrlWarning:
    code: str  # punycode | mixed_script | other_domain | unknown_server | http | ip_address
    message: str


@dataclass(frozen=True)
class UrlAnalysis:
    url: str
    scheme: str = ""
    host: str = ""  # ASCII (xn--) form
    host_unicode: str = ""  # what the xn-- labels spell, "" when the host is plain ASCII
    domain: str = ""  # registrable domain, ASCII form ("example.co.uk"); the host itself for IPs
    domain_unicode: str = ""
    refused: str = ""  # why the hub will not open it at all
    warnings: list[UrlWarning] = field(default_factory=list)

    @property
    def openable(self) -> bool:
        return not self.refused

    @property
    def origin(self) -> str:
        """What a refused address may show of itself: where it goes, not what it carries."""
        return origin(self.url)

    @property
    def codes(self) -> list[str]:
        return [warning.code for warning in self.warnings]


def refusal(url: object) -> str:
    """Why a url-mode URL will never be opened (so it is not shown for consent), or "" when it may be."""
    if not isinstance(url, str) or not url.strip():
        return _("The server sent no address.")
    return analyse(url).refused


def analyse(url: str, *, server_url: str = "") -> UrlAnalysis:
    """Parse `url`; refuse what must never be opened, and warn about what deserves a second look. The host
    judged and shown is the one a browser opening `url` goes to (`netguard.browser_url`): for
    ``https://evil.example\\.bank.example/`` that is evil.example, not bank.example."""
    try:
        parts = urlsplit(netguard.browser_url(url.strip()))
        hostname = parts.hostname or ""
        parts.port  # noqa: B018  (raises ValueError on a malformed port)
    except ValueError:
        return UrlAnalysis(url=url, refused=_("The address cannot be read."))
    scheme = parts.scheme.lower()
    if scheme not in ("https", "http"):
        return UrlAnalysis(
            url=url,
            scheme=scheme,
            refused=_("Only web addresses (https) are opened; this one uses “%(scheme)s:”.")
            % {"scheme": scheme or "?"},
        )
    if parts.username is not None or parts.password is not None:
        return UrlAnalysis(
            url=url,
            scheme=scheme,
            refused=_("The address carries a user name or password, which hides where it really goes."),
        )
    if not hostname:
        return UrlAnalysis(url=url, scheme=scheme, refused=_("The address has no host."))
    host, host_unicode = _host_forms(hostname)
    if host is None:
        return UrlAnalysis(url=url, scheme=scheme, refused=_("The host name is not valid."))
    inside = netguard.private_link(url.strip())
    if inside:
        # A server must not use the reviewer's browser to reach what the hub itself may not: the same guard
        # and allowlist as the hub's own requests (without a lookup: the browser resolves names itself).
        return UrlAnalysis(
            url=url,
            scheme=scheme,
            refused=_("The address points into a private network (%(reason)s).") % {"reason": inside},
        )
    warnings: list[UrlWarning] = []
    is_ip = _is_ip(host)
    domain = host if is_ip else (_psl().privatesuffix(host) or host)
    domain_unicode = _decode_host(domain) if host_unicode else ""
    if scheme == "http":
        warnings.append(UrlWarning("http", _("The page is not encrypted (http, not https).")))
    if is_ip:
        warnings.append(UrlWarning("ip_address", _("The address is a bare IP address, not a domain name.")))
    if host_unicode:
        warnings.append(
            UrlWarning(
                "punycode",
                _("The domain uses international characters (%(ascii)s is shown as %(unicode)s).")
                % {"ascii": host, "unicode": host_unicode},
            )
        )
        if _mixed_script(host_unicode):
            warnings.append(
                UrlWarning(
                    "mixed_script",
                    _("The domain mixes alphabets, a common way to imitate another site's name."),
                )
            )
    warnings.extend(_server_warnings(domain, server_url))
    return UrlAnalysis(
        url=url,
        scheme=scheme,
        host=host,
        host_unicode=host_unicode,
        domain=domain,
        domain_unicode=domain_unicode,
        warnings=warnings,
    )


def origin(url: str) -> str:
    """Where a URL goes, without what it carries: ``scheme://host[:port]``, no credentials, path, query or
    fragment (where sign-in links keep their tokens). "" when it cannot be read. The host is the one a
    browser goes to (`netguard.browser_url`): a backslash ends it, so what follows one is path, not host."""
    try:
        parts = urlsplit(netguard.browser_url(url.strip()))
        host, port = parts.hostname or "", parts.port
    except ValueError:
        return ""
    if not parts.scheme or not host:
        return ""
    shown = f"[{host}]" if ":" in host else host
    return f"{parts.scheme.lower()}://{shown}" + (f":{port}" if port else "")


def registrable_domain(hostname: str) -> str:
    """The registrable domain of a host in ASCII form ("a.b.example.co.uk" -> "example.co.uk")."""
    host, _unicode = _host_forms(hostname)
    if host is None:
        return ""
    if _is_ip(host):
        return host
    return _psl().privatesuffix(host) or host


def _server_warnings(domain: str, server_url: str) -> list[UrlWarning]:
    if not server_url:
        return [UrlWarning("unknown_server", _("The hub has no address for this server to compare with."))]
    try:
        server_host = urlsplit(server_url).hostname or ""
    except ValueError:
        server_host = ""
    server_domain = registrable_domain(server_host) if server_host else ""
    if server_domain and server_domain == domain:
        return []
    return [
        UrlWarning(
            "other_domain",
            _("The page is on %(domain)s, not on the server's own domain (%(server)s).")
            % {"domain": domain, "server": server_domain or "?"},
        )
    ]


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return False
    return True


# The WHATWG URL standard's forbidden domain code points: a browser refuses a host holding any of them, so
# the hub neither shows one for consent nor names a domain for it ("exa mple.com").
_FORBIDDEN_IN_HOST = re.compile(r"[\x00-\x20#%/:<>?@\[\\\]^|\x7f]")


def _host_forms(hostname: str) -> tuple[str | None, str]:
    """(ASCII host, Unicode host or "" when it is plain ASCII); None when a label cannot be encoded or the
    host holds a character no browser takes in one."""
    hostname = hostname.rstrip(".").lower()
    if _is_ip(hostname):
        return hostname, ""
    if _FORBIDDEN_IN_HOST.search(hostname):
        return None, ""
    ascii_labels = []
    for label in hostname.split("."):
        if not label:
            return None, ""
        if label.isascii():
            ascii_labels.append(label)
            continue
        try:
            encoded = unicodedata.normalize("NFC", label).encode("punycode").decode("ascii")
            ascii_labels.append("xn--" + encoded)
        except UnicodeError:
            return None, ""
    host = ".".join(ascii_labels)
    decoded = _decode_host(host)
    return host, (decoded if decoded != host else "")


def _decode_host(host: str) -> str:
    labels = []
    for label in host.split("."):
        if label.startswith("xn--"):
            try:
                labels.append(label[4:].encode("ascii").decode("punycode"))
            except UnicodeError:
                labels.append(label)
        else:
            labels.append(label)
    return ".".join(labels)


# Scripts that legitimately share one name: Japanese mixes Han and kana, Korean Han and Hangul.
_COMPATIBLE = [{"HAN", "HIRAGANA", "KATAKANA"}, {"HAN", "HANGUL"}]


def _script(char: str) -> str:
    name = unicodedata.name(char, "")
    if name.startswith("CJK"):
        return "HAN"
    return name.split(" ", 1)[0] if name else ""


def _mixed_script(host_unicode: str) -> bool:
    """True when one label mixes letters of different scripts (Latin "pple" after a Cyrillic "a")."""
    for label in host_unicode.split("."):
        scripts = {_script(char) for char in label if char.isalpha()}
        if len(scripts) > 1 and not any(scripts <= group for group in _COMPATIBLE):
            return True
    return False
