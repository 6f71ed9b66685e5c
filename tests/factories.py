"""Named personas and small builders for tests (no fixtures library: the model is small)."""

from __future__ import annotations

import html
import re
import uuid
from datetime import timedelta
from typing import Any

from django.contrib.auth import get_user_model
from django.db import transaction
from django.utils import timezone

from approvals.models import AgentClient, InputRequest, McpServer, Membership, Round, Team, ToolCall
from approvals.services import calls, tokens

ENVIRONMENT_SCHEMA = {
    "type": "object",
    "properties": {"environment": {"type": "string", "enum": ["staging", "production"]}},
    "required": ["environment"],
}


def client_address() -> str:
    """A client address no other test and no earlier run has used (IPv6 documentation range, 96 random
    bits): rate limit counters live in Redis past the end of a run, so a shared or small range of addresses
    could find a count left by another test or an earlier run on the same Redis."""
    bits = uuid.uuid4().int
    groups = [(bits >> shift) & 0xFFFF for shift in range(0, 96, 16)]
    return "2001:db8:" + ":".join(f"{group:x}" for group in groups)


def user(username: str, **extra: Any) -> Any:
    return get_user_model().objects.create_user(username=username, password="pw-" + username, **extra)


def team(slug: str = "release", *members: tuple[Any, str]) -> Team:
    t, _ = Team.objects.get_or_create(slug=slug, defaults={"name": slug.title()})
    for member, role in members:
        Membership.objects.create(team=t, user=member, role=role)
    return t


def server(slug: str = "deploy", url: str = "http://127.0.0.1:9/mcp", **extra: Any) -> McpServer:
    return McpServer.objects.create(
        slug=slug, name=extra.pop("name", slug.title() + " server"), url=url, **extra
    )


def agent(
    name: str = "ci-bot", servers: list[McpServer] | None = None, **extra: Any
) -> tuple[AgentClient, str]:
    return tokens.agent_create(name=name, servers=servers or [], **extra)


def call(srv: McpServer, ag: AgentClient | None = None, **extra: Any) -> ToolCall:
    return ToolCall.objects.create(
        server=srv,
        agent=ag,
        tool=extra.pop("tool", "create_deployment"),
        arguments=extra.pop("arguments", {"branch": "main"}),
        **extra,
    )


def finish_call(call_id: Any) -> None:
    """Complete the call as a server's result does (``calls.call_finish``: its notice goes once committed)."""
    with transaction.atomic():
        c = ToolCall.objects.select_related("server").get(pk=call_id)
        calls.call_finish(call=c, status=ToolCall.Status.COMPLETED, result={"content": [], "isError": False})


def open_round(
    c: ToolCall,
    number: int = 1,
    keys: tuple[str, ...] = ("environment",),
    team_: Team | None = None,
    request_state: str | None = "opaque-state",
) -> Round:
    now = timezone.now()
    rnd = Round.objects.create(
        call=c, number=number, deadline=now + timedelta(hours=1), request_state=request_state
    )
    for key in keys:
        InputRequest.objects.create(
            round=rnd, key=key, message=f"Pick the {key}", requested_schema=ENVIRONMENT_SCHEMA, team=team_
        )
    ToolCall.objects.filter(pk=c.pk).update(status=ToolCall.Status.AWAITING_INPUT)
    return rnd


def second_look_fields(page: str) -> dict[str, list[str]]:
    """The hidden fields of a gate's second-look form (``approvals.second_look``) as the page holds them,
    without the CSRF token: what its "Confirm and send" posts."""
    section = page[page.index("data-second-look") :]
    form = section[: section.index("</form>")]
    fields: dict[str, list[str]] = {}
    for name, value in re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)"', form):
        if name != "csrfmiddlewaretoken":
            fields.setdefault(html.unescape(name), []).append(html.unescape(value))
    return fields


def through_second_look(client: Any, url: str, data: dict[str, Any]) -> Any:
    """POST a risky approval as a browser does (``approvals.second_look``): the first answer is the review,
    whose own form is then sent as shown (a gate's hidden fields, or the answer form with its token)."""
    review = client.post(url, data)
    assert review.status_code == 200 and "data-second-look" in review.text, review.text[:2000]
    section = review.text[review.text.index("data-second-look") :]
    if "<form" in section[: section.index("</section>")]:
        return client.post(url, second_look_fields(review.text))
    token = re.search(r'name="reviewed" value="([^"]+)"', review.text)
    assert token is not None
    return client.post(url, {**data, "reviewed": html.unescape(token.group(1))})
