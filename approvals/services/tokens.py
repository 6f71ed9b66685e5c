"""Bearer tokens for agents and reviewers' scripts: shown once, stored as a SHA-256 hash.

The tokens are 256-bit random values, so a fast hash is enough (there is nothing to brute-force) and lets a
request find its token by an indexed equality lookup. Creating and rotating one is audited (``token.created``,
``agent.created``, ``token.rotated``: who, which, never the token or its hash); using one is not.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import logging
import secrets
from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any

from django.db import InternalError, transaction
from django.db.models import OuterRef
from django.utils import timezone

from approvals import broadcast, faults, permissions
from approvals.audit.core import Actor
from approvals.models import AgentClient, McpServer, PersonalToken, Team
from approvals.prepared import PreparedRead
from approvals.services import config_audit

logger = logging.getLogger(__name__)

AGENT_PREFIX = "eha_"
PERSONAL_PREFIX = "ehp_"


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def new_token(prefix: str) -> str:
    return prefix + secrets.token_urlsafe(32)


def new_webhook_secret() -> str:
    return "whsec_" + base64.b64encode(secrets.token_bytes(32)).decode()


def agent_create(
    *,
    name: str,
    servers: list[McpServer],
    owner: Any = None,
    with_webhook_secret: bool = False,
    acts_for_users: Iterable[Any] = (),
    acts_for_teams: Iterable[Team] = (),
    actor: Actor | None = None,
) -> tuple[AgentClient, str]:
    """A new agent and its token, audited ``agent.created`` (by ``actor``, the hub's system actor if None)."""
    token = new_token(AGENT_PREFIX)
    with transaction.atomic():
        agent = AgentClient.objects.create(
            name=name,
            token_hash=hash_token(token),
            token_prefix=token[:10],
            owner=owner,
            webhook_secret=new_webhook_secret() if with_webhook_secret else "",
        )
        agent.servers.set(servers)
        agent.acts_for_users.set(list(acts_for_users))
        agent.acts_for_teams.set(list(acts_for_teams))
        config_audit.saved(agent, None, actor=actor or Actor.system())
    return agent, token


def agent_token_rotate(*, agent: AgentClient, actor: Actor | None = None) -> str:
    """A new token for an existing agent; the old one stops working at once. Returns the new token."""
    token = new_token(AGENT_PREFIX)
    with transaction.atomic():
        before = config_audit.stored(agent)
        AgentClient.objects.filter(pk=agent.pk).update(token_hash=hash_token(token), token_prefix=token[:10])
        rotated = AgentClient.objects.get(pk=agent.pk)
        config_audit.saved(rotated, before, actor=actor or Actor.system(), what="rotated")
        # The gateway ends what the old token opened (its listen streams, its sessions' GET streams).
        transaction.on_commit(broadcast.tools_changed)
    return token


def webhook_secret_rotate(
    *, agent: AgentClient, keep_previous_for: timedelta, actor: Actor | None = None
) -> tuple[str, datetime | None]:
    """A new webhook signing secret for ``agent``; returns it and until when the one it replaces still signs
    beside it (None: the old one stops at once, or there was none). Audited ``agent.changed`` (the secrets
    only as changed, set or cleared)."""
    secret = new_webhook_secret()
    with transaction.atomic():
        agent = AgentClient.objects.select_for_update().get(pk=agent.pk)
        before = config_audit.state(agent)
        previous, until = "", None
        if agent.webhook_secret and keep_previous_for > timedelta(0):
            previous, until = agent.webhook_secret, timezone.now() + keep_previous_for
        agent.webhook_secret = secret
        agent.previous_webhook_secret = previous
        agent.previous_webhook_secret_until = until
        agent.save(
            update_fields=["webhook_secret", "previous_webhook_secret", "previous_webhook_secret_until"]
        )
        config_audit.saved(agent, before, actor=actor or Actor.system())
    return secret, until


def signing_secrets(agent: AgentClient, now: datetime) -> list[str]:
    """The secrets ``agent``'s webhooks are signed with now: its secret, and the one a rotation replaced
    until its time is up (none when the agent has no secret)."""
    if not agent.webhook_secret:
        return []
    held = [agent.webhook_secret]
    until = agent.previous_webhook_secret_until
    if agent.previous_webhook_secret and until is not None and now < until:
        held.append(agent.previous_webhook_secret)
    return held


def token_matches(agent: AgentClient, token: str) -> bool:
    return bool(token) and hmac.compare_digest(agent.token_hash, hash_token(token))


def personal_token_create(
    *, user: Any, name: str = "", actor: Actor | None = None
) -> tuple[PersonalToken, str]:
    """A reviewer's token, audited ``token.created`` (by ``actor``, the hub's system actor if None)."""
    token = new_token(PERSONAL_PREFIX)
    with transaction.atomic():
        record = PersonalToken.objects.create(
            user=user, name=name, token_hash=hash_token(token), token_prefix=token[:10]
        )
        config_audit.saved(record, None, actor=actor or Actor.system())
    return record, token


# `last_used_at` says when a token was last used to this precision: a token seen within the last minute is not
# written again. One write per request was a commit (and a WAL flush) per API call, serialising the
# concurrent requests of one token on its row.
LAST_USED_PRECISION = timedelta(seconds=60)


def _stale(last_used_at: datetime | None, now: datetime) -> bool:
    return last_used_at is None or now - last_used_at >= LAST_USED_PRECISION


def _record_use(token: AgentClient | PersonalToken, now: datetime) -> None:
    """Sets the token's ``last_used_at``, best effort: a server that takes no writes (a standby after a
    failover) refuses it, and a read with the token still goes on, logged, with ``last_used_at`` unchanged.
    The savepoint rolls back that statement alone, so the request's transaction stays usable. Any other
    error is raised."""
    try:
        with transaction.atomic():
            type(token).objects.filter(pk=token.pk).update(last_used_at=now)
    except InternalError as exc:
        if faults.engine_of(exc) != "postgresql":
            raise
        logger.warning(
            "%s %s: last use not recorded, the database takes no writes",
            type(token).__name__,
            token.pk,
        )
        return
    token.last_used_at = now


# Every API request with a token reads one of these; compiled once per process.
_AGENT_BY_HASH = PreparedRead(
    lambda token_hash: AgentClient.objects.filter(token_hash=token_hash, is_active=True).order_by("pk")[:1],
    token_hash=AgentClient._meta.get_field("token_hash"),
)
_PERSONAL_BY_HASH = PreparedRead(
    lambda token_hash: (
        PersonalToken.objects.select_related("user")
        .annotate(**permissions.with_answering_teams(OuterRef("user_id")))
        .filter(token_hash=token_hash, user__is_active=True)
        .order_by("pk")[:1]
    ),
    token_hash=PersonalToken._meta.get_field("token_hash"),
)


def bearer(authorization: str) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` value (the scheme in any case, one or more spaces
    before the token), or None."""
    scheme, _, token = authorization.partition(" ")
    token = token.lstrip(" ")
    return token if scheme.lower() == "bearer" and token else None


def authenticate(token: str) -> AgentClient | PersonalToken | None:
    digest = hash_token(token)
    now = timezone.now()
    if token.startswith(AGENT_PREFIX):
        agent = _AGENT_BY_HASH.first(token_hash=digest)
        if agent and _stale(agent.last_used_at, now):
            _record_use(agent, now)
        return agent
    if token.startswith(PERSONAL_PREFIX):
        personal = _PERSONAL_BY_HASH.first(token_hash=digest)
        if personal is not None:
            # Read with the token: the request's first reads of the user's teams need no statement.
            permissions.remember_teams(personal.user, personal)
        if personal and _stale(personal.last_used_at, now):
            _record_use(personal, now)
        return personal
    return None
