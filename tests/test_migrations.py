"""The models and the migrations agree: a field added without its migration fails here, not on a deploy."""

from __future__ import annotations

import io

import pytest
from django.core.management import call_command


@pytest.mark.django_db
def test_no_model_change_is_missing_its_migration() -> None:
    out = io.StringIO()
    try:
        call_command("makemigrations", "--check", "--dry-run", stdout=out, stderr=out)
    except SystemExit as exc:
        pytest.fail(f"models changed without a migration (exit {exc.code}):\n{out.getvalue()}")
    assert "No changes detected" in out.getvalue()
