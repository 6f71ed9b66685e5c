"""What every page the hub serves must hold, walked over all of them on the real database and cache: a
Content-Security-Policy, no inline script, no template comment shown as text, and no server string able
to reorder the page with bidi or invisible control characters."""

from __future__ import annotations

import re
from html.parser import HTMLParser
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from django.test import Client

from approvals.audit import core as audit
from approvals.audit.core import Actor
from approvals.models import InputRequest, Membership
from tests import factories

pytestmark = pytest.mark.django_db

TEMPLATES = Path(__file__).resolve().parent.parent / "templates"

# Right-to-left override, the four isolates and a zero-width space: what a server would use to make
# "exe.gpj" read as "jpg.exe" or to hide a word.
CONTROLS = "\u202e\u2066\u2067\u2068\u2069\u200b"
EVIL = f"{CONTROLS}gpj.exe"

TRICKY_SCHEMA = {
    "type": "object",
    "properties": {
        "target": {
            "type": "string",
            "title": f"Target {EVIL}",
            "description": f"Where it goes {EVIL}",
            "oneOf": [{"const": "a", "title": f"First {EVIL}"}, {"const": "b", "title": f"Second {EVIL}"}],
        },
        "region": {
            "type": "string",
            "title": f"Region {EVIL}",
            "enum": [f"r{i}{EVIL}" for i in range(10)],  # many options: a <select>
            "default": f"r1{EVIL}",
        },
        "note": {"type": "string", "title": f"Note {EVIL}", "default": f"said {EVIL}"},
        "sure": {"type": "boolean", "title": f"Sure {EVIL}", "description": f"Tick {EVIL}"},
        "tags": {
            "type": "array",
            "title": f"Tags {EVIL}",
            "items": {"type": "string", "enum": [f"t{EVIL}", "plain"]},
        },
    },
    "required": ["target"],
}


@pytest.fixture
def world() -> Any:
    alice = factories.user("alice", is_staff=True, is_superuser=True)
    release = factories.team("release", (alice, Membership.Role.REVIEWER))
    deploy = factories.server("deploy", name="Deploy bot", default_team=release)
    agent, _ = factories.agent("ci-bot", servers=[deploy])
    call = factories.call(deploy, agent, tool=f"deploy{EVIL}", arguments={"branch": f"main{EVIL}"})
    rnd = factories.open_round(call, keys=(f"form{EVIL}", "link"), team_=release)
    form_ir = rnd.input_requests.get(key=f"form{EVIL}")
    InputRequest.objects.filter(pk=form_ir.pk).update(
        message=f"Please confirm {EVIL}", requested_schema=TRICKY_SCHEMA
    )
    url_ir = rnd.input_requests.get(key="link")
    InputRequest.objects.filter(pk=url_ir.pk).update(
        mode="url",
        url=f"https://accounts.example.com/connect/{EVIL}",
        requested_schema=None,
        message=f"Sign in {EVIL}",
    )
    # The audit pages show what reviewers saw and sent, and the recorded data.
    for ir in (form_ir, url_ir):
        ir.refresh_from_db()
        audit.record(
            actor=Actor.system(),
            verb="input.requested",
            call=call,
            input_request=ir,
            data={"message": ir.message, "mode": ir.mode},
        )
    audit.record(
        actor=Actor.user(alice),
        verb="input.answered",
        call=call,
        input_request=form_ir,
        data={"action": "decline", "reason": f"No {EVIL}", "content": {"note": EVIL}},
    )
    audit.record(actor=Actor.system(), verb="call.cancelled", call=call, data={"why": EVIL})
    return SimpleNamespace(alice=alice, call=call, form_ir=form_ir, url_ir=url_ir)


