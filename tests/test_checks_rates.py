"""A rate limit setting the hub cannot read fails the system checks (run by `migrate` and every start)."""

from __future__ import annotations

import pytest

from approvals import checks


def test_the_shipped_rates_are_readable() -> None:
    assert checks.rates_are_readable() == []


@pytest.mark.parametrize("value", ["abc", "10/x", "0/m", "-1/m", "60"])
def test_an_unreadable_rate_is_an_error_naming_the_setting(settings, value: str) -> None:
    settings.ELICIT_AUDIT_EXPORT_RATE = value
    errors = checks.rates_are_readable()
    assert [error.id for error in errors] == ["approvals.E002"]
    assert "ELICIT_AUDIT_EXPORT_RATE" in errors[0].msg and repr(value) in errors[0].msg
