"""The audit chain against hostile data: what PostgreSQL changes, secrets by any name, hostile exports."""

from __future__ import annotations

import csv
import json
import re
import threading
from pathlib import Path

import pytest
from django.db import connection, transaction
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from approvals import safejson
from approvals.audit import core as audit
from approvals.audit import verify as audit_verify
from approvals.audit.core import REDACTED, Actor
from approvals.models import AuditEvent
from approvals.services import tokens
from tests import factories
from tests.hub import Agent

pytestmark = pytest.mark.django_db


def record(data: dict) -> AuditEvent:
    return audit.record(actor=Actor.system(), verb="call.retry_scheduled", data=data)


def stored(event: AuditEvent) -> dict:
    return AuditEvent.objects.get(pk=event.pk).data


# --- data PostgreSQL gives back otherwise is hashed as it will be read -----------------------------------


@pytest.mark.parametrize(
    ("data", "reads_back"),
    [
        ({"n": 1e16}, {"n": 10**16}),  # jsonb's numeric prints every digit: it reads back as an int
        ({"n": 1.2345678901234567e30}, {"n": 12345678901234567 * 10**14}),
        ({"n": -1.5e300}, {"n": -15 * 10**299}),
        ({"n": -0.0}, {"n": 0.0}),  # numeric has no negative zero
        ({"s": "a\x00b", "t": ["\ud800"]}, {"s": "a\ufffdb", "t": ["\ufffd"]}),  # not storable as text
        ({2: "two", None: "none", False: "no"}, {"2": "two", "null": "none", "false": "no"}),
        ({"n": 1e-7, "m": 5e-324, "k": 123.456, "big": 10**30}, {"n": 1e-7, "m": 5e-324, "k": 123.456}),
    ],
    ids=["1e16", "30-digits", "negative-huge", "negative-zero", "nul-surrogate", "non-string-keys", "kept"],
)
def test_data_the_database_would_change_is_recorded_as_it_reads_back_and_verifies(data, reads_back) -> None:
    event = record(data)
    after = record({"i": "after"})
    assert stored(event) == event.data
    assert {key: stored(event)[key] for key in reads_back} == reads_back
    report = audit.verify()
    assert report.ok, report.problem
    assert report.head_id == after.id


def test_an_agents_relay_with_huge_and_negative_zero_numbers_keeps_the_chain_verifying() -> None:
    deploy = factories.server("deploy")
    _, token = factories.agent("ci-bot", servers=[deploy])
    relay = {
        "server": "deploy",
        "tool": "create_deployment",
        "arguments": {"budget": 1e16, "offset": -0.0, "ratio": 0.25},
        "input_requests": {"ok": {"method": "elicitation/create", "params": {"message": "OK?"}}},
    }
    assert Agent(token).post("/relays", relay).status_code == 201
    submitted = AuditEvent.objects.get(verb="relay.submitted")
    assert submitted.data["arguments"] == {"budget": 10**16, "offset": 0.0, "ratio": 0.25}
    report = audit.verify()
    assert report.ok, f"event #{report.first_bad_id}: {report.problem}"
    assert audit.check_chain().ok


def test_a_batch_and_an_import_normalise_the_same_way() -> None:
    with audit.batched():
        record({"n": 1e20})
        record({"n": -0.0})
    audit.append_many(
        [
            {
                "at": timezone.now(),
                "actor_type": "system",
                "actor_id": "",
                "actor_label": "seed",
                "verb": "call.retry_scheduled",
                "data": {"n": 3e17, "s": "x\x00", "password": "hunter2"},
            }
        ]
    )
    rows = list(AuditEvent.objects.order_by("id").values_list("data", flat=True))
    assert rows == [{"n": 10**20}, {"n": 0.0}, {"n": 3 * 10**17, "s": "x\ufffd", "password": REDACTED}]
    assert audit.verify().ok


# --- what cannot be kept is refused before anything is written, and the chain goes on ---------------------


def nested(depth: int) -> dict:
    value: dict = {}
    for _ in range(depth):
        value = {"a": value}
    return value


