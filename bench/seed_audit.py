"""Seed the audit log with realistic, correctly chained events, fast: COPY in batches, hashes computed here.

    make bench BENCH="seed_audit --count 1000000 --days 400"

Each batch is appended through the audit core's ``append_many`` (the chain lock, ids reserved from the
sequence, a link to the current head, one COPY in one transaction), so the chain verifies afterwards and
ordinary writers can keep appending between batches. Meant for benchmarks and demos; it never touches
existing rows.
"""

from __future__ import annotations

import random
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

from django.core.management.base import BaseCommand, CommandParser
from django.db import connection

from approvals.audit import core as audit

SERVERS = [
    ("deploy-bot", "release", ["create_deployment", "rollback_deployment", "promote_release"]),
    ("k8s-prod", "platform", ["scale_deployment", "delete_namespace", "apply_manifest", "drain_node"]),
    ("github", "developers", ["merge_pull_request", "create_release", "delete_branch"]),
    ("billing", "finance", ["issue_refund", "change_plan", "cancel_subscription"]),
    ("postgres-admin", "data", ["run_migration", "drop_table", "restore_backup"]),
    ("aws-infra", "platform", ["terminate_instance", "rotate_access_key", "update_security_group"]),
    ("crm", "sales", ["export_contacts", "send_campaign", "merge_accounts"]),
    ("hr-portal", "people", ["approve_leave", "update_salary", "offboard_employee"]),
    ("slack", "", ["post_announcement", "invite_guest"]),
    ("sentry", "developers", ["resolve_issue", "mute_alert"]),
]
AGENTS = ["ci-bot", "release-agent", "claude-runner", "ops-copilot", "nightly-sync", "support-assistant"]
REVIEWERS = [
    "alice", "bob", "carol", "dave", "jürgen.müller", "sara.ahmadi", "chloé.martin", "mehdi.rahimi",
    "lena.schmidt", "yuki.tanaka", "olivia", "noah", "amir.karimi", "françois", "zeynep",
]  # fmt: skip
SERVICES = ["checkout", "payments", "search-api", "auth", "inventory", "mobile-gateway", "reports", "ledger"]
ENVS = ["staging", "production", "eu-west-1", "us-east-2", "canary"]
MESSAGES = [
    "Deploy {service} {version} to {env}?",
    "Approve rollback of {service} on {env} to {version}",
    "The agent wants to scale {service} in {env} to {n} replicas. Continue?",
    "Refund {n} EUR to customer {customer} for order {order}?",
    "Soll {service} {version} in {env} ausgerollt werden?",
    "Bitte bestätigen: Migration {version} auf der Datenbank {service} ({env}) ausführen.",
    "Rückerstattung von {n} EUR für Bestellung {order} freigeben?",
    "Déployer {service} {version} en {env} ?",
    "Confirmer la suppression de la branche {service}-{version}.",
    "¿Aprobar el despliegue de {service} {version} en {env}?",
    "آیا نسخه {version} از {service} روی {env} منتشر شود؟",
    "لطفاً حذف فضای نام {service} در {env} را تأیید کنید.",
    "Rotate the access key for {service} in {env} now?",
    "Merge pull request #{n} into main for {service}?",
]
REASONS = [
    "Change freeze until Monday",
    "Not during business hours, please",
    "Tests are red on main",
    "Wrong environment: this should go to staging first",
    "Duplicate of an earlier request",
    "Keine Freigabe ohne Ticket",
    "Bitte zuerst mit dem Team abstimmen",
    "Pas de déploiement le vendredi",
    "لطفاً ابتدا تست‌ها را اجرا کنید",  # noqa: RUF001
    "Falta la aprobación del responsable",
    "Looks good, ship it",
    "",
]
ERRORS = [
    ("timeout", "The server did not answer within 30 s"),
    ("http_503", "Service unavailable: upstream is restarting"),
    ("invalid_params", "Unknown environment"),
    ("rejected_state", "The server rejected the request state"),
]


