"""Team notices (email, Slack-compatible chat webhook) when a request is routed, escalated or about to expire.

Both optional per team, both retried, every one recorded as a Notification row. Notices carry the server's
name as the hub knows it, the tool and the message, and a link; never arguments or answers.
"""

from __future__ import annotations

import contextlib
import re
import smtplib
import socket
import threading
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.core.mail import get_connection, send_mail
from django.core.mail.backends import smtp
from django.db.models import F, Q
from django.utils import timezone

from approvals import netguard, visible
from approvals.models import InputRequest, Notification, Team
from approvals.queueing import SEND_NOTIFICATION, enqueue_on_commit
from approvals.services.locks import try_lock
from approvals.services.webhooks import (
    ASKED_TO_WAIT,
    GONE,
    GONE_ERROR,
    STALE_AFTER,
    asked_wait,
    failed_status,
    failure,
    longest_countdown,
    retry_countdown,
    too_soon_after,
)

HEADLINES = {
    "routed": "asks {team} for input",
    "escalated": "escalated to {team}: no answer yet",
    "expiring": "expires soon, still unanswered",
}


def expiring_event(extensions: int) -> str:
    """The event of a round's expiry warning: one per deadline, so ``expiring``, then ``expiring.N`` after the
    round's Nth extension (a notice is sent once per team, request, kind and event)."""
    return "expiring" if not extensions else f"expiring.{extensions}"


def notify(*, ir: InputRequest, team: Team | None, event: str) -> None:
    """Queue the team's notices for one request, once per kind and event, inside the caller's transaction."""
    if team is None:
        return
    kinds = []
    if _recipients(team):
        kinds.append(Notification.Kind.EMAIL)
    if team.chat_webhook_url:
        kinds.append(Notification.Kind.CHAT)
    for kind in kinds:
        notice, created = Notification.objects.get_or_create(
            team=team, input_request=ir, kind=kind, event=event
        )
        if created:
            enqueue_on_commit(SEND_NOTIFICATION, notice.pk)


def notifications_recover(*, now: datetime) -> int:
    """Queue again the pending notices of requests still waiting that no task is trying: STALE_AFTER past
    the longest their next try may wait after their latest one (or after they were made, if never tried),
    their task was lost (as a webhook's can be). Returns how many. A notice whose chat asked to wait (a 429,
    a 503 with Retry-After) may be waiting out the cap. Measured from the latest try, not from creation: a
    notice whose chat first asked to wait and later failed otherwise came due while its retry still waited,
    and went out twice over."""
    fresh = now - STALE_AFTER
    pending = Notification.objects.filter(
        Q(last_attempt_at__lte=fresh) | Q(last_attempt_at__isnull=True, created_at__lte=fresh),
        input_request__in=InputRequest.objects.pending(),
        status=Notification.Status.PENDING,
    ).values_list("pk", "attempts", "created_at", "last_attempt_at", "last_error")
    requeued = 0
    for notice_id, attempts, created_at, last_at, last_error in pending:
        wait = longest_countdown(attempts, asked=ASKED_TO_WAIT in last_error) if attempts else 0
        if (last_at or created_at) + timedelta(seconds=wait) + STALE_AFTER <= now:
            enqueue_on_commit(SEND_NOTIFICATION, notice_id)
            requeued += 1
    return requeued


def _text(notice: Notification) -> tuple[str, str]:
    ir = notice.input_request
    call = ir.round.call
    event = notice.event.partition(".")[0]  # expiring.N: the warning before the deadline of extension N
    headline = HEADLINES.get(event, notice.event).format(team=notice.team.name)
    # One line: the tool's name is the agent's or the server's to choose, and a mail header holds no break.
    subject = visible.plain(" ".join(f"[Elicit Hub] {call.server_name}: {call.tool} {headline}".split()))
    link = f"{settings.ELICIT_PUBLIC_URL.rstrip('/')}/requests/{ir.pk}/"
    rnd = ir.round
    deadline = f"Deadline: {rnd.deadline.isoformat()}\n"
    if rnd.server_deadline is not None and rnd.server_deadline < rnd.deadline:
        # A server that asked on an open session stops waiting then (the request is gone), as the request's
        # page says: the team told only of the later deadline would answer too late.
        deadline += f"The server waits until: {rnd.server_deadline.isoformat()}\n"
    body = f"{subject}\n\n{visible.plain(ir.message[:500])}\n\n{deadline}Review: {link}\n"
    return subject, body


# An @ not right after a letter or digit: a mention in chats that read them in plain text (@channel, @all,
# @here, @name), where a word is cut at punctuation before it is read (Mattermost finds @channel in
# `v2.@channel`, `x-@all`, `+@here` and `_@channel`); and an @ before `everyone` or `here` wherever it
# stands: Discord pings the whole channel for those inside a word. An address's @ follows a letter or digit.
_MENTION = re.compile(r"(?<![^\W_])@|@(?=everyone|here)", re.IGNORECASE)
# A ] that Markdown would read as the end of a link's label: `[label](url)`, `![alt](url)`, `[label][ref]`,
# or a reference's definition `[label]: url`.
_LINK_LABEL_END = re.compile(r"\](?=[(\[:])")


