"""Races: two reviewers answering the same request at the same instant; answers completing a round."""

from __future__ import annotations

import threading

import pytest
from django.db import connection

from approvals.models import AuditEvent, Decision, InputRequest, Membership, Round
from approvals.services import tokens
from tests import factories
from tests.hub import Reviewer


def race(*actions) -> list:
    """Run each action in its own thread (own DB connection), released together by a barrier."""
    barrier = threading.Barrier(len(actions))
    results: list = [None] * len(actions)

    def run(index: int, action) -> None:
        try:
            barrier.wait()
            results[index] = action()
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(i, a)) for i, a in enumerate(actions)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    return results


@pytest.fixture
def setup(live_db):
    alice, bob = factories.user("alice"), factories.user("bob")
    release = factories.team("release", (alice, Membership.Role.REVIEWER), (bob, Membership.Role.REVIEWER))
    srv = factories.server("deploy", default_team=release)
    call = factories.call(srv)
    rnd = factories.open_round(call, keys=("environment", "region"), team_=release)
    reviewers = [Reviewer(tokens.personal_token_create(user=u)[1]) for u in (alice, bob)]
    return rnd, reviewers


@pytest.mark.parametrize("attempt", range(3))
def test_two_answers_at_once_exactly_one_wins(setup, attempt: int) -> None:
    rnd, (alice, bob) = setup
    ir = rnd.input_requests.get(key="environment")
    responses = race(
        lambda: alice.respond(str(ir.pk), "accept", {"environment": "staging"}),
        lambda: bob.respond(str(ir.pk), "decline", reason="no"),
    )
    codes = sorted(r.status_code for r in responses)
    assert codes == [200, 409]
    ir.refresh_from_db()
    loser = next(r for r in responses if r.status_code == 409).json()["error"]
    assert loser["code"] == "already_answered"
    assert ir.answered_by.username in loser["message"]
    assert Decision.objects.filter(input_request=ir, is_final=True).count() == 1


def test_answers_to_the_last_two_keys_at_once_make_the_round_ready_once(setup) -> None:
    rnd, (alice, bob) = setup
    env, region = rnd.input_requests.get(key="environment"), rnd.input_requests.get(key="region")
    responses = race(
        lambda: alice.respond(str(env.pk), "accept", {"environment": "staging"}),
        lambda: bob.respond(str(region.pk), "accept", {"environment": "production"}),
    )
    assert [r.status_code for r in responses] == [200, 200]
    rnd.refresh_from_db()
    # Ready, or already taken on by the suite's worker (started for the session by an earlier test) that
    # the retry was queued to: made ready once either way, as its one round.answered event says.
    assert rnd.status in (Round.Status.READY, Round.Status.SENDING, Round.Status.CLOSED)
    assert AuditEvent.objects.filter(call_id=rnd.call_id, verb="round.answered").count() == 1
    assert not InputRequest.objects.filter(round=rnd, status=InputRequest.Status.PENDING).exists()
