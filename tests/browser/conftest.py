"""Browser fixtures: the system Chromium driven by Playwright against the real stack (Daphne, a Celery
worker, the demo MCP server, PostgreSQL and Redis)."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import expect

from tests import demo_support
from tests.hub import Hub, set_up_hub

CHROMIUM = os.environ.get("ELICIT_CHROMIUM", "/usr/bin/chromium")
ARTIFACTS = Path(__file__).resolve().parents[1] / "artifacts"
# An assertion waits as long as an action does (the contexts' default timeout below): on a loaded machine a
# notice or a read can take more than the 5 seconds Playwright's assertions wait by default.
expect.set_options(timeout=15_000)

CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """Module-scoped: Playwright's sync API keeps an event loop running in this thread while it lives, which
    later async_to_sync callers (the consumer tests) must not find."""
    from playwright.sync_api import sync_playwright

    # With that loop running, the ORM calls the tests make between browser steps look async to Django;
    # they are ordinary blocking calls, so its async-safety guard stands aside for these tests only.
    previous = os.environ.get("DJANGO_ALLOW_ASYNC_UNSAFE")
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    try:
        with sync_playwright() as playwright:
            chromium = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
            try:
                yield chromium
            finally:
                chromium.close()
    finally:
        if previous is None:
            os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
        else:
            os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = previous


@pytest.fixture
def hub(worker: Any, web: Any, demo_server: Any) -> Hub:
    demo_support.reset(demo_server.url)
    return set_up_hub(demo_server.url)


@pytest.fixture
def new_page(browser: Any, web: Any) -> Iterator[Any]:
    """new_page(username) -> a signed-in page in its own browser context (Paris time, English); on the
    shared web process unless ``base_url`` names another."""
    contexts = []

    def make(username: str, **options: Any) -> Any:
        base_url = options.pop("base_url", web.url)
        context = browser.new_context(
            base_url=base_url,
            locale=options.pop("locale", "en-GB"),
            timezone_id=options.pop("timezone_id", "Europe/Paris"),
            viewport=options.pop("viewport", {"width": 1200, "height": 900}),
            **options,
        )
        context.set_default_timeout(15_000)
        contexts.append(context)
        page = context.new_page()
        page.goto("/accounts/login/")
        page.get_by_label("User name").fill(username)
        page.get_by_label("Password").fill(f"pw-{username}")
        page.get_by_role("button", name="Sign in").click()
        page.wait_for_url(f"{base_url}/")
        return page

    yield make
    for context in contexts:
        context.close()


def screenshot(page: Any, name: str) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.evaluate("Promise.all(document.getAnimations().map((a) => a.finished))")
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)


def wait_live(page: Any) -> None:
    page.wait_for_selector("#live-status[data-state='live']")


# What the page reads over HTTP as its socket says hello (app.js, resync()), as absolute addresses: the
# queue its list, a request still open or watched its state, a call page its body.
HELLO_READS = """() => {
  const at = (url) => new URL(url, location.href).href;
  const reads = [];
  const queue = document.querySelector("[data-queue]");
  if (queue) reads.push(at(queue.dataset.listUrl + location.search));
  const review = document.querySelector("[data-review]");
  if (review && (review.hasAttribute("data-open-request") || review.hasAttribute("data-watch-request"))) {
    reads.push(at(review.dataset.stateUrl));
  }
  const call = document.querySelector("[data-call-page]");
  if (call) reads.push(at(call.dataset.bodyUrl));
  return reads;
}"""


def reload_live(page: Any, url: str | None = None) -> None:
    """Load the page again (or go to ``url``) and wait until its socket is live and the hub has answered what
    the page reads as the socket says hello. The page says "Live" before it reads: a change made meanwhile
    may be in that read already, and reach the page drawn by it instead of by its own notice."""
    answered: set[str] = set()

    def heard(response: Any) -> None:
        answered.add(response.url)

    def navigated(frame: Any) -> None:
        if frame == page.main_frame:  # what the page left was still reading does not count
            answered.clear()

    page.on("response", heard)
    page.on("framenavigated", navigated)
    try:
        if url is None:
            page.reload()
        else:
            page.goto(url)
        wait_live(page)
        for read in page.evaluate(HELLO_READS):
            if read not in answered:
                page.wait_for_event("response", lambda response, read=read: response.url == read)
    finally:
        page.remove_listener("response", heard)
        page.remove_listener("framenavigated", navigated)


def confirm_second_look(page: Any, *, by_keyboard: bool = False) -> str:
    """After an approval is sent: when the hub answers with the second look a risky approval gets
    (``approvals.second_look``: the demo's create_deployment is destructive, as the server says), check it
    restates the effect and confirm it, once its button is armed. What the review showed (its text), or ""
    when the approval went straight through."""
    review = page.locator("[data-second-look]")
    review.or_(page.locator(".messages")).first.wait_for()
    if not review.count():
        return ""
    shown = review.inner_text()
    assert "Check before sending" in shown
    confirm = review.get_by_role("button", name=re.compile("Confirm and send"))
    if not confirm.count():  # a form's review: the page's own approve button confirms
        confirm = page.get_by_role("button", name=re.compile("Confirm and send"))
    if page.locator("[data-review][data-open-request]").count():
        # Armed: the page's script holds the approve buttons for a second after it loads; a click as it
        # takes hold of an enabled button would be lost.
        page.locator("[data-review][data-armed]").wait_for()
    expect(confirm).to_be_enabled()
    if by_keyboard:
        page.keyboard.press("Control+Enter")  # the review's own button, the first approval on the page
    else:
        confirm.click()
    return shown