def pages(world: Any) -> dict[str, Any]:
    """Every page the views serve (HTML), by name: signed out, then as a reviewer who is also staff."""
    client = Client()
    served = {"login": client.get("/accounts/login/"), "not found": client.get("/no-such-page/")}
    client.force_login(world.alice)
    call = world.call.pk
    for name, url in {
        "queue": "/",
        "queue list": "/queue/list/",
        "form request": f"/requests/{world.form_ir.pk}/",
        "url request": f"/requests/{world.url_ir.pk}/",
        "request state": f"/requests/{world.form_ir.pk}/state/",
        "call": f"/calls/{call}/",
        "call body": f"/calls/{call}/body/",
        "routing": f"/calls/{call}/routing/",
        "recent": "/recent/",
        "audit": "/audit/",
        "audit timeline": f"/audit/calls/{call}/",
        "password change": "/accounts/password_change/",
        "password changed": "/accounts/password_change/done/",
        "admin": "/admin/",
        "admin servers": "/admin/approvals/mcpserver/",
        "api docs": "/api/v1/docs",
        "signed in, not found": "/calls/00000000-0000-0000-0000-000000000000/",
    }.items():
        served[name] = client.get(url)
    served["signed out"] = client.post("/accounts/logout/", follow=True)
    for name, response in served.items():
        assert response.status_code in (200, 404), (name, response.status_code)
    return served


def html(response: Any) -> str:
    return response.content.decode()


