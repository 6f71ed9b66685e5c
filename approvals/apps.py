from django.apps import AppConfig


class ApprovalsConfig(AppConfig):
    name = "approvals"
    verbose_name = "Elicit Hub approvals"

    def ready(self) -> None:
        from approvals import (
            checks,  # noqa: F401  (registers the system checks)
            permissions,  # noqa: F401  (a membership's change reaches the sockets' scopes)
        )
        from approvals.gateway import signals  # noqa: F401  (a server's or an agent's change reaches the gateway)
        from approvals.services import (
            escalation,  # noqa: F401  (a user's deletion or deactivation ends the url-mode requests made for them)
            gate_decisions,  # noqa: F401  (hands ready gate rounds to gate_decided: see rounds.READY_HANDLERS)
        )