@pytest.mark.parametrize(
    ("data", "reason", "where"),
    [
        ({"x": [1, float("inf")]}, "inf is not a JSON number", "$.x[1]"),
        ({"x": {"y": float("nan")}}, "nan is not a JSON number", "$.x.y"),
        ({"x": nested(3000)}, "nesting deeper than 100 levels", "$.x.a.a"),
        ({"x": {1: "a", "1": "b"}}, "two keys that are both '1' once stored", "$.x"),
        ({"x": {"a\x00": 1, "a\ufffd": 2}}, "two keys that are both", "$.x"),
        ({"when": object()}, "a object is not JSON", "$.when"),
    ],
    ids=["inf", "nan", "deep", "colliding-keys", "colliding-after-nul", "not-json"],
)
def test_data_that_cannot_be_kept_is_refused_naming_where_and_the_chain_goes_on(data, reason, where) -> None:
    before = record({"i": "before"})
    with pytest.raises(safejson.Unstorable) as refused:
        record(data)
    assert reason in str(refused.value) and refused.value.where.startswith(where)
    assert "call.retry_scheduled event data" in str(refused.value)
    assert list(AuditEvent.objects.values_list("id", flat=True)) == [before.id]
    after = record({"i": "after"})
    assert after.prev_hash == before.hash
    assert audit.verify().ok


# --- redaction: secrets under any spelling, in tuples, and credentials under innocent keys -----------------


@pytest.mark.parametrize(
    "key",
    [
        "x-api-key",
        "X-Api-Key",
        "api.key",
        "private-key",
        "request-state",
        "Request State",
        "card-number",
        "pass-word",
        "pass_phrase",
        "requestState",
        "apiKey",
    ],
)
def test_secret_keys_are_redacted_whatever_joins_their_words(key: str) -> None:
    event = record({"outer": [{"inner": {key: "s3cr3t-value"}}]})
    assert stored(event) == {"outer": [{"inner": {key: REDACTED}}]}


def test_secrets_inside_a_tuple_are_redacted() -> None:
    event = record({"pairs": ({"token": "abc"}, ("x", {"password": "pw"}))})
    assert stored(event) == {"pairs": [{"token": REDACTED}, ["x", {"password": REDACTED}]]}
    assert audit.redact(({"secret": 1},)) == [{"secret": REDACTED}]


def test_a_hub_token_or_an_authorization_value_under_an_innocent_key_is_redacted() -> None:
    agent_token = tokens.new_token(tokens.AGENT_PREFIX)
    personal_token = tokens.new_token(tokens.PERSONAL_PREFIX)
    event = record(
        {
            "note": f"use {agent_token} for the deploy",
            "list": [personal_token],
            "extra": [["Authorization", "Bearer abcdefghijklmnopqrstuvwxyz0123"]],
            "plan": "Basic plan",  # words, not a credential
            "topic": "basic internationalization",
            "pass_rate": 0.9,
        }
    )
    text = json.dumps(stored(event))
    assert agent_token not in text and personal_token not in text and "abcdefghijklmnop" not in text
    assert stored(event) == {
        "note": f"use {REDACTED} for the deploy",
        "list": [REDACTED],
        "extra": [["Authorization", REDACTED]],
        "plan": "Basic plan",
        "topic": "basic internationalization",
        "pass_rate": 0.9,
    }
    assert audit.verify().ok


# --- the offline verifier: big events in a CSV, hostile lines ------------------------------------------


@pytest.fixture
def root(client: Client) -> Client:
    client.force_login(factories.user("root", is_superuser=True, is_staff=True))
    return client


def download(client: Client, fmt: str) -> bytes:
    response = client.get(reverse("audit:export", args=[fmt]))
    assert response.status_code == 200
    return b"".join(response.streaming_content)


def test_a_csv_export_holding_an_event_larger_than_128_kib_verifies(root: Client, tmp_path: Path) -> None:
    record({"arguments": {"text": "x" * 300_000}})
    record({"i": 2})
    path = tmp_path / "audit.csv"
    path.write_bytes(download(root, "csv"))
    result = audit_verify.verify_file(path)
    assert result.ok, result.problem
    assert result.checked == 2


