"""A server URL as it may be shown: its credentials (query values, a password, a fragment, a key in its path)
hidden.

Pure (no Django): the MCP client scrubs what a URL hides from its error messages with it, and stays free
of Django (`approvals.mcp_client`). `approvals.urlsafety` re-exports both for the rest of the hub.
"""

from __future__ import annotations

import re
from urllib.parse import unquote, urlsplit, urlunsplit

# What `shown` writes in place of a URL's hidden parts. A URL holding it is one an admin left as shown.
HIDDEN = "***"
# A path segment that reads as a key: hosted MCP servers give each user a URL with the key in its path
# (``https://mcp.example.com/s/<key>/mcp``, or a UUID). Twenty characters or more of those keys are made of,
# letters and digits both: a long name of words (``release-managers-deploy``) is not one.
_KEYLIKE = re.compile(r"(?=[^/]*[0-9])(?=[^/]*[A-Za-z])[A-Za-z0-9_~+=.%-]{20,}")


def shown(url: str) -> str:
    """A server URL as it may be shown, printed, logged or audited: scheme, host, port and path as written;
    every query value, the userinfo's password (all of a userinfo without one: a lone user name may be a
    token), any fragment and every path segment that reads as a key (`_KEYLIKE`) replaced by `HIDDEN`,
    since hosted MCP servers take their key there (``https://mcp.example.com/mcp?api_key=***``,
    ``https://mcp.example.com/s/***/mcp``). Idempotent; "" for "", `HIDDEN` when it cannot be read."""
    if not url:
        return ""
    try:
        parts = urlsplit(url.strip())
        parts.port  # noqa: B018  (raises ValueError on a malformed port)
    except ValueError:
        return HIDDEN
    userinfo, at, hostport = parts.netloc.rpartition("@")
    if at:
        user, colon, _password = userinfo.partition(":")
        hostport = (f"{user}:{HIDDEN}" if colon else HIDDEN) + "@" + hostport
    query = "&".join(_masked_pair(pair) for pair in parts.query.split("&")) if parts.query else ""
    fragment = HIDDEN if parts.fragment else ""
    path = "/".join(HIDDEN if _KEYLIKE.fullmatch(segment) else segment for segment in parts.path.split("/"))
    return urlunsplit((parts.scheme, hostport, path, query, fragment))


def hidden_parts(url: str) -> list[str]:
    """What `shown` hides of `url`, as written and percent-decoded (for telling a change of them, or
    scrubbing them from a text); the whole URL when it cannot be read."""
    if not url:
        return []
    try:
        parts = urlsplit(url.strip())
        parts.port  # noqa: B018
    except ValueError:
        return [url]
    found: list[str] = []
    userinfo, at, _hostport = parts.netloc.rpartition("@")
    if at:
        user, colon, password = userinfo.partition(":")
        found.append(password if colon else user)
    for pair in parts.query.split("&") if parts.query else ():
        key, equals, value = pair.partition("=")
        found.append(value if equals else key)
    if parts.fragment:
        found.append(parts.fragment)
    found.extend(segment for segment in parts.path.split("/") if _KEYLIKE.fullmatch(segment))
    return [form for value in found if value for form in dict.fromkeys((value, unquote(value)))]


def holds_hidden(url: str) -> bool:
    """Whether `url` holds `HIDDEN` where `shown` hides a value: a shown URL, copied and edited."""
    if HIDDEN in hidden_parts(url):
        return True
    try:
        path = urlsplit(url.strip()).path
    except ValueError:
        return False
    return HIDDEN in path.split("/")


def _masked_pair(pair: str) -> str:
    """One ``key=value`` of a query with its value hidden; a lone value (no ``=``) is hidden whole."""
    key, equals, _value = pair.partition("=")
    if not pair:
        return ""
    return f"{key}={HIDDEN}" if equals else HIDDEN


def request_origin(url: str) -> str:
    """Where a URL sends requests: ``scheme://host:port`` (the scheme's default port written out); "" when
    it names no host or cannot be read. Stored credentials never follow a server to another origin."""
    try:
        parts = urlsplit(url.strip())
        port = parts.port or {"http": 80, "https": 443}.get(parts.scheme.lower())
    except ValueError:
        return ""
    if not parts.hostname:
        return ""
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    return f"{parts.scheme.lower()}://{host}:{port}"
