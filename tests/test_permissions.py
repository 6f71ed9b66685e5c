"""One rule for who may answer what: the SQL form and the in-memory form (used per websocket event and per
answer) agree."""

from __future__ import annotations

import pytest

from approvals import permissions
from approvals.models import InputRequest, Membership
from tests import factories

pytestmark = pytest.mark.django_db


def test_the_queryset_and_the_scope_agree_on_every_case() -> None:
    release, ops = factories.team("release"), factories.team("ops")
    people = {
        "reviewer": factories.user("rita"),
        "viewer": factories.user("vic"),
        "ops": factories.user("otto"),
        "staff": factories.user("stan", is_staff=True),
        "root": factories.user("root", is_superuser=True),
        "nobody": factories.user("nora"),
    }
    Membership.objects.create(team=release, user=people["reviewer"], role=Membership.Role.REVIEWER)
    Membership.objects.create(team=release, user=people["viewer"], role=Membership.Role.VIEWER)
    Membership.objects.create(team=ops, user=people["ops"], role=Membership.Role.ADMIN)
    rnd = factories.open_round(factories.call(factories.server()), keys=())
    shapes = {
        "release": {"team": release},
        "unrouted": {"team": None},
        "escalated to ops": {"team": release, "escalation_team": ops},
        "for nora": {"team": release, "assignee": people["nobody"]},
        "passed to the requester": {"team": release, "for_requester": True},
    }
    requests = {
        name: InputRequest.objects.create(round=rnd, key=name, requested_schema={"type": "object"}, **fields)
        for name, fields in shapes.items()
    }
    expected = {
        "reviewer": {"release", "escalated to ops"},
        "viewer": set(),
        "ops": {"escalated to ops"},
        "staff": {"unrouted"},
        "root": {"release", "unrouted", "escalated to ops"},
        "nobody": {"for nora"},
    }
    for who, user in people.items():
        by_sql = {ir.key for ir in permissions.answerable_input_requests(user)}
        scope = permissions.scope_of(user)
        in_memory = {name for name, ir in requests.items() if permissions.may_answer(scope, ir)}
        one_by_one = {name for name, ir in requests.items() if permissions.can_answer(user, ir)}
        assert by_sql == in_memory == one_by_one == expected[who], who
