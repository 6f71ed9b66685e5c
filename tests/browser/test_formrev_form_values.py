"""The answer form as Chromium submits it: values the server suggested, left alone by the reviewer, must come
back to the hub as the server's own. The form is drawn by the hub's templates and read by a real browser
(its value sanitisation is what changes them); no page is served."""

from __future__ import annotations

import uuid
from types import SimpleNamespace
from typing import Any

from django.template.loader import render_to_string

from approvals import schema_forms
from approvals.forms import PREFIX, answer_form

REQUESTED = {
    "type": "object",
    "properties": {
        "contact": {"type": "string", "format": "email", "default": "ops@bücher.example"},
        "backup": {"type": "string", "format": "email", "default": "Team@Exämple.COM"},
        "budget": {"type": "integer", "minimum": 1e300, "default": 1e305},
        "shards": {"type": "number", "default": 10**400},
    },
    "required": ["contact", "budget"],
}


class PostData(dict):
    def getlist(self, key: str) -> list[str]:
        return list(self.get(key, []))


def test_suggested_values_left_alone_are_sent_as_the_server_wrote_them(browser: Any) -> None:
    html = render_to_string(
        "approvals/_answer_form.html",
        {
            "form": answer_form(REQUESTED, tz="UTC"),
            "ir": SimpleNamespace(pk=uuid.uuid4()),
            "pending": True,
            "may_answer": True,
        },
    )
    context = browser.new_context()
    try:
        page = context.new_page()
        page.set_content(f"<!doctype html><meta charset=utf-8>{html}")
        posted = page.evaluate("() => [...new FormData(document.getElementById('answer-form')).entries()]")
    finally:
        context.close()
    data = PostData()
    for name, value in posted:
        data.setdefault(name, []).append(value)
    assert data[PREFIX + "contact"] == ["ops@xn--bcher-kva.example"]  # what the browser itself sends

    content, errors = schema_forms.clean(REQUESTED, data, tz="UTC", prefix=PREFIX)

    assert errors == {}
    assert content == {
        "contact": "ops@bücher.example",
        "backup": "Team@Exämple.COM",
        "budget": 1e305,
        "shards": 10**400,
    }
