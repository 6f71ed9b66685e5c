"""A server URL as it may be shown: its credentials (query values, a password, a fragment) hidden.

Pure (no Django): the MCP client scrubs what a URL hides from its error messages with it, and stays free
of Django (`approvals.mcp_client`). `approvals.urlsafety` re-exports both for the rest of the hub.
"""

from __future__ import annotations

from urllib.parse import unquote, urlsplit, urlunsplit

# What `shown` writes in place of a URL's hidden parts. A URL holding it is one an admin left as shown.
HIDDEN = "***"


def shown(url: str) -> str:
    """A server URL as it may be shown, printed, logged or audited: scheme, host, port and path as written;
    every query value, the userinfo's password (all of a userinfo without one: a lone user name may be a
    token) and any fragment replaced by `HIDDEN`, since hosted MCP servers take their key there
    (``https://mcp.example.com/mcp?api_key=***``). Idempotent; "" for "", `HIDDEN` when it cannot be read."""
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
    return urlunsplit((parts.scheme, hostport, parts.path, query, fragment))


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
    return [form for value in found if value for form in dict.fromkeys((value, unquote(value)))]


def _masked_pair(pair: str) -> str:
    """One ``key=value`` of a query with its value hidden; a lone value (no ``=``) is hidden whole."""
    key, equals, _value = pair.partition("=")
    if not pair:
        return ""
    return f"{key}={HIDDEN}" if equals else HIDDEN
