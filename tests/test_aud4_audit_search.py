"""An auditor's search for an id that reads as a UUID: the call or input request it names, and every event
that mentions it (a resource id in a call's arguments, a trace id in a server's error)."""

from __future__ import annotations

import re
import uuid
from typing import Any

import pytest
from django.test import Client
from django.urls import reverse

from approvals.audit import core as audit
from approvals.audit.core import Actor
from tests import factories

pytestmark = pytest.mark.django_db

EVENT_ID = re.compile(r'data-event-id="(\d+)"')


@pytest.fixture
def root(client: Client) -> Client:
    client.force_login(factories.user("root", is_superuser=True, is_staff=True))
    return client


def found(client: Client, params: dict[str, Any]) -> set[int]:
    response = client.get(reverse("audit:index"), params)
    assert response.status_code == 200, response.content.decode()[:2000]
    return {int(i) for i in EVENT_ID.findall(response.content.decode())}


def test_a_resource_id_in_the_arguments_finds_the_calls_that_named_it(root: Client) -> None:
    vm = str(uuid.uuid4())
    call = factories.call(factories.server("cloud"), arguments={"vm": vm})
    named = audit.record(
        actor=Actor.system(),
        verb="call.submitted",
        call=call,
        data={"tool": "delete_vm", "arguments": {"vm": vm}},
    )
    audit.record(actor=Actor.system(), verb="call.submitted", data={"arguments": {"vm": str(uuid.uuid4())}})
    assert found(root, {"q": vm}) == {named.id}
    assert found(root, {"q": vm.upper()}) == {named.id}


def test_a_trace_id_in_an_error_is_found(root: Client) -> None:
    trace = uuid.uuid4().hex  # 32 hex digits: a W3C trace id, an md5 sum
    failed = audit.record(
        actor=Actor.system(),
        verb="call.failed",
        data={"error": {"message": f"upstream failed, trace {trace}"}},
    )
    assert found(root, {"q": trace}) == {failed.id}


def test_a_call_id_still_finds_every_event_of_the_call(root: Client) -> None:
    call = factories.call(factories.server("cloud"))
    ids = {
        audit.record(actor=Actor.system(), verb=verb, call=call, data={}).id
        for verb in ("call.submitted", "call.completed")
    }
    audit.record(actor=Actor.system(), verb="call.submitted", data={})
    assert found(root, {"q": str(call.pk)}) == ids


def test_a_mention_is_found_only_within_what_the_reader_may_see(client: Client) -> None:
    vm = str(uuid.uuid4())
    reader = factories.user("reader")
    mine, theirs = factories.team("mine", (reader, "reviewer")), factories.team("theirs")
    ours = factories.call(factories.server("ours", default_team=mine), arguments={"vm": vm})
    other = factories.call(factories.server("other", default_team=theirs), arguments={"vm": vm})
    seen = audit.record(
        actor=Actor.system(), verb="call.submitted", call=ours, data={"arguments": {"vm": vm}}
    )
    audit.record(actor=Actor.system(), verb="call.submitted", call=other, data={"arguments": {"vm": vm}})
    client.force_login(reader)
    assert found(client, {"q": vm}) == {seen.id}
