"""Websocket consumers: authenticate on connect, re-check permission per event, never write.

The queue socket joins the team groups whose requests the user may answer. For each group event it
reads the rows again (once per process) and sends the part *this user* may answer, as a fragment rendered
from the same partial templates the pages use, or nothing when the user may see none of it. A round that
opens brings its card in the notice (``approvals.cards``): sent as it is when the user may answer all of
it, in the language it was rendered in. A sequence gap, or a counter that moved while the socket was not
listening, becomes a ``resync`` notice: the page then reloads its state over HTTP.

The socket follows its user's sign-in: when the scopes' counter moves (a membership, a user's account or
a sign-out changed: ``permissions``), the user is read again through the socket's session. One no longer
signed in (signed out, session expired, account deactivated or deleted, password changed) is closed with
4401; one who lost teams is told to resync, so the page drops what it was sent of them.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
import uuid
from collections import Counter, OrderedDict
from collections.abc import Callable
from dataclasses import replace
from importlib import import_module
from types import SimpleNamespace
from typing import Any, ClassVar, TypeVar, cast
from urllib.parse import urlsplit

from channels.consumer import get_handler_name
from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer, AsyncWebsocketConsumer
from django.conf import settings
from django.contrib import auth
from django.contrib.auth.models import AnonymousUser
from django.contrib.sessions.backends import db as db_sessions
from django.utils import translation
from django.utils.translation.trans_real import parse_accept_lang_header
from redis.exceptions import RedisError

from approvals import broadcast, cards, permissions, selectors
from approvals.models import InputRequest, Team, ToolCall, is_uuid
from approvals.services import presence

logger = logging.getLogger(__name__)

MAX_WATCHED_CALLS = 20
# How often a ping re-reads the user's teams and renews the group memberships (a database query and a Redis
# write per group): a team the user joined meanwhile reaches an open tab within this time (a reload shows it
# at once). Between, a ping only compares the counters (one Redis MGET): an open tab pings every 10 s, and a
# thousand idle tabs re-joining on each ping cost a whole core. A counter that moved re-joins at once (a
# Redis that lost its data lost the memberships with the counters).
REJOIN_EVERY = 300.0
# A ping compares counters this process read at most this long ago (one read serves every tab pinging
# meanwhile): a counter that moved while a tab heard nothing is noticed this much later.
COUNTERS_MAX_AGE = 1.0
# A socket's permission scope (its user's answering teams) serves this long as read; after that, for as long
# as the scopes' counter has not moved (broadcast.scopes_version: every membership change moves it), up to
# SCOPE_MAX_AGE; then it is read again. A removed member stops receiving within SCOPE_TTL (the counter is read
# at most once per SCOPE_TTL by each process); a change the counter missed (an UPDATE that sent no signal, a
# Redis outage) is seen when the scope is read again: by the next rejoin (a ping after REJOIN_EVERY), as a
# team newly joined is. An open tab pings every 10 s, so its scope is never older than SCOPE_MAX_AGE.
SCOPE_TTL = 2.0
SCOPE_MAX_AGE = REJOIN_EVERY + 60.0
# Two processes can publish to a group out of their sequence's order (each takes its number, then sends: the
# worker opening one round as the web process answers another). A missing number waits this long for its
# event before it counts as lost and the page resyncs; under load a resync on every crossing reloaded the
# whole queue over HTTP about once per two calls.
GAP_GRACE = 1.0
# More numbers missing at once than this is not a crossing: resync at once.
GAP_MAX = 50
T = TypeVar("T")
# What the page sends is a ping every 10 s and the call it shows, as small JSON objects. A frame larger than
# this, or more messages than MESSAGE_BURST at once (refilled at MESSAGES_PER_SECOND), closes the socket: a
# refused ``watch_call`` costs a database read, and no page sends them by the hundred.
MAX_FRAME = 4096
MESSAGE_BURST = 30
MESSAGES_PER_SECOND = 1.0
TOO_MANY_MESSAGES = 4429
# Standard close codes (RFC 6455) for frames the page never sends.
UNSUPPORTED_DATA, INVALID_PAYLOAD, TOO_BIG = 1003, 1007, 1009
# A user's sockets open on one process at once (each a tab; a page has one): more are closed with
# TOO_MANY_SOCKETS as they open, so one account cannot hold a process's memory and its groups' traffic
# with thousands of sockets. Counted per process, which is what they cost; the page tries again later.
MAX_SOCKETS_PER_USER = 50
TOO_MANY_SOCKETS = 4430
# The queue and presence notices a socket remembers having acted on (their ``notice``): a request's team
# and its fallback team each get a copy of its notice, and a reviewer of both heard each card twice (the
# page said "decided" twice). The copies are sent one right after the other.
NOTICES_KEPT = 64
# The close code of a socket whose user is no longer signed in (the page then reloads: the sign-in page).
SIGNED_OUT = 4401
# A scope that lets its holder answer nothing: a signed-out socket's.
NOBODY = permissions.Scope(None, False, False, frozenset())


def _header(scope: dict[str, Any], name: bytes) -> str:
    for key, value in scope.get("headers", []):
        if key == name:
            return value.decode("latin-1")
    return ""


def _same_origin(scope: dict[str, Any]) -> bool:
    """The Origin's host and port are the Host the socket was opened on (no cross-site sockets)."""
    origin, host = _header(scope, b"origin"), _header(scope, b"host")
    if not origin or not host:
        return False
    try:
        return urlsplit(origin).netloc.lower() == host.lower()
    except ValueError:
        return False


