"""Canonical JSON (RFC 8785) and digests: pure logic."""

from __future__ import annotations

import pytest

from approvals.canonical import CanonicalError, canonical_json, digest


def test_key_order_whitespace_and_number_spelling_do_not_matter() -> None:
    assert canonical_json({"b": 1.0, "a": [True, None, "x"]}) == b'{"a":[true,null,"x"],"b":1}'
    assert digest({"b": 1.0, "a": 2}) == digest({"a": 2, "b": 1})


def test_rfc8785_examples() -> None:
    # Numbers in ECMAScript form; non-ASCII kept as UTF-8; keys sorted by UTF-16 code units.
    assert canonical_json([1e21, 1e-7, 0.000001, -0.0]) == b"[1e+21,1e-7,0.000001,0]"
    assert canonical_json({"é": "\u20ac", "a": "\n"}) == '{"a":"\\n","é":"€"}'.encode()
    # Escapes, not literals: an editor may normalise U+FB33 (a composition exclusion) into two code points.
    assert canonical_json({"\U0001f600": 1, "\ufb33": 2}) == '{"\U0001f600":1,"\ufb33":2}'.encode()


def test_different_values_differ() -> None:
    assert digest({"a": 1}) != digest({"a": "1"})
    assert len(digest({})) == 64


@pytest.mark.parametrize("value", [float("nan"), float("inf"), 2**60, {1: "non-string key"}])
def test_values_without_a_canonical_form_are_refused(value: object) -> None:
    with pytest.raises(CanonicalError):
        canonical_json(value)