def _chat_text(text: str) -> str:
    """`text` as a Slack-compatible chat shows it as written: ``&``, ``<`` and ``>`` escaped as Slack asks,
    so a server's message cannot mention ``<!channel>`` or label a link at will (``<url|Review>``); an
    ``@`` not right after a letter or digit, or before ``everyone`` or ``here`` anywhere, kept from mentioning
    anyone by a word joiner after it; and a word joiner after a ``]`` that Markdown would end a link's label
    with, for the chats that take Slack's payload and read its text as Markdown (Mattermost, Rocket.Chat,
    Microsoft Teams, Discord), where ``[Review](url)`` is a link labelled at will and ``![x](url)`` an image
    every reader's client fetches."""
    text = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return _LINK_LABEL_END.sub("]\u2060", _MENTION.sub("@\u2060", text))


class ReceiverGone(RuntimeError):
    """A chat webhook answered 410 Gone: it takes no more posts, so the notice is not tried again."""


class ReceiverFailed(RuntimeError):
    """A chat webhook answered with a status that is not a success: recorded as a webhook's failed attempt is
    (``HTTP 429; the receiver asked to wait 120 s``), and tried again."""


class MailTimeout(TimeoutError):
    """The mail server did not finish the exchange within the notice's timeout."""


def _send_mail(subject: str, body: str, recipients: list[str]) -> None:
    """`send_mail`, bounded as a chat notice is: Django waits on a mail server for ever unless told, and told
    (a socket timeout) it still bounds each read alone, so a server trickling its replies a line at a time
    would hold the worker as long as it liked. With Django's SMTP backend the whole exchange ends by the
    timeout: then its connection is shut, and the notice is tried again (`MailTimeout`)."""
    timeout = settings.EMAIL_TIMEOUT or settings.ELICIT_WEBHOOK_TIMEOUT
    connection = get_connection(timeout=timeout)
    fired = threading.Event()
    opened: list[tuple[smtplib.SMTP, socket.socket]] = []
    if isinstance(connection, smtp.EmailBackend):
        base: type[smtplib.SMTP] = connection.connection_class  # type: ignore[attr-defined]

        class Tracked(base):  # type: ignore[valid-type,misc]
            def _get_socket(self, host: str, port: int, each: float) -> socket.socket:
                sock: socket.socket = super()._get_socket(host, port, each)
                opened.append((self, sock))
                if fired.is_set():  # the deadline passed as it connected
                    sock.close()
                    raise MailTimeout(f"the mail server timed out: no answer within {timeout} s")
                return sock

        connection.__class__ = type("BoundedEmailBackend", (type(connection),), {"connection_class": Tracked})

    def cut() -> None:
        fired.set()
        for server, sock in list(opened):
            with contextlib.suppress(OSError):  # the server's socket once it has one (TLS after STARTTLS)
                (server.sock or sock).shutdown(socket.SHUT_RDWR)

    deadline = threading.Timer(timeout, cut)
    deadline.daemon = True
    deadline.start()
    try:
        send_mail(subject, body, None, recipients, connection=connection)
    except Exception:
        if fired.is_set():
            raise MailTimeout(f"the mail server timed out: no answer within {timeout} s") from None
        raise
    finally:
        deadline.cancel()


def _moot(ir: InputRequest) -> str:
    """Why a notice of `ir` is no longer worth sending, or "". Every notice asks the team to answer a request
    still waiting: one answered, cancelled or expired meanwhile (its task waited in a backlog, or out a
    retry's backoff), or past its deadline (no answer is taken then), would send a team to a request it can
    no longer answer, "still unanswered" when it was answered. So would one whose server stopped waiting
    for it (a question asked on an open session, past the server's own wait)."""
    if ir.status != InputRequest.Status.PENDING:
        return f"not sent: the request was no longer waiting ({ir.get_status_display().lower()})"
    now = timezone.now()
    if ir.round.deadline <= now:
        return "not sent: the request's deadline passed before the notice went out"
    if ir.round.server_deadline is not None and ir.round.server_deadline <= now:
        # A question asked on an open session: its holder closes the round `gone` once it sees the wait end.
        return "not sent: the server stopped waiting for the request before the notice went out"
    return ""


def _superseded(notice: Notification) -> str:
    """Why an expiry warning is no longer worth sending, or "": the deadline it warns of was extended before
    it went out (its task waited in a backlog, or out a retry's backoff). "Expires soon" would then stand
    beside a deadline far off; the new deadline has a warning of its own (`expiring_event`)."""
    if notice.event.partition(".")[0] != "expiring":
        return ""
    if notice.event == expiring_event(notice.input_request.round.extensions):
        return ""
    return "not sent: the deadline it warned of was extended before the notice went out"


