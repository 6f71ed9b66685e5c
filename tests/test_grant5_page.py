"""The grants page's filters: one longer than any name it filters by matches nothing, never the grants of
another tool or agent whose name it begins with."""

from __future__ import annotations

import pytest

from tests.test_grants_web import grant, signed_in, world  # noqa: F401

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize(("field", "name", "limit"), [("tool", "t" * 200, 200), ("agent", "a" * 120, 120)])
def test_a_filter_longer_than_its_limit_matches_nothing(world, field: str, name: str, limit: int) -> None:  # noqa: F811
    if field == "tool":
        made = grant(world, tool=name)
    else:
        world.agent.name = name
        world.agent.save(update_fields=["name"])
        made = grant(world)
    client = signed_in(world.alice)
    exact = client.get("/grants/", {field: name})
    assert exact.status_code == 200 and f'data-grant="{made.pk}"' in exact.content.decode()
    longer = client.get("/grants/", {field: name + "x"})
    assert longer.status_code == 200
    assert f'data-grant="{made.pk}"' not in longer.content.decode()
    assert "No grant matches these filters." in longer.content.decode()
    assert len(name) == limit


def test_the_list_shows_the_start_of_large_exact_arguments_and_links_the_call_for_the_rest(world) -> None:  # noqa: F811
    big = {"env": "prod", "payload": "p" * 300_000}
    made = grant(world, arguments=big)
    small = grant(world, arguments={"env": "staging"})
    page = signed_in(world.alice).get("/grants/")
    html = page.content.decode()
    assert page.status_code == 200
    assert len(html) < 100_000  # not the 300 KB of arguments
    assert "&quot;payload&quot;: &quot;ppp" in html and "p" * 2000 not in html
    assert "data-arguments-cut" in html and f"/calls/{made.source_call_id}" in html
    # Short arguments are shown whole, as before.
    assert "&quot;env&quot;: &quot;staging&quot;" in html and f'data-grant="{small.pk}"' in html
    assert html.count("data-arguments-cut") == 1
    # The revoke page of one grant shows them whole.
    one = signed_in(world.alice).get(f"/grants/{made.pk}/revoke/").content.decode()
    assert "p" * 300_000 in one and "data-arguments-cut" not in one
