"""Typed failures of the write side. The API maps them to JSON errors, the views to readable messages."""

from __future__ import annotations


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