def _session_user(scope: dict[str, Any]) -> Any | None:
    """The user the socket's session signs in now, read again as a page's request reads it (Django's
    ``auth.get_user``: the session as stored, the account active, the password unchanged); None when it
    signs no one in any more."""
    session = scope.get("session")
    key = getattr(session, "session_key", None) if session is not None else None
    if not key:
        return None
    store = import_module(settings.SESSION_ENGINE).SessionStore(key)
    user = auth.get_user(cast(Any, SimpleNamespace(session=store)))
    return user if user.is_authenticated else None


def _session_end(scope: dict[str, Any]) -> float | None:
    """When the socket's session ends as stored (a timestamp; 0 when it is gone), for the database-backed
    session engines; None when the engine does not say. No counter moves when a session merely expires: the
    socket watches the time itself."""
    session = scope.get("session")
    key = getattr(session, "session_key", None) if session is not None else None
    store = import_module(settings.SESSION_ENGINE).SessionStore
    if not key or not issubclass(store, db_sessions.SessionStore):
        return None
    rows = store.get_model_class().objects.filter(session_key=key)
    end = rows.values_list("expire_date", flat=True).first()
    return end.timestamp() if end is not None else 0.0


def _language(scope: dict[str, Any]) -> str:
    header = _header(scope, b"accept-language")
    for code, _q in parse_accept_lang_header(header):
        try:
            return translation.get_supported_language_variant(code)
        except LookupError:
            continue
    return translation.get_language() or "en"


# The close code of a socket opened on an address the hub does not serve.
NOT_FOUND = 4404


class NotFound(AsyncWebsocketConsumer):
    """A socket on an address no route serves: refused before it is accepted, nothing read."""

    async def connect(self) -> None:
        await self.close(code=NOT_FOUND)