def call_flow(rng: random.Random) -> Iterator[dict[str, Any]]:
    """The events of one call, in the shape the engine records them."""
    server, team, tools = rng.choice(SERVERS)
    tool = rng.choice(tools)
    call_id = str(uuid.UUID(int=rng.getrandbits(128), version=4))
    agent = rng.choice(AGENTS)
    words = {
        "service": rng.choice(SERVICES),
        "env": rng.choice(ENVS),
        "version": f"{rng.randint(1, 9)}.{rng.randint(0, 30)}.{rng.randint(0, 9)}",
        "n": rng.randint(2, 900),
        "customer": f"C-{rng.randint(10000, 99999)}",
        "order": f"ORD-{rng.randint(100000, 999999)}",
    }
    base = {"call_id": call_id, "server_slug": server, "team_slug": team, "tool": tool}
    system = {"actor_type": "system", "actor_id": "", "actor_label": "hub"}
    arguments = {"service": words["service"], "environment": words["env"], "version": words["version"]}
    yield {
        **base,
        "actor_type": "agent",
        "actor_id": str(AGENTS.index(agent) + 1),
        "actor_label": agent,
        "verb": "call.submitted",
        "data": {"tool": tool, "arguments": arguments, "on_behalf_of": rng.choice(REVIEWERS)},
    }
    if rng.random() < 0.08:
        code, message = rng.choice(ERRORS)
        yield {**base, **system, "verb": "call.retry_scheduled", "data": {"code": code, "message": message}}
    if rng.random() < 0.1:
        yield {**base, **system, "verb": "call.completed", "data": {"is_error": False}}
        return
    keys = ["approval"] if rng.random() < 0.8 else ["approval", "environment"]
    yield {
        **base,
        **system,
        "verb": "round.opened",
        "data": {"round": 1, "keys": keys, "has_request_state": True},
    }
    requests = {key: str(uuid.UUID(int=rng.getrandbits(128), version=4)) for key in keys}
    message = rng.choice(MESSAGES).format(**words)
    for key, ir in requests.items():
        yield {
            **base,
            **system,
            "input_request_id": ir,
            "verb": "input.requested",
            "data": {"key": key, "mode": "form", "message": message, "problem": "", "flags": []},
        }
    fate = rng.random()
    outcome = "answered"
    for key, ir in requests.items():
        if fate < 0.07:
            outcome = "expired"
            yield {**base, **system, "input_request_id": ir, "verb": "input.expired", "data": {"key": key}}
            continue
        reviewer = rng.choice(REVIEWERS)
        action = "accept" if fate < 0.8 else ("decline" if fate < 0.95 else "cancel")
        yield {
            **base,
            "actor_type": "user",
            "actor_id": str(REVIEWERS.index(reviewer) + 1),
            "actor_label": reviewer,
            "input_request_id": ir,
            "verb": "input.answered",
            "data": {
                "key": key,
                "action": action,
                "content": {"confirm": True, "environment": words["env"]} if action == "accept" else None,
                "reason": rng.choice(REASONS) if action != "accept" or rng.random() < 0.2 else "",
            },
        }
    yield {**base, **system, "verb": "round.answered", "data": {"round": 1, "outcome": outcome}}
    if outcome == "expired":
        yield {**base, **system, "verb": "call.expired", "data": {"is_error": False}}
    elif rng.random() < 0.05:
        code, text = rng.choice(ERRORS)
        yield {**base, **system, "verb": "call.failed", "data": {"error": {"code": code, "message": text}}}
    else:
        yield {**base, **system, "verb": "call.completed", "data": {"is_error": rng.random() < 0.03}}


def events(rng: random.Random) -> Iterator[dict[str, Any]]:
    while True:
        yield from call_flow(rng)


class Command(BaseCommand):
    help = "Append N realistic, correctly chained audit events (default 1,000,000) for benchmarks and demos."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--count", type=int, default=1_000_000)
        parser.add_argument("--days", type=float, default=400.0, help="spread the events over this many days")
        parser.add_argument("--batch", type=int, default=20_000)
        parser.add_argument("--seed", type=int, default=6)

    def handle(self, *args: Any, **options: Any) -> None:
        count, batch = options["count"], max(1, options["batch"])
        rng = random.Random(options["seed"])
        source = events(rng)
        end = datetime.now(UTC)
        step = timedelta(days=options["days"]) / max(count, 1)
        start = end - step * count
        started = time.monotonic()
        done = 0
        while done < count:
            size = min(batch, count - done)
            self._write_batch(source, size, start + step * done, step)
            done += size
            rate = done / max(time.monotonic() - started, 1e-6)
            self.stdout.write(f"{done:,} / {count:,} events ({rate:,.0f}/s)")
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE approvals_auditevent")
        self.stdout.write(
            self.style.SUCCESS(f"seeded {count:,} events in {time.monotonic() - started:.0f} s")
        )

    def _write_batch(
        self, source: Iterator[dict[str, Any]], size: int, first_at: datetime, step: timedelta
    ) -> None:
        audit.append_many([{**next(source), "at": first_at + step * offset} for offset in range(size)])