def test_a_hostile_line_is_reported_unreadable_not_a_crash(root: Client, tmp_path: Path) -> None:
    record({"i": 1})
    lines = download(root, "jsonl").decode().splitlines()
    deep = "[" * 100_000 + "]" * 100_000
    path = tmp_path / "audit.jsonl"
    path.write_text("\n".join([lines[0], deep, *lines[1:]]) + "\n", encoding="utf-8")
    result = audit_verify.verify_file(path)
    assert not result.ok and result.line == 2 and result.problem.startswith("unreadable")
    event = json.loads(lines[1])
    path.write_text("\n".join([lines[0], json.dumps({**event, "id": 1e999}), *lines[2:]]) + "\n")
    result = audit_verify.verify_file(path)
    assert not result.ok and result.line == 2 and result.problem.startswith("unreadable")
    csv_path = tmp_path / "audit.csv"
    csv_path.write_bytes(b"\xff\xfeid,at\n1,2\n")
    assert audit_verify.main([str(csv_path)]) == 1
    header = ",".join(audit_verify.COLUMNS)
    bad_cell = f'{header}\n1,"2026-01-01","system","","hub","call.retry_scheduled",,,,,,,,"{deep}",x,y\n'
    csv_path.write_text(bad_cell, encoding="utf-8")
    result = audit_verify.verify_file(csv_path)
    assert not result.ok and result.line == 2 and result.problem.startswith("unreadable")


def test_a_formula_after_a_tab_stays_text_where_tabs_split_cells(root: Client, tmp_path: Path) -> None:
    for value in ["a\t=1+1", "\t-2", "x;y\t@SUM(A1)", "a\t'=x", "\t'"]:
        escaped = audit_verify.escape_cell(value)
        assert not any(part.startswith(("=", "+", "-", "@")) for part in re.split("[;\t]", escaped)), escaped
        assert audit_verify.unescape_cell(escaped) == value
    audit.record(actor=Actor("user", "9", 'bob\t=HYPERLINK("https://evil.example")'), verb="input.answered")
    body = download(root, "csv")
    for line in body.decode().splitlines():
        for cell in next(csv.reader([line], delimiter="\t")):
            assert not cell.lstrip('"').startswith(("=", "+", "-", "@")), cell
    path = tmp_path / "audit.csv"
    path.write_bytes(body)
    assert audit_verify.verify_file(path).ok


# --- retention verifies the prefix without holding the chain lock ----------------------------------------


def test_a_prune_does_not_hold_the_chain_lock_while_it_verifies_and_appends_go_on(
    live_db, monkeypatch
) -> None:
    old = [record({"n": n}) for n in range(3)]
    cutoff = timezone.now()
    seen: list[dict] = []
    verify_rows = audit._verify_rows

    def append_from_elsewhere() -> None:
        try:
            with transaction.atomic(), connection.cursor() as cursor:
                cursor.execute("SELECT pg_try_advisory_xact_lock(%s)", [audit._CHAIN_LOCK])
                free = cursor.fetchone()[0]
            event = record({"during": "prune"}) if free else None
            seen.append({"lock_free": free, "event": event})
        finally:
            connection.close()

    def verifying(*args, **kwargs):
        if not seen:  # an append from another connection while the prefix is being verified
            thread = threading.Thread(target=append_from_elsewhere)
            thread.start()
            thread.join(30)
        return verify_rows(*args, **kwargs)

    monkeypatch.setattr(audit, "_verify_rows", verifying)
    result = audit.prune(before=cutoff, actor=Actor.system("retention"))
    assert seen and seen[0]["lock_free"], "the chain lock was held while the prefix was verified"
    assert result is not None and (result.count, result.last_id) == (3, old[-1].id)
    during = seen[0]["event"]
    assert list(AuditEvent.objects.order_by("id").values_list("id", flat=True)) == [
        during.id,
        result.event.id,
    ]
    assert audit.verify().ok and audit.check_chain().ok


def _full_width(text: str) -> str:
    return "".join(chr(ord(char) + 0xFEE0) if "!" <= char <= "~" else char for char in text)


def _bold(text: str) -> str:  # MATHEMATICAL BOLD SMALL letters
    return "".join(chr(0x1D41A + ord(char) - ord("a")) if "a" <= char <= "z" else char for char in text)


@pytest.mark.parametrize("key", [_full_width("password"), _bold("api_key"), _full_width("DB_PASS")])
def test_secret_keys_in_compatibility_letters_are_redacted(key: str) -> None:
    """A key in full-width or mathematical letters shows as the plain word: its value is a secret too, as a
    name/value pair's is."""
    event = record({"arguments": {key: "s3cr3t-value"}, "env": [{"name": key, "value": "s3cr3t-value"}]})
    assert stored(event) == {
        "arguments": {key: REDACTED},
        "env": [{"name": key, "value": REDACTED}],
    }
