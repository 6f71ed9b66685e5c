"""A send that meets a transient fault releases its round's claim in the lock order the rest of the hub
uses (the call's row, then the round's): the other order deadlocked against an agent's cancel, which locks
the call and then the round."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from approvals import mcp_client
from approvals.models import Round
from approvals.services import sending
from tests import factories

pytestmark = pytest.mark.django_db


def test_a_transient_fault_updates_the_call_before_the_round() -> None:
    call = factories.call(factories.server("deploy"))
    rnd = factories.open_round(call)
    Round.objects.filter(pk=rnd.pk).update(status=Round.Status.SENDING)
    rnd.refresh_from_db()
    fault = mcp_client.McpError("network_error", "connection reset", may_have_run=False)

    with CaptureQueriesContext(connection) as queries:
        countdown = sending._transient(sending.Send(call=call, round=rnd), fault)

    assert countdown is not None and countdown > 0
    updates = [q["sql"] for q in queries.captured_queries if q["sql"].startswith("UPDATE")]
    tables = [sql.split('"')[1] for sql in updates]
    assert tables.index("approvals_toolcall") < tables.index("approvals_round")
    rnd.refresh_from_db()
    assert rnd.status == Round.Status.READY