# Between a team's addresses: commas, semicolons or white space (the admin's field is a text area, filled in
# one address a line as often as not); an address holds none of them.
ADDRESS_BREAK = re.compile(r"[,;\s]+")


def _recipients(team: Team) -> list[str]:
    return [address for address in ADDRESS_BREAK.split(team.notify_emails) if address]


def _unaddressed(notice: Notification) -> str:
    """Why `notice` has nowhere to go, or "": its team's addresses or chat webhook were removed after it was
    queued. Sent, it would be recorded as sent to nobody (mail to no recipient is no error to Django)."""
    if notice.kind == Notification.Kind.EMAIL and not _recipients(notice.team):
        return "not sent: the team no longer has addresses for notices"
    if notice.kind == Notification.Kind.CHAT and not notice.team.chat_webhook_url:
        return "not sent: the team no longer has a chat webhook"
    return ""


LAST_TRY_LOST = "given up: its last try ended without an outcome"


def notification_send(*, notification_id: Any, when_due: bool = False) -> float | None:
    """Try one notice. Returns a countdown when it should be tried again.

    One try at a time, as a webhook's: a second task for the notice (the sweep's, queued while a late retry
    still waited in a backlog) that runs while another worker is sending it does nothing, instead of posting
    the same notice to the team's chat or mail a second time. `when_due` (the task's tries): nor does one
    that runs after a failed try and before the retry that try scheduled could (`webhooks.too_soon_after`):
    tasks piled up while workers were down, drained together, would each post it at once and spend its
    tries in seconds, past the wait the chat asked for."""
    with try_lock(f"notice:{notification_id}") as mine:
        if not mine or (when_due and _tried_lately(notification_id)):
            return None
        return _send(notification_id)


def _tried_lately(notification_id: Any) -> bool:
    last = (
        Notification.objects.filter(pk=notification_id, status=Notification.Status.PENDING)
        .values_list("attempts", "last_attempt_at", "last_error")
        .first()
    )
    if last is None:
        return False
    attempts, tried_at, error = last
    if not (attempts and error) or tried_at is None:
        return False
    return too_soon_after(tried_at, attempts, error)


def _send(notification_id: Any) -> float | None:
    notice = (
        Notification.objects.select_related("team", "input_request__round__call__server")
        .filter(pk=notification_id, status=Notification.Status.PENDING)
        .first()
    )
    if notice is None:
        return None
    moot = _moot(notice.input_request) or _superseded(notice) or _unaddressed(notice)
    if moot:
        Notification.objects.filter(pk=notice.pk, status=Notification.Status.PENDING).update(
            status=Notification.Status.FAILED, last_error=moot
        )
        return None
    if notice.attempts >= settings.ELICIT_NOTIFY_MAX_ATTEMPTS:
        # Its last try ended with its worker (no outcome recorded) and the sweep queued it again: given up,
        # as that try would have been, rather than sent once more than the teams were promised.
        Notification.objects.filter(pk=notice.pk, status=Notification.Status.PENDING).update(
            status=Notification.Status.FAILED, last_error=LAST_TRY_LOST
        )
        return None
    Notification.objects.filter(pk=notice.pk).update(
        attempts=F("attempts") + 1, last_attempt_at=timezone.now()
    )
    attempt = notice.attempts + 1
    subject, body = _text(notice)
    error, final = "", False
    retry_after: float | None = None
    try:
        if notice.kind == Notification.Kind.EMAIL:
            _send_mail(subject, body, _recipients(notice.team))
        else:
            response = netguard.post(
                notice.team.chat_webhook_url,
                json={"text": _chat_text(body)},
                timeout=settings.ELICIT_WEBHOOK_TIMEOUT,
            )
            if response.status_code == GONE:  # the chat's webhook is gone (an archived channel): no retry
                raise ReceiverGone(GONE_ERROR)
            if not response.is_success:  # not raise_for_status(): its message holds the URL, a secret
                retry_after = asked_wait(response)
                raise ReceiverFailed(failed_status(response.status_code, retry_after))
    except (ReceiverGone, ReceiverFailed) as exc:
        error, final = str(exc), isinstance(exc, ReceiverGone)
    except Exception as exc:  # any other failure of the transport is retried, then recorded
        error = failure(exc)  # on one line, as a webhook's attempt records it; never the URL
        final = isinstance(exc, netguard.OutboundRefused) and not exc.transient
    if error:
        countdown = (
            None
            if final
            else retry_countdown(
                attempt, max_attempts=settings.ELICIT_NOTIFY_MAX_ATTEMPTS, retry_after=retry_after
            )
        )
        Notification.objects.filter(pk=notice.pk).update(
            last_error=error,
            status=Notification.Status.FAILED if countdown is None else Notification.Status.PENDING,
        )
        return countdown
    Notification.objects.filter(pk=notice.pk).update(
        status=Notification.Status.SENT, sent_at=timezone.now(), last_error=""
    )
    return None