class QueueConsumer(AsyncJsonWebsocketConsumer):
    groups_joined: list[str]
    seqs: dict[str, int]
    watched: set[str]
    # Per user id: the sockets this process holds open for them (MAX_SOCKETS_PER_USER).
    open_sockets: ClassVar[Counter[int]] = Counter()
    _counted: int | None = None
    # Until `_open`: a socket accepted only to be told why it closes reads none of the frames that crossed
    # its close (the consumer raised on them).
    _refused = True

    async def connect(self) -> None:
        user = self.scope.get("user")
        if not _same_origin(self.scope):
            await self.close(code=SIGNED_OUT)
            return
        if user is None or not user.is_authenticated:
            # A close before the accept is a refused handshake (HTTP 403): the browser sees 1006, never the
            # code, and a page whose session ended while its socket was down would retry for good, still
            # showing what it showed. A page's browser (it sends its cookies) is told why, and goes to the
            # sign-in page; a client without any cookie is refused at the handshake.
            if _header(self.scope, b"cookie"):
                await self.accept()
            await self.close(code=SIGNED_OUT)
            return
        if not self._admit(user.pk):
            await self.accept()
            await self.close(code=TOO_MANY_SOCKETS)
            return
        await self._open(user)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        """The consumer's whole life: its socket stops counting as its user's however it ends (a close, a
        disconnect, an exception in a handler, which skips ``disconnect``)."""
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._release()

    def _admit(self, user_id: int) -> bool:
        """Count this socket as one of its user's (True), unless they hold MAX_SOCKETS_PER_USER already. No
        await between the check and the count: two sockets opening at once cannot both take the last one."""
        if self.open_sockets[user_id] >= MAX_SOCKETS_PER_USER:
            logger.warning("a socket was refused: its user has %d open on this process", MAX_SOCKETS_PER_USER)
            return False
        self.open_sockets[user_id] += 1
        self._counted = user_id
        return True

    def _release(self) -> None:
        user_id, self._counted = self._counted, None
        if user_id is not None:
            self.open_sockets[user_id] -= 1
            if self.open_sockets[user_id] <= 0:
                del self.open_sockets[user_id]

    async def _open(self, user: Any) -> None:
        self.user = user
        self.language = _language(self.scope)
        self.own_group = broadcast.user_group(user.pk)  # the requests made for this user alone
        self.groups_joined = []
        self.seqs = {}
        self.missing: dict[str, dict[int, float]] = {}  # per group: numbers skipped, and until when to wait
        self.given_up: dict[str, set[int]] = {}  # per group: numbers skipped, resynced for, not heard since
        self._gap_timer: asyncio.TimerHandle | None = None
        self.watched = set()
        self._acted: OrderedDict[str, set[str]] = OrderedDict()  # per notice: the requests sent of it
        self._scope_value: permissions.Scope | None = None
        self._scope_read_at = 0.0
        self._scope_version: int | None = None
        self._groups_version: int | None = None  # the scopes' counter when the groups were chosen
        self.signed_out = False
        self._refused = False  # closed for what the client sent: later frames are not read
        self._allowance, self._allowance_at = float(MESSAGE_BURST), time.monotonic()
        self._joined_at = 0.0
        self._session_ends: float | None = None  # read with the groups (`_allowed_groups`)
        await self._join()
        await self.accept()
        await self.send_json({"type": "hello", "groups": self.groups_joined})

    async def dispatch(self, message: dict[str, Any]) -> None:
        """Channels' own dispatch, without the thread hop it takes before every message to close stale
        database connections: every query here runs through ``database_sync_to_async``, which closes them
        around itself, and a ping or an event this socket ignores then costs no thread at all."""
        handler = getattr(self, get_handler_name(message), None)
        if handler is None:
            raise ValueError(f"No handler for message type {message['type']}")
        await handler(message)

    async def disconnect(self, code: int) -> None:
        self._release()
        timer = getattr(self, "_gap_timer", None)
        if timer is not None:
            timer.cancel()
        joined = getattr(self, "groups_joined", [])
        own = [self.own_group] if hasattr(self, "own_group") else []
        watched = [broadcast.call_group(call) for call in getattr(self, "watched", set())]
        await broadcast.unsubscribe(self.channel_name, [*joined, *own, *watched])

    async def _join(self) -> list[str]:
        """(Re)join the user's groups and note where each sequence stands; leave groups no longer theirs
        (returned). A rejoin reads the user again first: one no longer signed in is closed."""
        if self._joined_at and not await database_sync_to_async(self._still_signed_in)():
            await self._close_signed_out()
            return []
        groups = await database_sync_to_async(self._allowed_groups)()
        left = [group for group in self.groups_joined if group not in groups]
        await broadcast.unsubscribe(self.channel_name, left)
        # The watched calls' groups are renewed with the others: a membership Redis lost (or let expire)
        # would otherwise leave a call page open for good without its call's notices.
        await broadcast.subscribe(self.channel_name, [*groups, self.own_group, *self._watched_groups()])
        self._joined_at = time.monotonic()
        current = await broadcast.acurrent_seqs([*groups, self.own_group])
        for group in [*groups, self.own_group]:
            self.seqs.setdefault(group, current[group])
        self.groups_joined = groups
        return left

    def _still_signed_in(self) -> bool:
        """Read the user again through the socket's session (their flags with them); False, and nobody
        from here on, once it no longer signs them in."""
        user = _session_user(self.scope)
        if user is None or user.pk != self.user.pk:
            self.user, self.signed_out = AnonymousUser(), True
            self._scope_value, self._scope_read_at = NOBODY, time.monotonic()
            return False
        self.user = user
        self._session_ends = _session_end(self.scope)
        return True

    def _session_over(self) -> bool:
        """Whether the session's end, as last read, has passed: the user is then read again before anything
        more is sent (a session extended meanwhile carries on; one that expired is closed)."""
        return self._session_ends is not None and time.time() >= self._session_ends

    async def _close_signed_out(self) -> bool:
        """Close a socket whose user is no longer signed in (True), leaving its groups at once."""
        if not self.signed_out:
            return False
        groups, self.groups_joined = [*self.groups_joined, self.own_group], []
        watched, self.watched = [broadcast.call_group(call) for call in self.watched], set()
        await broadcast.unsubscribe(self.channel_name, [*groups, *watched])
        await self.close(code=SIGNED_OUT)
        return True

    def _allowed_groups(self) -> list[str]:
        """The user's groups; the permission scope is read again with them (from the same rows, but a
        superuser's, who joins every team's group)."""
        user = self.user
        version, now = broadcast.scopes_version(), time.monotonic()
        self._groups_version = version
        self._session_ends = _session_end(self.scope)
        if user.is_superuser:
            slugs: list[str | None] = [*Team.objects.values_list("slug", flat=True), None]
            scope = permissions.scope_of(user)
        else:
            teams = dict(permissions.reviewer_teams(user).values_list("pk", "slug").distinct())
            slugs = list(teams.values())
            if user.is_staff:
                slugs.append(None)
            scope = permissions.Scope(user.pk, False, bool(user.is_staff), frozenset(teams))
        self._scope_value, self._scope_read_at, self._scope_version = scope, now, version
        return sorted(broadcast.team_group(slug) for slug in slugs)

    # --- from the browser: never a write; only pings and which call page is open

    async def receive(
        self, text_data: str | None = None, bytes_data: bytes | None = None, **kwargs: Any
    ) -> None:
        """A frame from the client: small JSON text, at the page's pace. Anything else closes the socket
        with the code that says why (RFC 6455; TOO_MANY_MESSAGES for a flood), and nothing raises."""
        if self._refused or self.signed_out:
            return
        code = self._spend() or self._frame_problem(text_data)
        content: Any = None
        if not code:
            try:
                content = await self.decode_json(text_data)
            except (ValueError, RecursionError):
                code = INVALID_PAYLOAD
        if code:
            self._refused = True
            await self.close(code=code)
            return
        await self.receive_json(content)

    def _spend(self) -> int:
        """Take one message from the allowance; TOO_MANY_MESSAGES when it is spent."""
        now = time.monotonic()
        refill = (now - self._allowance_at) * MESSAGES_PER_SECOND
        self._allowance, self._allowance_at = min(float(MESSAGE_BURST), self._allowance + refill), now
        if self._allowance < 1:
            return TOO_MANY_MESSAGES
        self._allowance -= 1
        return 0

    @staticmethod
    def _frame_problem(text: str | None) -> int:
        if text is None:
            return UNSUPPORTED_DATA
        return TOO_BIG if len(text) > MAX_FRAME else 0

    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        if not isinstance(content, dict) or self.signed_out:
            return
        kind = content.get("type")
        if kind == "ping":
            await self._check_counters()
        elif kind == "watch_call":
            await self._watch_call(str(content.get("call", "")))

    async def _check_counters(self) -> None:
        """Compare each counter with the last seen; renew the memberships (Redis may have lost them, the
        user may have joined a team) when one moved, and every REJOIN_EVERY seconds. When the scopes'
        counter moved, the user is read again (signed out: closed) and their groups chosen again: groups
        they lost are resynced, so the page drops what it showed of them."""
        scopes = broadcast.SCOPES
        left: list[str] = []
        try:
            current = await self._counters([*self._heard(), scopes])
            due = time.monotonic() - self._joined_at >= REJOIN_EVERY or self._session_over()
            if due or current[scopes] != self._groups_version:
                left = await self._join()
                if self.signed_out:
                    return
                current = await self._counters(self._heard())
        except RedisError:
            logger.warning("a ping could not read the counters: Redis unavailable; the next ping tries again")
            return
        # The watched calls' counters too: a call's notice lost (a full channel) would otherwise leave its
        # page showing a status the call no longer has until the call's next notice, if any comes.
        behind = [group for group in self._heard() if current[group] != self.seqs.get(group)]
        for group in behind:
            self.seqs[group] = current[group]
        if behind:
            try:
                await self._join()
            except RedisError:
                # The memberships are renewed at a later ping; the page reads what it missed over HTTP all
                # the same (the resync below).
                logger.warning(
                    "a ping could not renew the groups: Redis unavailable; the next ping tries again"
                )
            if self.signed_out:
                return
        if left or behind:
            reason = "scope" if left else "counter"
            await self.send_json({"type": "resync", "reason": reason, "groups": [*left, *behind]})
        else:
            await self.send_json({"type": "pong"})

    async def _counters(self, groups: list[str]) -> dict[str, int]:
        """The groups' counters, as read by this process at most COUNTERS_MAX_AGE ago; those that differ from
        what this socket holds are read again first. A value read before the event the socket has just heard
        is behind it, not a change: taken as one, it reloaded the page's queue and set the socket's number
        back, so that the next event looked like a gap and reloaded it once more."""
        current = await broadcast.acurrent_seqs(groups, max_age=COUNTERS_MAX_AGE)
        held = {**self.seqs, broadcast.SCOPES: self._groups_version}
        differ = [group for group in groups if current[group] != held.get(group)]
        if differ:
            current.update(await broadcast.acurrent_seqs(differ))
        return current

    def _listening(self) -> list[str]:
        """The queue groups this socket hears: its teams', and its user's own."""
        return [*self.groups_joined, self.own_group]

    def _watched_groups(self) -> list[str]:
        return [broadcast.call_group(call) for call in sorted(self.watched)]

    def _heard(self) -> list[str]:
        """Every group whose sequence this socket follows: its queues' and its watched calls'."""
        return [*self._listening(), *self._watched_groups()]

    async def _watch_call(self, requested: str) -> None:
        # The call's group is named by its id as the hub writes it: another spelling of the same UUID
        # (capitals, braces, a URN, no hyphens) found the call, then joined a group no notice reaches, or one
        # the channel layer refuses to name (the consumer failed).
        call_id = str(uuid.UUID(requested)) if is_uuid(requested) else requested
        if len(self.watched) >= MAX_WATCHED_CALLS or call_id in self.watched:
            return
        if not await database_sync_to_async(self._may_view_call)(call_id):
            if not await self._close_signed_out():
                await self.send_json({"type": "refused", "call": call_id})
            return
        self.watched.add(call_id)
        group = broadcast.call_group(call_id)
        await broadcast.subscribe(self.channel_name, [group])
        self.seqs.setdefault(group, (await broadcast.acurrent_seqs([group]))[group])
        await self.send_json({"type": "watching", "call": call_id})

    def _may_view_call(self, call_id: str) -> bool:
        if self._scope() is NOBODY:
            return False
        call = ToolCall.objects.filter(pk=call_id).first() if is_uuid(call_id) else None
        return call is not None and permissions.can_view_call(self.user, call)

    # --- group events

    def _in_sequence(self, event: dict[str, Any]) -> bool:
        """False when the event shows a notice was lost (or the counter started again). A number skipped
        is given GAP_GRACE to arrive late (`_gaps_overdue`); one that does is in sequence, and so is one that
        arrives after the resync its absence caused."""
        group, seq = event.get("group", ""), event.get("seq")
        last = self.seqs.get(group)
        if not isinstance(seq, int) or last is None:
            if isinstance(seq, int):
                self.seqs[group] = seq
            return False
        missing = self.missing.setdefault(group, {})
        if seq == last + 1:
            self.seqs[group] = seq
            return True
        if last + 1 < seq <= last + 1 + GAP_MAX:
            due = time.monotonic() + GAP_GRACE
            missing.update(dict.fromkeys(range(last + 1, seq), due))
            self.seqs[group] = seq
            self._check_gaps_later()
            return True
        if missing.pop(seq, None) is not None:
            return True  # a late one: its place was kept
        given_up = self.given_up.get(group)
        if given_up is not None and seq in given_up:
            # Later than GAP_GRACE: the page resynced when its grace ran out, and read its change (committed
            # before its number was taken). The number stays: set back, it made the next notice look like a
            # gap, and the page resynced twice more.
            given_up.discard(seq)
            return True
        self.seqs[group] = seq
        missing.clear()
        self.given_up.pop(group, None)
        return False

    def _check_gaps_later(self) -> None:
        if self._gap_timer is None:
            loop = asyncio.get_running_loop()

            def check() -> None:
                self._gap_check = loop.create_task(self._gaps_overdue())  # held: a task is weakly referenced

            self._gap_timer = loop.call_later(GAP_GRACE, check)

    async def _gaps_overdue(self) -> None:
        """Resync the groups whose missing numbers did not arrive in time."""
        self._gap_timer = None
        now = time.monotonic()
        lost = [
            group for group, missing in self.missing.items() if any(due <= now for due in missing.values())
        ]
        for group in lost:
            floor = self.seqs.get(group, 0) - GAP_MAX
            given_up = self.given_up.get(group, set()) | set(self.missing[group])
            self.given_up[group] = {seq for seq in given_up if seq > floor}
            self.missing[group].clear()
        if any(self.missing.values()):
            self._check_gaps_later()
        if lost:
            await self.send_json({"type": "resync", "reason": "gap", "groups": lost})

    async def _sequenced(self, event: dict[str, Any]) -> None:
        if not self._in_sequence(event):
            await self.send_json({"type": "resync", "reason": "gap", "groups": [event.get("group", "")]})

    async def queue_changed(self, event: dict[str, Any]) -> None:
        if self.signed_out:
            return
        await self._sequenced(event)
        message = await self._card_from_notice(event)
        if message is cards.READ_AGAIN:
            message = await database_sync_to_async(self._card_message)(event)
        if await self._close_signed_out():
            return
        sent, first = self._acted_on(event)
        if message and not set(message["input_requests"]) <= sent:
            sent.update(message["input_requests"])
            await self.send_json(message)
        if first and event.get("call") in self.watched:
            await self._send_call(event["call"])

    def _acted_on(self, event: dict[str, Any]) -> tuple[set[str], bool]:
        """The requests whose cards this socket sent for the event's notice (another group's copy of it
        came first), and whether this is its first copy. A copy sends only a card naming a request the
        earlier copies did not; a watched call is sent once per notice."""
        notice = event.get("notice")
        if not isinstance(notice, str):
            return set(), True
        sent = self._acted.get(notice)
        if sent is not None:
            return sent, False
        sent = self._acted[notice] = set()
        if len(self._acted) > NOTICES_KEPT:
            self._acted.popitem(last=False)
        return sent, True

    async def presence_changed(self, event: dict[str, Any]) -> None:
        if self.signed_out:
            return
        await self._sequenced(event)
        if not self._acted_on(event)[1]:
            return  # told already, by another of its teams' copy
        message = await database_sync_to_async(self._presence_message)(event)
        if await self._close_signed_out():
            return
        if message:
            await self.send_json(message)

    async def call_changed(self, event: dict[str, Any]) -> None:
        if self.signed_out:
            return
        await self._sequenced(event)
        if event.get("call") in self.watched:
            await self._send_call(event["call"])

    async def _send_call(self, call_id: str) -> None:
        message = await database_sync_to_async(self._call_message)(call_id)
        if not await self._close_signed_out():
            await self.send_json(message or {"type": "refused", "call": call_id})

    # --- rendering, as this user, in this user's language (sync: run in a thread)

    def _render(self, template: str, context: dict[str, Any]) -> str:
        return cards.render(template, context, self.language)

    def _scope(self) -> permissions.Scope:
        """The user's permission scope, as ``_confirmed_scope`` holds it: as read for SCOPE_TTL seconds, then
        for as long as the scopes' counter has not moved (one Redis read), up to SCOPE_MAX_AGE; read again
        otherwise. A removed member stops receiving within seconds, and a thousand idle sockets hearing an
        event do not each query the database for a scope nothing changed. When the scopes' counter moved
        since, the user is read again too (`_still_signed_in`): signed out, the scope is NOBODY."""
        now = time.monotonic()
        if self.signed_out or (self._session_over() and not self._still_signed_in()):
            return NOBODY
        if self._scope_value is None or now - self._scope_read_at > SCOPE_TTL:
            version = broadcast.scopes_version()  # before the teams: a change committed meanwhile moves it
            unchanged = version is not None and version == self._scope_version
            if unchanged and self._scope_value is not None and now - self._scope_read_at <= SCOPE_MAX_AGE:
                return self._scope_value
            if not unchanged and not self._still_signed_in():
                return NOBODY
            self._scope_value, self._scope_read_at = permissions.scope_of(self.user), now
            self._scope_version = version
        return self._scope_value

    async def _confirmed_scope(self) -> permissions.Scope | None:
        """The scope, when it is known to hold without reading it again (see SCOPE_TTL), else None."""
        scope, age = self._scope_value, time.monotonic() - self._scope_read_at
        if scope is None or age > SCOPE_MAX_AGE or self._scope_version is None or self._session_over():
            return None
        if age <= SCOPE_TTL:
            return scope
        try:
            version = await broadcast.ascopes_version(max_age=SCOPE_TTL)
        except RedisError:
            return None
        return scope if version == self._scope_version else None

    async def _card_from_notice(self, event: dict[str, Any]) -> dict[str, Any] | cards.ReadAgain | None:
        """The card the notice carries, when it serves this socket as it is (``cards.from_notice``), on the
        event loop; READ_AGAIN otherwise."""
        if not isinstance(event.get("card"), dict) or event["card"].get("language") != self.language:
            return cards.READ_AGAIN
        scope = await self._confirmed_scope()
        if scope is None:
            return cards.READ_AGAIN
        return cards.from_notice(event, scope, personal=event.get("group") == self.own_group)

    def _card_message(self, event: dict[str, Any]) -> dict[str, Any] | None:
        ids = sorted(pk for pk in event.get("input_requests", []) if is_uuid(pk))
        event_key = (event.get("group"), event.get("seq"), tuple(ids))
        # Every socket in this process gets the same event: the round is read (and the card rendered) once.
        shared = _memo(
            ("card", *event_key),
            lambda: _load_card(ids, event.get("round")),
            cache=event.get("seq") is not None,
        )
        if shared is None:
            return None
        card, viewers = shared
        scope = self._scope()
        items = [ir for ir in card.items if permissions.may_answer(scope, ir)]
        # A request made for this user alone comes in their own group's notice, not in its team's too.
        personal = event.get("group") == self.own_group
        mine = [ir for ir in items if str(ir.pk) in ids and (personal or ir.assignee_id is None)]
        if not mine:
            return None
        visible = replace(card, items=items)
        me = self.user.get_username()
        seen_by_me = me if any(me in names for names in viewers.values()) else ""
        html_key = ("html", *event_key, self.language, tuple(str(ir.pk) for ir in items), seen_by_me)
        html = _memo(
            html_key,
            lambda: self._render(
                "approvals/_round_card.html", {"card": visible, "viewers": viewers, "me": me}
            ),
        )
        decided = {
            str(ir.pk): _memo(
                ("decided", *event_key, str(ir.pk), self.language),
                functools.partial(self._render, "approvals/_decided.html", {"ir": ir}),
            )
            for ir in mine
            if ir.status != InputRequest.Status.PENDING
        }
        return {
            "type": "card",
            "event": event.get("event"),
            "group": event.get("group"),
            "seq": event.get("seq"),
            "call": str(card.call.pk),
            "round": card.round_id,
            "pending": len(visible.pending),
            "input_requests": [str(ir.pk) for ir in mine],
            "decided": decided,
            "html": html,
        }

    def _presence_message(self, event: dict[str, Any]) -> dict[str, Any] | None:
        pk = event.get("input_request", "")
        if not isinstance(pk, str) or not is_uuid(pk):
            return None
        # Every socket in this process gets the same event: the request is read once, and each socket decides
        # on its scope (as it does for cards), not with a query of its own per socket per viewer change.
        request, viewers = _memo(
            ("presence", event.get("group"), event.get("seq"), pk),
            lambda: _presence_of(pk),
            cache=event.get("seq") is not None,
        )
        scope = self._scope()
        if request is None or scope is NOBODY or not permissions.may_answer(scope, request):
            return None
        me = self.user.get_username()
        others = [name for name in viewers if name != me]
        return {
            "type": "presence",
            "input_request": pk,
            "seq": event.get("seq"),
            "html": self._render("approvals/_presence.html", {"viewers": others}),
        }

    def _call_message(self, call_id: str) -> dict[str, Any] | None:
        if self._scope() is NOBODY:
            return None
        call = selectors.dashboard_call(call_id)
        if call is None or not permissions.can_view_call(self.user, call):
            return None
        return {
            "type": "call",
            "call": call_id,
            "status": call.status,
            "html": self._render("approvals/_call_body.html", selectors.call_page(call)),
        }


