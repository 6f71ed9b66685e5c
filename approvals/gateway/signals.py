"""What tells the MCP gateways that the tools an agent sees may have changed, from wherever it changes.

A server added, changed or removed (the admin, `add_server`), an agent changed, removed or given other
servers: once committed, `broadcast.tools_changed` wakes every gateway process, which reads again and tells
the clients whose tools changed (`approvals.gateway.changes`). The writes made with ``update()`` (a stored
tool list, a probe, a token's rotation) send no model signal: the services that make them call it
themselves. Connected in every process by ``ApprovalsConfig.ready``.
"""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.db.models.signals import m2m_changed, post_delete, post_save
from django.dispatch import receiver

from approvals import broadcast
from approvals.models import AgentClient, McpServer


@receiver(post_save, sender=McpServer, dispatch_uid="approvals.gateway.server_saved")
@receiver(post_delete, sender=McpServer, dispatch_uid="approvals.gateway.server_deleted")
@receiver(post_save, sender=AgentClient, dispatch_uid="approvals.gateway.agent_saved")
@receiver(post_delete, sender=AgentClient, dispatch_uid="approvals.gateway.agent_deleted")
@receiver(m2m_changed, sender=AgentClient.servers.through, dispatch_uid="approvals.gateway.agent_servers")
def _tools_may_have_changed(action: str = "", **kwargs: Any) -> None:
    if action.startswith("pre_"):
        return  # m2m_changed's half before the change
    transaction.on_commit(broadcast.tools_changed)
