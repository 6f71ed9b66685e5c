"""Pages that lose their live connection at the same moment (a hub restarting) come back spread out, not all
at the same instant: in a real browser (Chromium, Daphne, PostgreSQL, Redis)."""

from __future__ import annotations

import re
from typing import Any

import pytest

from tests import factories
from tests.browser import conftest as browser_fixtures
from tests.browser.conftest import browser, wait_live  # noqa: F401  (fixtures: used by name)

new_page = browser_fixtures.new_page  # the fixture, by its name

pytestmark = pytest.mark.timeout(120)


def _page_drawing(new_page: Any, draw: float) -> tuple[Any, list[Any]]:
    """alice's queue page, whose random draws all give ``draw``, with the sockets it opened."""
    page = new_page("alice")
    sockets: list[Any] = []
    page.add_init_script(f"Math.random = () => {draw};")
    page.route_web_socket(re.compile(r"/ws/"), lambda ws: (sockets.append(ws), ws.connect_to_server()))
    page.clock.install()
    page.reload()
    wait_live(page)
    page.clock.pause_at(page.evaluate("Date.now()") + 1000)  # from here its timers run only when told
    return page, sockets


def _sockets_become(page: Any, sockets: list[Any], count: int, seconds: float = 3) -> bool:
    """Whether the page has made this many sockets within ``seconds`` (letting its events reach the test)."""
    for _ in range(int(seconds * 10)):
        if len(sockets) >= count:
            return True
        page.wait_for_timeout(100)
    return False


def test_pages_that_lose_their_socket_together_do_not_come_back_together(web: Any, new_page) -> None:
    factories.user("alice")
    early, early_sockets = _page_drawing(new_page, 0.0)
    late, late_sockets = _page_drawing(new_page, 0.999)
    assert len(early_sockets) == len(late_sockets) == 1

    for page, sockets in ((early, early_sockets), (late, late_sockets)):
        sockets[-1].close(code=1012)  # the hub restarts
        page.wait_for_selector("#live-status[data-state='down']")
        page.clock.run_for(300)
    # Came back within the lower half of its first step (its clock ran 300 ms: however long the machine then
    # takes to make the socket).
    assert _sockets_become(early, early_sockets, 2, seconds=15)
    assert not _sockets_become(late, late_sockets, 2)  # still waiting: its clock stands still until told
    late.clock.run_for(300)
    assert _sockets_become(late, late_sockets, 2, seconds=15)
    wait_live(early)
    wait_live(late)
