"""Which version of a form the reviewer saw: a digest of the requestedSchema as the server sent it."""

from __future__ import annotations

import hashlib
import json
from typing import Any


def fingerprint(schema: Any) -> str:
    """sha256 of the schema's sorted-keys compact JSON ("" for no schema): the audited ``schema_sha256``.

    The call timeline shows its first 12 characters. Non-ASCII text is hashed in its \\u escapes, as
    the events written so far were.
    """
    if schema is None:
        return ""
    return hashlib.sha256(json.dumps(schema, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
