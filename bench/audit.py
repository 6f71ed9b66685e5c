"""Benchmark the audit page's queries: p50/p95 per kind and overall, then EXPLAIN of the main search.

    make bench BENCH="seed_audit --count 1000000"   # with DATABASE_URL naming a throwaway database
    make bench BENCH="audit --runs 40"

Every query is the one the page runs (the filter form, ``visible_audit_events``, keyset page of 50), timed
end to end through the ORM, with words drawn from the seeded vocabulary so the cache is not one query's.
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Callable
from datetime import timedelta
from types import SimpleNamespace
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import connection, transaction

from approvals.audit.forms import AuditFilterForm
from approvals.audit.queries import SEARCH_WINDOW, events_for, is_text_search, page
from approvals.models import AuditEvent
from bench.seed_audit import ENVS, REVIEWERS, SERVERS, SERVICES

COMMON = ["production", "staging", "deploy", "approve", "ausgerollt", "checkout", "payments", "refund"]
PHRASES = ['"change freeze"', '"tests are red"', '"keine freigabe"', '"wrong environment"']
RARE_REASONS = ["vendredi", "responsable", "abstimmen", "تست‌ها", "duplicate"]  # noqa: RUF001


def scenarios(rng: random.Random, head: int) -> dict[str, Callable[[], dict[str, Any]]]:
    server = lambda: rng.choice(SERVERS)  # noqa: E731
    return {
        "search common word": lambda: {"q": rng.choice(COMMON)},
        "search two words": lambda: {"q": f"{rng.choice(SERVICES)} {rng.choice(ENVS)}"},
        "search phrase": lambda: {"q": rng.choice(PHRASES)},
        "search rare word": lambda: {"q": rng.choice(RARE_REASONS)},
        "search order id": lambda: {"q": f"ORD-{rng.randint(100000, 999999)}"},
        "search + team": lambda: {"q": rng.choice(COMMON), "team": rng.choice(SERVERS[:8])[1]},
        "search + server + verb": lambda: {
            "q": rng.choice(ENVS),
            "server": server()[0],
            "verb": "input.requested",
        },
        "search + last 7 days": lambda: {"q": rng.choice(COMMON), "_recent_days": 7},
        "search, page 20": lambda: {"q": rng.choice(COMMON), "_pages": 20},
        "team only": lambda: {"team": rng.choice(SERVERS[:8])[1]},
        "verb + action": lambda: {"verb": "input.answered", "action": rng.choice(["decline", "cancel"])},
        "actor": lambda: {"actor": rng.choice(REVIEWERS)},
        "server + outcome": lambda: {"server": server()[0], "outcome": rng.choice(["expired", "failed"])},
        "tool + month": lambda: {"tool": rng.choice(server()[2]), "_recent_days": 30},
        "no filter, deep page": lambda: {"_before": rng.randint(1, max(head, 1))},
    }


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


class Command(BaseCommand):
    help = "Time the audit page's search queries (p50/p95) and print EXPLAIN of the main one."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--runs", type=int, default=40, help="runs per kind of query")
        parser.add_argument("--user", help="run as this user (default: a superuser's view)")
        parser.add_argument("--seed", type=int, default=1)

    def handle(self, *args: Any, **options: Any) -> None:
        user = self._user(options["user"])
        head = AuditEvent.objects.order_by("-id").values_list("id", "at").first()
        if head is None:
            raise CommandError("the audit log is empty: run seed_audit first")
        total = AuditEvent.objects.count()
        self.stdout.write(
            f"{total:,} events; {options['runs']} runs per kind; as {getattr(user, 'username', 'superuser')}"
        )
        rng = random.Random(options["seed"])
        timings: dict[str, list[float]] = {}
        kinds = scenarios(rng, head[0])
        self._run(user, kinds["search common word"](), head)  # warm the connection
        for _ in range(options["runs"]):
            for name, make in kinds.items():
                timings.setdefault(name, []).append(self._run(user, make(), head))
        width = max(len(name) for name in timings)
        self.stdout.write(f"{'query':<{width}}  {'p50 ms':>8}  {'p95 ms':>8}  {'max ms':>8}")
        everything = [value for values in timings.values() for value in values]
        for name, values in [*timings.items(), ("ALL", everything)]:
            p50, p95 = statistics.median(values), percentile(values, 0.95)
            self.stdout.write(f"{name:<{width}}  {p50:8.1f}  {p95:8.1f}  {max(values):8.1f}")
        explains = [
            ("the main search: a common word, first page, in the window", {"q": "production"}, SEARCH_WINDOW),
            ("a phrase, in the window", {"q": '"change freeze"'}, SEARCH_WINDOW),
            ("an order number, on the whole table (fewer matches than a page)", {"q": "ORD-424242"}, None),
            ("a rare word and a server, on the whole table", {"q": "responsable", "server": "crm"}, None),
        ]
        for title, params, window in explains:
            self.stdout.write(f"\nEXPLAIN (ANALYZE, BUFFERS) of {title}:")
            self.stdout.write(self._explain(user, params, head[0] + 1, window))

    def _user(self, username: str | None) -> Any:
        if not username:
            return SimpleNamespace(
                is_authenticated=True, is_superuser=True, is_staff=True, username="superuser"
            )
        try:
            return get_user_model().objects.get(username=username)
        except get_user_model().DoesNotExist:
            raise CommandError(f"no user {username!r}") from None

    def _filters(self, params: dict[str, Any], head: tuple[int, Any]) -> tuple[dict[str, Any], int | None]:
        params = dict(params)
        pages = params.pop("_pages", 0)
        before = params.pop("_before", None)
        recent = params.pop("_recent_days", None)
        if recent:
            params["since"] = (head[1] - timedelta(days=recent)).isoformat()
        form = AuditFilterForm(params)
        if not form.is_valid():
            raise CommandError(f"invalid filters {params}: {form.errors.as_text()}")
        return {**form.cleaned_data, "_pages": pages}, before

    def _run(self, user: Any, params: dict[str, Any], head: tuple[int, Any]) -> float:
        """Milliseconds for one page; of a deep page only the last is timed (keyset pages cost alike)."""
        filters, before = self._filters(params, head)
        cursor: int | None = before or head[0] + 1
        for _ in range(filters.pop("_pages")):
            _, cursor = page(events_for(user, filters), cursor, windowed=is_text_search(filters))
            if cursor is None:
                cursor = head[0] + 1
        started = time.perf_counter()
        page(events_for(user, filters), cursor, windowed=is_text_search(filters))
        return (time.perf_counter() - started) * 1000

    def _explain(self, user: Any, params: dict[str, Any], before: int, window: int | None) -> str:
        """The query page() runs for the window of a first page, or for the whole table, explained."""
        filters, _ = self._filters(params, (0, None))
        filters.pop("_pages")
        qs = events_for(user, filters).filter(id__lt=before)
        if window is None:
            return qs.defer("search").order_by("-id")[:51].explain(analyze=True, buffers=True)
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("SET LOCAL enable_bitmapscan = off")
            qs = qs.filter(id__gte=before - window).defer("search").order_by("-id")[:51]
            return qs.explain(analyze=True, buffers=True)