def _load_card(
    ids: list[str], round_id: int | None = None
) -> tuple[selectors.RoundCard, dict[str, list[str]]] | None:
    """The round holding these requests, with all of its requests, and who is looking at each."""
    card = selectors.round_card_for_everyone(ids, round_id=round_id)
    if card is None:
        return None
    return card, presence.viewers([ir.pk for ir in card.items])


def _answerable_part(pk: str) -> cards.NoticedRequest | None:
    """What ``permissions.may_answer`` reads of the input request; None when it is gone."""
    row = (
        InputRequest.objects.filter(pk=pk)
        .values_list("for_requester", "assignee_id", "team_id", "escalation_team_id")
        .first()
    )
    return None if row is None else cards.NoticedRequest(*row)


def _presence_of(pk: str) -> tuple[cards.NoticedRequest | None, list[str]]:
    """The request's answerable part, and who looks at it now. Not the viewers the notice names: two pages
    opened at once each write the set, then send their notice, and the notice of the earlier write could come
    last (the page then showed one of them alone until someone's page changed the set again). Every notice is
    sent after its write, so the last one heard, read now, says who looks at it."""
    request = _answerable_part(pk)
    return request, (presence.viewers([pk]).get(pk, []) if request is not None else [])


_MEMO: OrderedDict[tuple[Any, ...], Any] = OrderedDict()
_MEMO_SIZE = 512


def _memo(key: tuple[Any, ...], build: Callable[[], T], *, cache: bool = True) -> T:
    """A small per-process memo for work every socket would otherwise repeat for the same event.

    Consumers run their sync parts on one thread (database_sync_to_async), so no lock is needed. Keys hold
    the group's sequence number, so a later event never reuses an earlier result.
    """
    if not cache:
        return build()
    if key in _MEMO:
        _MEMO.move_to_end(key)
        return cast(T, _MEMO[key])
    value = build()
    _MEMO[key] = value
    if len(_MEMO) > _MEMO_SIZE:
        _MEMO.popitem(last=False)
    return value
