"""The queue socket's call watching, driven through the real ASGI app (origin check, session auth),
PostgreSQL and Redis."""

from __future__ import annotations

from typing import Any

import pytest
from asgiref.sync import sync_to_async
from channels.layers import channel_layers, get_channel_layer

from approvals import broadcast, consumers
from tests.test_wsrev_live import connected, open_request, run, socket
from tests.test_wsrev_live import world as world  # the fixture, shared

pytestmark = [pytest.mark.usefixtures("live_db"), pytest.mark.timeout(60)]


@pytest.fixture(autouse=True)
def own_channel_layer() -> None:
    channel_layers.backends.clear()  # each test's event loop gets a layer of its own (see test_consumers)


@pytest.mark.parametrize(
    "spelling",
    [str.upper, lambda pk: "{" + pk + "}", lambda pk: "urn:uuid:" + pk, lambda pk: pk.replace("-", "")],
    ids=["capitals", "braces", "urn", "no-hyphens"],
)
def test_a_call_watched_under_another_spelling_of_its_id_is_followed(world: dict[str, Any], spelling) -> None:
    """Any spelling a UUID reads in found the call, and was then used as it came: capitals joined a group no
    notice of the call reaches (the page, told it was watching, heard nothing more), and braces or a URN
    named a group the channel layer refuses, so the consumer failed and the socket dropped. The call is
    watched under its own id."""

    async def scenario() -> None:
        alice = socket(world["as"]["alice"])
        await connected(alice)
        ir = await sync_to_async(open_request)(world["deploy"], world["release"])
        call_id = str(ir.round.call_id)
        await alice.send_json_to({"type": "watch_call", "call": spelling(call_id)})
        assert await alice.receive_json_from(timeout=10) == {"type": "watching", "call": call_id}
        call = await sync_to_async(lambda: ir.round.call)()
        await sync_to_async(broadcast.call_changed)(call)
        message = await alice.receive_json_from(timeout=10)
        assert message["type"] == "call" and message["call"] == call_id and message["html"]
        await alice.disconnect()

    run(scenario)


def test_a_notice_later_than_its_grace_resyncs_the_page_once(world: dict[str, Any], monkeypatch) -> None:
    """A notice that arrives after its number was given up: the page was told to resync when its grace ran
    out, and that read its change. The late notice used to set the socket's number back, so that it was told
    to resync again at once, and once more by the next notice (in sequence, it looked like a gap)."""
    monkeypatch.setattr(consumers, "GAP_GRACE", 0.05)

    async def scenario() -> None:
        alice = socket(world["as"]["alice"])
        await connected(alice)
        group = broadcast.team_group(world["release"].slug)
        ir = await sync_to_async(open_request)(world["deploy"], world["release"])
        late = await sync_to_async(broadcast.next_seq)(group)  # taken, sent only after its grace
        await sync_to_async(broadcast.queue_changed)("round.opened", ir.round.call_id, [ir])
        assert (await alice.receive_json_from(timeout=10))["type"] == "card"
        gap = {"type": "resync", "reason": "gap", "groups": [group]}
        assert await alice.receive_json_from(timeout=10) == gap
        event = {
            "type": "queue.changed",
            "event": "input.answered",
            "call": str(ir.round.call_id),
            "input_requests": [str(ir.pk)],
            "round": ir.round_id,
            "group": group,
            "seq": late,
        }
        await get_channel_layer().group_send(group, event)
        assert (await alice.receive_json_from(timeout=10))["type"] == "card"
        await sync_to_async(broadcast.queue_changed)("round.opened", ir.round.call_id, [ir])
        assert (await alice.receive_json_from(timeout=10))["type"] == "card"
        assert await alice.receive_nothing(timeout=consumers.GAP_GRACE + 0.5)  # no resync
        await alice.disconnect()

    run(scenario)