class Scripts(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.scripts: list[dict[str, str | None]] = []
        self.handlers: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "script":
            self.scripts.append(dict(attrs))
        self.handlers += [f"<{tag} {name}>" for name, _ in attrs if name.startswith("on")]
        self.handlers += [
            f"<{tag} {name}={value}>" for name, value in attrs if (value or "").startswith("javascript:")
        ]


class Shown(HTMLParser):
    """What a reader sees: the text, and the attributes a browser displays. (Other attribute values, such
    as a filter option's value, carry the server's string verbatim and are never shown.)"""

    DISPLAYED = {"title", "alt", "placeholder", "aria-label", "label"}

    def __init__(self) -> None:
        super().__init__()
        self.text = ""

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.text += "".join(value or "" for name, value in attrs if name in self.DISPLAYED)

    def handle_data(self, data: str) -> None:
        self.text += data


def executable_inline_scripts(page: str) -> list[dict[str, str | None]]:
    parser = Scripts()
    parser.feed(page)
    return [
        attrs
        for attrs in parser.scripts
        if not attrs.get("src") and not attrs.get("nonce") and attrs.get("type") != "application/json"
    ]


def test_every_page_carries_the_content_security_policy(world) -> None:
    for name, response in pages(world).items():
        policy = response.get("Content-Security-Policy", "")
        directives = {part.split()[0]: part.split()[1:] for part in policy.split(";") if part.strip()}
        assert directives.get("default-src") == ["'self'"], (name, policy)
        assert directives.get("object-src") == ["'none'"], (name, policy)
        assert directives.get("base-uri") == ["'none'"], (name, policy)
        assert directives.get("frame-ancestors") == ["'none'"], (name, policy)
        assert "'unsafe-inline'" not in policy and "'unsafe-eval'" not in policy, (name, policy)
        # The page's own websocket origin, and nothing wider.
        assert directives.get("connect-src") == ["'self'", "ws://testserver"], (name, policy)


def test_the_api_answers_carry_the_policy_too(client) -> None:
    response = client.get("/api/v1/calls/00000000-0000-0000-0000-000000000000")
    assert response.status_code == 401
    assert "default-src 'self'" in response["Content-Security-Policy"]


def test_no_page_runs_an_inline_script_or_handler(world) -> None:
    for name, response in pages(world).items():
        page = html(response)
        assert not executable_inline_scripts(page), (name, executable_inline_scripts(page))
        parser = Scripts()
        parser.feed(page)
        assert not parser.handlers, (name, parser.handlers)


def test_no_template_holds_an_inline_script_without_a_nonce() -> None:
    offenders = []
    for path in TEMPLATES.rglob("*.html"):
        text = path.read_text()
        for tag in re.findall(r"<script\b[^>]*>", text):
            if "src=" not in tag and "nonce=" not in tag and "application/json" not in tag:
                offenders.append(f"{path.relative_to(TEMPLATES)}: {tag}")
        if re.search(r"<[a-z][^>]*\son[a-z]+=", text) or "<style" in text or " style=" in text:
            offenders.append(f"{path.relative_to(TEMPLATES)}: inline handler or style")
    assert not offenders


def test_no_page_shows_a_template_comment(world) -> None:
    served = pages(world)
    assert "data-open-form" in html(served["url request"])  # the consent panel with its form
    for name, response in served.items():
        page = html(response)
        assert "{#" not in page and "#}" not in page, (name, page[max(0, page.find("#}") - 300) :][:400])


def test_no_server_string_reaches_a_page_with_its_control_characters(world) -> None:
    served = pages(world)
    for name, response in served.items():
        shown = Shown()
        shown.feed(html(response))
        found = sorted({f"U+{ord(char):04X}" for char in shown.text if char in CONTROLS})
        assert not found, (name, found)
    # Each is shown as a visible code instead, wherever the server's text appears.
    form_page = html(served["form request"])
    for shown in (
        "Target ",  # a field's label
        "Where it goes ",  # its description
        "First ",  # an option's label
        "said ",  # a suggested value
        "Please confirm ",  # the server's message
        "deploy",  # the tool
    ):
        # The run of every control character is one code naming each kind, U+202E among them.
        run = r'<span class="ctl" title="[^"]*U\+202E[^"]*">[^<]*U\+202E[^<]*</span>gpj\.exe'
        assert re.search(re.escape(shown) + run, form_page), shown
    folded = "U+200B U+202E U+2066 U+2067 U+2068 U+2069 \u00d76"
    assert f"r0\u27e8{folded}\u27e9" in form_page  # inside a <select>'s <option>: a plain-text code
    assert f"<title>deploy\u27e8{folded}\u27e9" in form_page
    queue = html(served["queue"])
    assert f'dir="auto">Please confirm <span class="ctl" title="{folded}">{folded}</span>' in queue  # excerpt
    url_page = html(served["url request"])
    assert re.search(
        r'data-full-url><code><bdi dir="ltr">[^<]*connect/<span class="ctl" title="[^"]*U\+202E', url_page
    )


def test_joiners_that_spell_words_are_kept() -> None:
    from approvals.templatetags.approvals_ui import reveal

    persian = "می\u200cشود"  # ZWNJ is part of Persian spelling; ZWJ of emoji sequences
    family = "\U0001f469\u200d\U0001f467"
    assert reveal(persian) == persian and reveal(family) == family
    assert reveal("a\u200bb") == 'a<span class="ctl" title="U+200B">U+200B</span>b'


def _reveal_one_by_one(text: str, plain: bool) -> str:
    """The filter as first written: each character on its own, escaped with Django's ``escape``; a run of
    more than ``RUN_SHOWN`` characters to code is one code naming its kinds and its length."""
    from django.utils.html import escape

    from approvals.visible import CONTROLS as _CONTROLS
    from approvals.visible import RUN_SHOWN

    def code(label: str) -> str:
        return f"\u27e8{label}\u27e9" if plain else f'<span class="ctl" title="{label}">{label}</span>'

    def flush(run: list[int]) -> str:
        if len(run) <= RUN_SHOWN:
            return "".join(code(f"U+{c:04X}") for c in run)
        return code(" ".join(f"U+{c:04X}" for c in sorted(set(run))) + f" \u00d7{len(run)}")

    out: list[str] = []
    run: list[int] = []
    for char in text:
        c = ord(char)
        if c in _CONTROLS or (c < 0x20 and char not in "\n\t") or 0x7F <= c < 0xA0:
            run.append(c)
            continue
        out.append(flush(run))
        run = []
        out.append(escape(char))
    out.append(flush(run))
    return "".join(out)


def test_reveal_escapes_and_codes_exactly_as_character_by_character() -> None:
    import random

    from approvals.templatetags.approvals_ui import reveal

    alphabet = [chr(c) for c in range(0x00, 0xB0)] + list(
        "<>&\"'\u200b\u200c\u200d\u202e\u2066\ufeff\u00adمیش"
    )
    rng = random.Random(7)
    samples = ["", "plain", "<script>&amp;\"'</script>", "\u202egpj.exe", "a\nb\tc\r\x00\x7f\x9f"]
    samples += ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 80))) for _ in range(500)]
    for text in samples:
        assert reveal(text) == _reveal_one_by_one(text, plain=False), repr(text)
        assert reveal(text, "text") == _reveal_one_by_one(text, plain=True), repr(text)
