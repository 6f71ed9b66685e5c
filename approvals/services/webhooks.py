"""Webhooks to agents, signed per Standard Webhooks, retried with backoff, every attempt recorded."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import logging
import random
import re
import time
from datetime import datetime, timedelta
from typing import Any

import httpx
from django.conf import settings
from django.db.models import F, Max, OuterRef, Subquery
from django.utils import timezone

from approvals import netguard, selectors
from approvals.mcp_client.wire import parse_retry_after
from approvals.models import ToolCall, WebhookAttempt, WebhookDelivery
from approvals.queueing import DELIVER_WEBHOOK, enqueue_on_commit
from approvals.services import tokens
from approvals.services.locks import try_lock

logger = logging.getLogger(__name__)


def sign(secret: str, msg_id: str, timestamp: int, body: bytes) -> str:
    """The ``webhook-signature`` header value: ``v1,<base64 HMAC-SHA256 of "id.timestamp.body">``."""
    key = base64.b64decode(secret.removeprefix("whsec_"))
    signed = f"{msg_id}.{timestamp}.".encode() + body
    return "v1," + base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()


# The answers whose Retry-After a receiver's next try waits for (RFC 9110, RFC 6585): it is busy or rate
# limiting, and says when to come back.
WAIT_ASKED = (429, 503)
ASKED_TO_WAIT = "the receiver asked to wait"


def retry_wait(backoff: float, *, retry_after: float | None, cap: float) -> float:
    """Seconds before an outbound request is tried again (a webhook, a team notice, a send to an MCP server).

    Without a wait asked for, a random time between half of `backoff` and all of it, so that deliveries that
    failed together (a receiver down for a minute) do not come back together. With one (the receiver's
    Retry-After, in seconds), no sooner than it asked, spread over a tenth more (a second at least), and
    never past `cap`: a receiver asking for longer, or for ever, is tried again in the last tenth before it.
    """
    backoff = min(backoff, cap)
    wait = backoff * random.uniform(0.5, 1.0)
    if retry_after is None or not retry_after > 0:  # none, none left (a date passed), or NaN
        return wait
    spread = max(1.0, min(retry_after, cap) / 10)
    if retry_after >= cap:
        asked = random.uniform(max(0.0, cap - spread), cap)
    else:
        asked = random.uniform(retry_after, min(cap, retry_after + spread))
    return max(wait, asked)


def asked_wait(response: httpx.Response) -> float | None:
    """The wait a receiver's failed answer asks for: its Retry-After (seconds or an HTTP date) on a 429 or a
    503, else None. A value that cannot be read, or a date already past, asks for nothing."""
    if response.status_code not in WAIT_ASKED:
        return None
    wait = parse_retry_after(response.headers.get("retry-after"))
    return wait if wait else None


def failed_status(status_code: int, retry_after: float | None) -> str:
    """What a failed answer records: ``HTTP 503``, and the wait it asked for, which the next try honours up
    to the cap."""
    if retry_after is None:
        return f"HTTP {status_code}"
    return f"HTTP {status_code}; {ASKED_TO_WAIT} {min(retry_after, 1e9):.0f} s"


def retry_countdown(attempt: int, *, max_attempts: int, retry_after: float | None = None) -> float | None:
    """Seconds before the next try of an outbound delivery (agent webhooks, team notices), or None when
    ``attempt`` was the last one allowed: up to 2, 4, 8, ... seconds (`retry_wait`'s jitter), or what the
    receiver asked, capped at ELICIT_WEBHOOK_RETRY_MAX."""
    if attempt >= max_attempts:
        return None
    cap = settings.ELICIT_WEBHOOK_RETRY_MAX
    return retry_wait(float(min(cap, 2**attempt)), retry_after=retry_after, cap=cap)


def longest_countdown(attempt: int, *, asked: bool) -> float:
    """The longest `retry_countdown` can wait after `attempt`: the cap when the receiver asked for a wait."""
    cap = settings.ELICIT_WEBHOOK_RETRY_MAX
    return float(cap if asked else min(cap, 2**attempt))


# A receiver answering 410 Gone wants no more deliveries (Standard Webhooks): it is not tried again.
GONE = 410
GONE_ERROR = "HTTP 410 Gone: the receiver wants no more deliveries; not tried again"
DEACTIVATED_ERROR = "not sent: the agent is deactivated"


def failure(exc: Exception) -> str:
    """What an outbound request's failure records for the operator: its kind and what went wrong
    (``ConnectError: [Errno 111] Connection refused``, a certificate that does not verify, the receiver's
    deadline), on one line, at most 300 characters. The guard's and httpx's transport messages name a host
    at most, never the URL's path or query, where a receiver's token sits."""
    detail = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {detail or 'no answer'}"[:300]


def _payload(call_id: Any, event_type: str) -> dict[str, Any]:
    """The message: the event and the call's (or relay's) body as its GET answers it now."""
    call = selectors.calls_with_rounds().get(pk=call_id)
    data = selectors.relay_detail(call) if call.kind == ToolCall.Kind.RELAY else selectors.call_detail(call)
    return {"type": event_type, "data": data}


def webhook_queue(*, call: ToolCall, event_type: str) -> WebhookDelivery | None:
    """Snapshot the call and queue its delivery after commit. Runs inside the caller's transaction, which may
    change the call's rounds after this (a send's answer ends the call first, then closes its round): the
    first try takes the snapshot again, from what was committed."""
    if not call.callback_url:
        return None
    delivery, created = WebhookDelivery.objects.get_or_create(
        call=call,
        event_type=event_type,
        defaults={"url": call.callback_url, "payload": _payload(call.pk, event_type)},
    )
    if created:
        enqueue_on_commit(DELIVER_WEBHOOK, str(delivery.pk))
    return delivery


# A pending delivery whose next try is this late has lost its task (the broker failed as the delivery or its
# retry was queued, or took the message down with it): beat's `recover_stuck` queues it again, for as long
# as its call ended less than RECOVER_WITHIN ago (which keeps the sweep on the calls' finished_at index).
STALE_AFTER = timedelta(minutes=5)
RECOVER_WITHIN = timedelta(days=1)


def webhooks_recover(*, now: datetime) -> int:
    """Queue again the pending deliveries no task is trying: their next try is STALE_AFTER overdue."""
    last = WebhookAttempt.objects.filter(delivery=OuterRef("pk")).order_by("-number")
    pending = (
        WebhookDelivery.objects.filter(
            call__finished_at__gte=now - RECOVER_WITHIN,
            call__finished_at__lt=now - STALE_AFTER,
            status=WebhookDelivery.Status.PENDING,
        )
        .annotate(last_at=Max("attempt_log__at"), last_status=Subquery(last.values("status_code")[:1]))
        .values_list("pk", "attempts", "created_at", "last_at", "last_status")
    )
    requeued = 0
    for pk, attempts, created_at, last_at, last_status in pending:
        # The longest its retry may be waiting: one the receiver asked to wait (a 429, a 503) may wait up to
        # the cap, and queued again sooner it would be tried before its time, beside its own retry.
        wait = longest_countdown(attempts, asked=last_status in WAIT_ASKED) if attempts else 0
        if (last_at or created_at) + timedelta(seconds=wait) + STALE_AFTER <= now:
            enqueue_on_commit(DELIVER_WEBHOOK, str(pk))
            requeued += 1
    return requeued


def webhook_attempt(*, delivery_id: Any, when_due: bool = False) -> float | None:
    """Try one delivery. Returns a countdown when it should be tried again, else None.

    One try at a time: a second task for the delivery (the sweep's, queued while a late retry still waited
    in a backlog) that arrives while another worker is posting it does nothing. The worker posting it records
    the outcome and owns the retries; two POSTs at once would deliver it twice, and both would number their
    attempt alike (the second record failing after its POST, a success it made left unrecorded).

    `when_due` (the task's tries): nor does one that arrives after another worker's failed try and before the
    retry that try scheduled could, which already waits for its time. The sweep queues a delivery again every
    minute while its first task waits in a backlog (workers down, busy); drained together, each would post it
    at once, one after another, and start a retry chain of its own, spending the delivery's tries in
    seconds and past the Retry-After the receiver asked for."""
    with try_lock(f"webhook:{delivery_id}") as mine:
        if not mine or (when_due and _tried_lately(delivery_id)):
            return None
        return _attempt(delivery_id)


_ASKED = re.compile(rf"{ASKED_TO_WAIT} (\d+) s")


def shortest_countdown(attempt: int, *, retry_after: float | None) -> float:
    """The shortest `retry_countdown` can wait after `attempt` (`retry_wait`'s lower bounds)."""
    cap = float(settings.ELICIT_WEBHOOK_RETRY_MAX)
    shortest = min(cap, float(2 ** min(attempt, 64))) * 0.5
    if retry_after is not None and retry_after > 0:
        shortest = max(shortest, retry_after if retry_after < cap else cap - max(1.0, cap / 10))
    return shortest


def _tried_lately(delivery_id: Any) -> bool:
    """Whether the delivery's last failed try is too recent for the retry it scheduled to be running yet.

    That retry's eta was counted from after the try was recorded, on the clock that recorded it, and it runs
    once its worker's clock passes the eta: it never finds itself early. A task running sooner is another:
    the sweep's, or a first task queued again while it waited."""
    last = (
        WebhookAttempt.objects.filter(delivery_id=delivery_id)
        .order_by("-number")
        .values("number", "at", "error")
        .first()
    )
    if last is None or not last["error"]:
        return False
    return too_soon_after(last["at"], last["number"], last["error"])


def too_soon_after(tried_at: datetime, attempt: int, error: str) -> bool:
    """Whether it is too soon after a try that failed with `error` (a webhook's or a team notice's) for the
    retry it scheduled to be running: sooner than the shortest wait that retry may have (the wait the
    receiver asked for, as recorded), less a tenth (the retry's own start, its countdown, Celery's eta, is
    never earlier)."""
    asked = _ASKED.search(error)
    wait = shortest_countdown(attempt, retry_after=float(asked.group(1)) - 0.5 if asked else None)
    return timezone.now() < tried_at + timedelta(seconds=wait * 0.9)


def _attempt(delivery_id: Any) -> float | None:
    delivery = WebhookDelivery.objects.select_related("call__agent").filter(pk=delivery_id).first()
    if delivery is None or delivery.status != WebhookDelivery.Status.PENDING:
        return None
    if delivery.attempts >= settings.ELICIT_WEBHOOK_MAX_ATTEMPTS:
        # Its last try ended without an outcome (its worker died), and `webhooks_recover` queued it again.
        WebhookDelivery.objects.filter(pk=delivery.pk, status=WebhookDelivery.Status.PENDING).update(
            status=WebhookDelivery.Status.FAILED
        )
        return None
    number = WebhookDelivery.objects.filter(pk=delivery.pk).update(attempts=F("attempts") + 1) and (
        delivery.attempts + 1
    )
    agent = delivery.call.agent
    if agent is not None and not agent.is_active:
        # Deactivated (a leaked token, a retired bot): its callback is sent no more results, as the gateway
        # withholds them from an agent deactivated while it waits.
        WebhookAttempt.objects.create(delivery=delivery, number=number, error=DEACTIVATED_ERROR)
        WebhookDelivery.objects.filter(pk=delivery.pk).update(status=WebhookDelivery.Status.FAILED)
        return None
    payload = delivery.payload
    if number == 1:
        # The call as committed, as its GET answers: every later try sends these same bytes again.
        payload = _payload(delivery.call_id, delivery.event_type)
        WebhookDelivery.objects.filter(pk=delivery.pk).update(payload=payload)
    # Keys sorted: the stored payload comes back from PostgreSQL in jsonb's order, not the order written.
    body = json.dumps(payload, separators=(",", ":"), sort_keys=True).encode()
    timestamp = int(time.time())
    headers = {
        "content-type": "application/json",
        "webhook-id": str(delivery.pk),
        "webhook-timestamp": str(timestamp),
        "user-agent": "elicit-hub",
    }
    held = tokens.signing_secrets(agent, timezone.now()) if agent is not None else []
    if held:
        # One signature per secret, space-separated (Standard Webhooks): during a rotation's overlap a
        # receiver holding either secret verifies the delivery.
        headers["webhook-signature"] = " ".join(sign(s, str(delivery.pk), timestamp, body) for s in held)
    started = time.monotonic()
    status_code: int | None = None
    retry_after: float | None = None
    error = ""
    # No try after this one, whatever is left: the guard refused the URL, or the receiver is gone.
    final = False
    try:
        # Judged again at delivery (DNS may have changed since submit), sent to the address just checked.
        response = netguard.post(
            delivery.url, content=body, headers=headers, timeout=settings.ELICIT_WEBHOOK_TIMEOUT
        )
        status_code = response.status_code
        if status_code == GONE:
            error, final = GONE_ERROR, True
        elif not 200 <= status_code < 300:
            retry_after = asked_wait(response)
            error = failed_status(status_code, retry_after)
    except netguard.OutboundRefused as exc:
        error = f"refused: {exc}"[:300]
        final = not exc.transient
    except httpx.HTTPError as exc:
        error = failure(exc)
    duration = int((time.monotonic() - started) * 1000)
    WebhookAttempt.objects.create(
        delivery=delivery, number=number, status_code=status_code, error=error, duration_ms=duration
    )
    if not error:
        WebhookDelivery.objects.filter(pk=delivery.pk).update(
            status=WebhookDelivery.Status.DELIVERED, delivered_at=timezone.now()
        )
        return None
    countdown = (
        None
        if final
        else retry_countdown(
            number, max_attempts=settings.ELICIT_WEBHOOK_MAX_ATTEMPTS, retry_after=retry_after
        )
    )
    if countdown is None:
        WebhookDelivery.objects.filter(pk=delivery.pk).update(status=WebhookDelivery.Status.FAILED)
        logger.warning(
            "webhook %s for call %s: gave up after %s attempts", delivery.event_type, delivery.call_id, number
        )
    return countdown
