"""Forms from hostile or unusual schemas: text that must not make the labelling code slow, defaults at the
edges of the calendar, and answers that must survive a round trip through the page unchanged.

Pure logic: no database. The slow-regex test carries a timeout as a safety net only: what it asserts is the
result, and the input is large enough that a quadratic pass would never finish in time.
"""

from __future__ import annotations

import gc
import tracemalloc
from datetime import datetime
from typing import Any

import pytest

from approvals import schema_forms
from approvals.schema_forms import describe
from approvals.schema_forms._common import MAX_SCHEMA_STRING


def form(props: dict[str, Any], required: tuple[str, ...] = ()) -> dict[str, Any]:
    return {"type": "object", "properties": props, "required": list(required)}


class PostData(dict):
    """A stand-in for request.POST: name -> list of strings."""

    def getlist(self, key: str) -> list[str]:
        return list(self.get(key, []))


# -- labels and credential checks stay linear in the text they read


@pytest.mark.timeout(30)
def test_capital_letter_runs_in_names_titles_and_descriptions_are_read_in_linear_time() -> None:
    # A run of capitals once made the word splitter backtrack over the whole run at every position:
    # a 10,000-character title took seconds, a 60,000-character key (sensitive_fields reads any schema,
    # checked or not) about a minute, on every page, audit record and round.
    capitals = "A" * MAX_SCHEMA_STRING
    schema = form({f"p{i}": {"type": "string", "title": capitals, "description": capitals} for i in range(6)})
    assert schema_forms.check_schema(schema) == []

    described = schema_forms.fields(schema)

    assert [field.sensitive for field in described] == [False] * 6
    long_key = "B" * 60_000 + "_token"
    assert schema_forms.sensitive_fields({"properties": {long_key: {}, "note": {}}}) == [long_key]


@pytest.mark.parametrize(
    ("key", "words"),
    [
        ("APIKey", ["API", "Key"]),
        ("ABcDEf", ["A", "Bc", "D", "Ef"]),
        ("HTTPServerURL", ["HTTP", "Server", "URL"]),
        ("XMLHttpRequest", ["XML", "Http", "Request"]),
        ("userID", ["user", "ID"]),
        ("start_date", ["start", "date"]),
    ],
)
def test_words_split_as_before(key: str, words: list[str]) -> None:
    assert [word for word in describe._words(key) if word] == words


# -- date-time defaults at the edges of the calendar


@pytest.mark.parametrize(
    ("default", "tz", "initial", "initial_tz"),
    [
        # Shown in New York, the first instant of year 1 would be in year 0, which Python cannot hold.
        ("0001-01-01T00:00:00Z", "America/New_York", "0001-01-01T00:00", "+00:00"),
        ("9999-12-31T23:59:00-05:00", "Asia/Tokyo", "9999-12-31T23:59", "-05:00"),
        # The ordinary case is unchanged: shown in the reviewer's zone.
        ("2026-01-01T10:00:00Z", "Europe/Paris", "2026-01-01T11:00", "Europe/Paris"),
    ],
)
def test_a_date_time_default_that_cannot_be_shown_in_the_reviewers_zone_keeps_its_own_offset(
    default: str, tz: str, initial: str, initial_tz: str
) -> None:
    schema = form({"when": {"type": "string", "format": "date-time", "default": default}})
    assert schema_forms.check_schema(schema) == []

    (field,) = schema_forms.fields(schema, tz=tz)

    assert (field.initial, field.initial_tz) == (initial, initial_tz)
    # Posted back untouched with the zone it is written in, it is the server's own instant.
    content, errors = schema_forms.clean(schema, PostData(when=[field.initial]), tz=field.initial_tz)
    assert errors == {}
    assert datetime.fromisoformat(content["when"]) == datetime.fromisoformat(default)


# -- fields that ask for credentials are recognised, so their values are blanked in the audit log


@pytest.mark.parametrize(
    "name",
    [
        "password2",  # the usual "type it again" field
        "newPassword1",
        "apiKey2",
        "token2",
        "secret1",
        "pin1",
        "DB_PASS",
        "smtp_pass",
        "pass",
        "authorization",
        "Authorization",
    ],
)
def test_credential_field_names_with_a_number_or_a_short_word_are_flagged(name: str) -> None:
    schema = form({name: {"type": "string"}, "note": {"type": "string"}})
    assert schema_forms.sensitive_fields(schema) == [name]
    assert [field.sensitive for field in schema_forms.fields(schema)] == [True, False]


@pytest.mark.parametrize(
    ("name", "prop"),
    [
        ("passed", {"type": "boolean"}),
        ("pass_rate", {"type": "number"}),
        ("ipv4", {"type": "string"}),
        ("sha256", {"type": "string"}),
        ("result", {"type": "string", "enum": ["pass", "fail"], "description": "Did the check pass?"}),
        ("max_tokens2", {"type": "integer"}),
    ],
)
def test_ordinary_fields_with_numbers_or_the_word_pass_are_not_flagged(
    name: str, prop: dict[str, Any]
) -> None:
    assert schema_forms.sensitive_fields(form({name: prop})) == []


# -- a default posted back untouched is a valid answer


@pytest.mark.parametrize("default", [1e20, 1e15, 5.0, -3e17])
def test_an_integer_default_written_as_a_float_is_prefilled_as_a_whole_number(default: float) -> None:
    # JSON Schema counts 1e20 as an integer, but it was prefilled as "1e+20" (or "1000000000000000.0"),
    # which the form then refused as "Enter a whole number" when sent back untouched.
    schema = form({"n": {"type": "integer", "default": default}}, ("n",))
    assert schema_forms.check_schema(schema) == []

    (field,) = schema_forms.fields(schema)
    content, errors = schema_forms.clean(schema, PostData(n=[field.initial]))

    assert errors == {}
    assert content == {"n": int(default)}
    assert field.initial == str(int(default))


# -- what the hub remembers about a schema stays small, whatever its size


def test_the_remembered_metaschema_verdict_does_not_keep_the_schema_text() -> None:
    # The verdict is remembered for 512 schemas per process. It was kept under the schema's full JSON
    # text, and a tool's inputSchema (a gate's form) may be megabytes: 512 of them held gigabytes.
    from approvals.schema_forms import checking

    titled = [{"const": f"c{j}", "title": "T" * 2000} for j in range(50)]
    big = form({f"p{i}": {"type": "string", "oneOf": titled} for i in range(20)})  # about 2 MB as JSON
    draft3 = {
        **form({"a": {"type": "string", "description": "D" * 5000}}),
        "$schema": "http://json-schema.org/draft-03/schema#",
    }
    checking._metaschema_error.cache_clear()
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        verdicts = [checking.check_schema(big), checking.check_schema(draft3)]
        gc.collect()
        kept = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()

    assert verdicts[0] == [] and "not valid JSON Schema" in verdicts[1][0]
    assert kept < 200_000, kept
    # Still remembered: the same schemas again are answered from the cache.
    assert [checking.check_schema(big), checking.check_schema(draft3)] == verdicts
    info = checking._metaschema_error.cache_info()
    assert (info.misses, info.hits, info.currsize) == (2, 2, 2)
