"""Canonical JSON (RFC 8785, the JSON Canonicalization Scheme) and the digest of a value.

Two JSON values that mean the same (keys in another order, ``1.0`` and ``1``, other whitespace or escapes)
give the same bytes, so a digest over them says "exactly this" and nothing about how it was written. The
work is done by the ``rfc8785`` package (sorted keys by UTF-16 code units, no whitespace, ECMAScript number
form); values it cannot represent (NaN, infinities, integers beyond 2**53, non-string keys) raise
``CanonicalError``.
"""

from __future__ import annotations

import hashlib
from typing import Any

import rfc8785


class CanonicalError(ValueError):
    """The value has no canonical JSON form."""


def canonical_json(value: Any) -> bytes:
    """The RFC 8785 canonical form of a JSON value, as UTF-8 bytes."""
    try:
        return rfc8785.dumps(value)
    except (rfc8785.CanonicalizationError, TypeError, ValueError) as exc:
        raise CanonicalError(str(exc)) from None


def digest(value: Any) -> str:
    """The SHA-256 of the value's canonical JSON, as 64 hex digits."""
    return hashlib.sha256(canonical_json(value)).hexdigest()
