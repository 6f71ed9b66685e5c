"""Canonical JSON (RFC 8785, the JSON Canonicalization Scheme) and the digest over it.

Two JSON values that mean the same (keys in another order, other whitespace, 1.0 for 1) give the same bytes,
so an approval or a grant bound to "these arguments" is bound to their meaning, not their spelling.
"""

from __future__ import annotations

import hashlib
from typing import Any

import rfc8785


class NotCanonical(ValueError):
    """A value RFC 8785 cannot put in canonical form (an integer beyond ±2^53, NaN, a non-JSON type)."""


def canonical_json(value: Any) -> bytes:
    """Sorted keys (by UTF-16 code units), no whitespace, numbers in their ECMAScript form."""
    try:
        return rfc8785.dumps(value)
    except (rfc8785.CanonicalizationError, TypeError) as exc:
        raise NotCanonical(str(exc)) from exc


def digest(value: Any) -> str:
    """sha256 (hex) of ``canonical_json(value)``."""
    return hashlib.sha256(canonical_json(value)).hexdigest()
