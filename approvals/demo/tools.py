"""The demo's product tools: what a reviewer sees in Elicit Hub.

Each tool that needs a human ends its round with `input_required` and decides on the retry, from
its own `requestState` and the `inputResponses`, whether to finish, ask again or stop.
"""

from __future__ import annotations

import json
import secrets
from typing import Any
from urllib.parse import quote

from mcp.server.mcpserver import Context, MCPServer
from mcp_types import CallToolResult, InputRequiredResult, ToolAnnotations

from approvals.demo import rounds
from approvals.demo.eras import dual_era

ENVIRONMENT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "environment": {
            "type": "string",
            "title": "Environment",
            "description": "Where the branch is deployed.",
            "oneOf": [
                {"const": "staging", "title": "Staging"},
                {"const": "production", "title": "Production"},
            ],
            "default": "staging",
        }
    },
    "required": ["environment"],
}

CONFIRM_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "confirm": {
            "type": "boolean",
            "title": "Deploy to production",
            "description": "Releases the branch to every customer.",
            "default": False,
        },
        "reason": {
            "type": "string",
            "title": "Reason",
            "description": "Optional note kept with the deployment.",
            "maxLength": 500,
        },
    },
    "required": ["confirm"],
}

MEETING_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "title": {
            "type": "string",
            "title": "Title",
            "description": "What the meeting is about.",
            "minLength": 3,
            "maxLength": 80,
            "default": "Release review",
        },
        "organizer_email": {"type": "string", "format": "email", "title": "Organizer email"},
        "agenda_url": {
            "type": "string",
            "format": "uri",
            "title": "Agenda",
            "description": "Link to the agenda document.",
        },
        "date": {"type": "string", "format": "date", "title": "Date"},
        "starts_at": {"type": "string", "format": "date-time", "title": "Starts at"},
        "duration_hours": {
            "type": "number",
            "title": "Duration (hours)",
            "minimum": 0.25,
            "maximum": 8,
            "default": 1,
        },
        "attendees": {
            "type": "integer",
            "title": "Expected attendees",
            "minimum": 2,
            "maximum": 50,
            "default": 4,
        },
        "recorded": {"type": "boolean", "title": "Record the meeting", "default": False},
        "room": {
            "type": "string",
            "title": "Room",
            "enum": ["atlas", "borealis", "cosmos"],
            "default": "atlas",
        },
        "priority": {
            "type": "string",
            "title": "Priority",
            "oneOf": [
                {"const": "low", "title": "Low"},
                {"const": "normal", "title": "Normal"},
                {"const": "high", "title": "High"},
            ],
            "default": "normal",
        },
        "timezone": {
            "type": "string",
            "title": "Time zone",
            "enum": ["UTC", "Europe/Paris", "America/New_York"],
            "enumNames": ["UTC", "Paris (CET)", "New York (ET)"],
        },
        "topics": {
            "type": "array",
            "title": "Topics",
            "description": "Pick one to three.",
            "items": {"type": "string", "enum": ["roadmap", "budget", "hiring", "incidents"]},
            "minItems": 1,
            "maxItems": 3,
            "default": ["roadmap"],
        },
        "equipment": {
            "type": "array",
            "title": "Equipment",
            "items": {
                "anyOf": [
                    {"const": "projector", "title": "Projector"},
                    {"const": "whiteboard", "title": "Whiteboard"},
                    {"const": "video", "title": "Video conferencing"},
                ]
            },
            "maxItems": 3,
            "default": [],
        },
    },
    "required": ["title", "organizer_email", "date", "starts_at", "duration_hours", "room", "topics"],
}


async def create_deployment(
    branch: str, ctx: Context, environment: str | None = None
) -> CallToolResult | InputRequiredResult:
    """Deploy a branch. A reviewer picks the environment unless the caller named it; production needs a
    confirmation."""
    if rounds.state(ctx).get("step") == "confirm":
        return _confirm_production(branch, ctx)
    if environment == "production":
        return _ask_confirmation(ctx, branch)
    if environment == "staging":
        return _deploy(branch, environment)
    answer = rounds.reply(ctx, "environment", ENVIRONMENT_SCHEMA)
    if answer.refused:
        return rounds.refusal(answer, f"Deployment of {branch}")
    if answer.content is None:
        message = rounds.with_problem(f"Which environment should {branch} be deployed to?", answer.problem)
        return rounds.ask(
            ctx, {"environment": rounds.form(message, ENVIRONMENT_SCHEMA)}, {"step": "environment"}
        )
    environment = answer.content["environment"]
    if environment == "production":
        return _ask_confirmation(ctx, branch)
    return _deploy(branch, environment)


