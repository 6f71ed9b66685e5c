"""MCP elicitation `requestedSchema` -> HTML form description, and form posts -> `content`.

Pure code: no models, no database, no Django settings required (messages are translated
only when Django is set up). The schema is untrusted server input, so everything starts
with check_schema(); the other functions raise UnsupportedSchema (fields, coerce, defaults)
or report it under NON_FIELD (validate) when it refuses.

Typical browser flow:
    problems = check_schema(schema)            # refuse to render -> offer Decline/Cancel
    form = fields(schema, tz=reviewer_tz, prefix="f-")
    content, errors = clean(schema, request.POST, tz=posted_tz, prefix="f-")
API flow: errors = validate(schema, content).

Modules: checking (the subset), describe (Field, labels, hints, credential warnings),
coercion (form strings -> JSON), validation (answers), defaults, timezones, fingerprint (a
schema's digest).
"""

from ._common import NON_FIELD, UnsupportedSchema
from .checking import check_schema
from .coercion import clean, coerce
from .defaults import defaults
from .describe import RADIO_LIMIT, Field, fields, humanize, is_confirmation, reading, sensitive_fields
from .fingerprint import fingerprint
from .timezones import resolve_tz
from .validation import is_valid, validate

__all__ = [
    "NON_FIELD",
    "RADIO_LIMIT",
    "Field",
    "UnsupportedSchema",
    "check_schema",
    "clean",
    "coerce",
    "defaults",
    "fields",
    "fingerprint",
    "humanize",
    "is_confirmation",
    "is_valid",
    "reading",
    "resolve_tz",
    "sensitive_fields",
    "validate",
]
