"""Typed failures of the write side. The API maps them to JSON errors, the views to readable messages."""

from __future__ import annotations

from datetime import datetime

from django.utils import timezone


class ServiceError(Exception):
    status = 400
    code = "invalid"

    def __init__(
        self, message: str, *, code: str | None = None, fields: dict[str, str] | None = None
    ) -> None:
        super().__init__(message)
        self.message = message
        if code:
            self.code = code
        self.fields = fields or {}


class Invalid(ServiceError):
    status = 400
    code = "invalid"


class Forbidden(ServiceError):
    status = 403
    code = "forbidden"


class NotFound(ServiceError):
    status = 404
    code = "not_found"


class Conflict(ServiceError):
    status = 409
    code = "conflict"


class AnswerInvalid(ServiceError):
    status = 422
    code = "invalid_answer"


def moment(when: datetime) -> str:
    """A time in a message: unambiguous, with its zone, and ending in no full stop of its own (``10:42
    a.m.`` would end a sentence in two)."""
    return timezone.localtime(when).strftime("%Y-%m-%d %H:%M:%S %Z")