def _ask_confirmation(ctx: Context, branch: str, problem: str | None = None) -> InputRequiredResult:
    summary = (
        f"Deploy {branch} to PRODUCTION?\n"
        f"Branch: {branch}\nEnvironment: production\n"
        "This replaces the running release for every customer."
    )
    message = rounds.with_problem(summary, problem)
    return rounds.ask(ctx, {"confirm": rounds.form(message, CONFIRM_SCHEMA)}, {"step": "confirm"})


def _confirm_production(branch: str, ctx: Context) -> CallToolResult | InputRequiredResult:
    answer = rounds.reply(ctx, "confirm", CONFIRM_SCHEMA)
    if answer.refused:
        return rounds.refusal(answer, f"Deployment of {branch} to production")
    if answer.content is None:
        return _ask_confirmation(ctx, branch, answer.problem)
    if not answer.content["confirm"]:
        return rounds.result(
            f"Deployment of {branch} to production was not confirmed by the reviewer.",
            {"outcome": "not_confirmed"},
            error=True,
        )
    return _deploy(branch, "production", answer.content.get("reason"))


def _deploy(branch: str, environment: str, reason: str | None = None) -> CallToolResult:
    # A fresh id per run lets tests tell a replayed answer from a second deployment.
    deployment = {
        "branch": branch,
        "environment": environment,
        "deployment_id": f"dep-{secrets.token_hex(4)}",
    }
    if reason:
        deployment["reason"] = reason
    return rounds.result(f"Deployed {branch} to {environment}", deployment)


async def connect_account(service: str, ctx: Context) -> CallToolResult | InputRequiredResult:
    """Connect a third-party account: the reviewer signs in on the provider's own page (URL mode)."""
    attempt = rounds.state(ctx).get("attempt")
    answer = rounds.reply(ctx, "sign_in")
    if answer.refused:
        return rounds.refusal(answer, f"Connecting {service}")
    if answer.accepted and attempt:
        return rounds.result(f"Connected {service}", {"service": service, "connected": True})
    # The URL carries only an opaque attempt id: the spec forbids secrets or PII in elicitation URLs.
    attempt = secrets.token_urlsafe(9)
    target = f"https://accounts.example.com/connect/{quote(service, safe='')}?attempt={attempt}"
    message = f"Sign in to {service} in your browser to connect it to the demo workspace."
    return rounds.ask(ctx, {"sign_in": rounds.url(message, target)}, {"attempt": attempt})


async def schedule_meeting(ctx: Context) -> CallToolResult | InputRequiredResult:
    """Schedule a meeting from one form that uses every field shape an elicitation form may have."""
    answer = rounds.reply(ctx, "meeting", MEETING_SCHEMA)
    if answer.refused:
        return rounds.refusal(answer, "Scheduling the meeting")
    if answer.content is None:
        message = rounds.with_problem("Plan the meeting.", answer.problem)
        return rounds.ask(ctx, {"meeting": rounds.form(message, MEETING_SCHEMA)})
    return rounds.result(json.dumps(answer.content, sort_keys=True), answer.content)


def echo(text: str) -> str:
    """Return the text unchanged (no input needed)."""
    return text


def fail() -> CallToolResult:
    """Always fail with a tool error (isError: true)."""
    return rounds.result("The demo tool failed on purpose.", error=True)


def register(mcp: MCPServer) -> None:
    mcp.add_tool(
        dual_era(create_deployment),
        title="Create a deployment",
        annotations=ToolAnnotations(destructive_hint=True, idempotent_hint=False),
    )
    mcp.add_tool(dual_era(connect_account), title="Connect an account")
    mcp.add_tool(dual_era(schedule_meeting), title="Schedule a meeting")
    mcp.add_tool(echo, title="Echo", annotations=ToolAnnotations(read_only_hint=True))
    mcp.add_tool(fail, title="Fail", annotations=ToolAnnotations(read_only_hint=True))
