"""The data model. Statuses are TextChoices; the database itself refuses impossible states.

Secrets (server credentials, requestState, token hashes, webhook secrets) live in fields that no
``__repr__``/``__str__`` shows and that the admin never renders.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.contrib.postgres.indexes import GinIndex
from django.contrib.postgres.search import SearchVectorField
from django.core.exceptions import ValidationError
from django.db import models
from django.db.models import Q
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

if TYPE_CHECKING:
    from django.contrib.auth.models import User


def send_idempotency_key(call_id: object, round_number: int) -> str:
    """The ``Idempotency-Key`` of a call's sends: round 0 is its first tools/call, round n the n-th retry."""
    return f"elicit-{call_id}-r{round_number}"


# What joins a server's slug to its tools' names on the gateway's `/mcp` (approvals.gateway.names).
SEPARATOR = "__"


def validate_server_slug(value: str) -> None:
    """A server's tools are named `<slug>__<tool>` on the gateway's `/mcp` (approvals.gateway.names). A slug
    without `__` and not ending in `_` makes the name's first `__` the end of the slug, so two servers'
    tools never take one name (`a` with tool `b__c`, `a__b` with tool `c`)."""
    if SEPARATOR in value or value.endswith("_"):
        raise ValidationError(
            _(
                "A server's slug may not contain “%(separator)s” nor end in “_”: the gateway joins it to its "
                "tools' names with “%(separator)s”."
            ),
            code="gateway_separator",
            params={"separator": SEPARATOR},
        )


def is_uuid(value: object) -> bool:
    """Whether ``value`` reads as a UUID (every id the hub hands out)."""
    try:
        uuid.UUID(str(value))
    except ValueError:
        return False
    return True


class Team(models.Model):
    """A group of reviewers. Its ``slug`` is its identity wherever the hub names it by text (the audit log's
    events, whose hashes cover it, exports, live channels): it is fixed once the team exists, and never given
    to another team, even after this one is deleted (``TeamSlug``; the database enforces both, migration
    0018). The ``name`` is what may change."""

    slug = models.SlugField(unique=True)
    name = models.CharField(max_length=120)
    members: models.ManyToManyField[User, Membership] = models.ManyToManyField(
        settings.AUTH_USER_MODEL, through="Membership", related_name="teams"
    )
    notify_emails = models.TextField(
        blank=True,
        help_text=_("Addresses told when a request is routed here, escalated, or about to expire."),
    )
    chat_webhook_url = models.URLField(
        max_length=500, blank=True, help_text=_("A Slack-compatible incoming webhook for the same notices.")
    )

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class Membership(models.Model):
    class Role(models.TextChoices):
        VIEWER = "viewer", _("Viewer")
        REVIEWER = "reviewer", _("Reviewer")
        ADMIN = "admin", _("Admin")

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="memberships")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=16, choices=Role.choices, default=Role.REVIEWER)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["team", "user"], name="membership_unique")]

    def __str__(self) -> str:
        return f"{self.user} in {self.team} ({self.role})"


class TeamSlug(models.Model):
    """Which team a slug names in the audit log, for every slug any team has held: who reads the events that
    carry it (``permissions.visible_audit_events``).

    A team's row is written by the database as the team is made (migration 0018), and no team may be made with
    a slug that has a row: a slug is used once. A deleted team's rows stay, with no team (the slug is
    retired: its events are the superusers' alone). ``from_id`` and ``until_id`` (audit event ids, the
    second exclusive) bound a claim only where the history from before slugs were fixed had one slug name two
    teams in turn; a team made since holds its slug for every event (0, none)."""

    slug = models.SlugField()
    team = models.ForeignKey(Team, null=True, on_delete=models.SET_NULL, related_name="slug_claims")
    from_id = models.BigIntegerField(default=0)
    until_id = models.BigIntegerField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["slug"], condition=Q(until_id__isnull=True), name="teamslug_open")
        ]

    def __str__(self) -> str:
        return f"{self.slug} -> team #{self.team_id}"


class ExpiryAction(models.TextChoices):
    CANCEL = "cancel", _("Resume with cancel answers")
    ABANDON = "abandon", _("Abandon the call")


class Holder(models.Model):
    """A running session-holder process (``manage.py run_holder``): it keeps handshake-era sessions and stdio
    servers open while people decide. Its heartbeat says it is alive; a holder whose heartbeat is stale is
    declared lost and the calls it held end with an outcome that says so."""

    name = models.CharField(max_length=120, unique=True)  # host:pid:random, fresh on every start
    started_at = models.DateTimeField(default=timezone.now)
    heartbeat_at = models.DateTimeField(default=timezone.now)
    sessions = models.PositiveIntegerField(default=0)  # sessions open at the last heartbeat

    def __str__(self) -> str:
        return self.name


class McpServer(models.Model):
    class Transport(models.TextChoices):
        HTTP = "http", _("Streamable HTTP")
        STDIO = "stdio", _("stdio (a command the hub runs)")

    class Era(models.TextChoices):
        AUTO = "auto", _("Automatic (probe, then fall back to the handshake)")
        MODERN = "2026-07-28", _("2026-07-28 (stateless)")
        HANDSHAKE = "handshake", _("Handshake era (2025-06-18 / 2025-11-25 sessions)")

    slug = models.SlugField(unique=True)
    name = models.CharField(max_length=120, help_text=_("How the hub names this server to reviewers."))
    transport = models.CharField(max_length=8, choices=Transport.choices, default=Transport.HTTP)
    url = models.URLField(max_length=500, blank=True)
    # stdio servers (registered by an admin, never by an agent): the command, its arguments, its environment.
    command = models.CharField(max_length=500, blank=True)
    args = models.JSONField(default=list, blank=True)
    # Environment of a stdio server; may hold credentials. Write-only, like `headers`.
    env = models.JSONField(default=dict, blank=True)
    era = models.CharField(
        max_length=12,
        choices=Era.choices,
        default=Era.AUTO,
        help_text=_(
            "Which protocol era the hub speaks to this server. Dual-era servers whose tools use ctx.elicit() "
            "only work on a handshake-era connection."
        ),
    )
    # The last probe: era, protocol version, server info, capabilities, tool count, latency, error.
    probe = models.JSONField(null=True, blank=True, editable=False)
    probed_at = models.DateTimeField(null=True, blank=True, editable=False)
    elicitation_wait = models.PositiveIntegerField(
        default=60, help_text=_("Seconds this server waits for an answer to an elicitation it pushes.")
    )
    call_timeout = models.PositiveIntegerField(
        default=600, help_text=_("Seconds a tools/call may run before its outcome is unknown.")
    )
    tool_timeouts = models.JSONField(
        default=dict, blank=True, help_text=_('Per-tool limits in seconds, e.g. {"build": 1800}.')
    )
    honours_idempotency_key = models.BooleanField(
        default=False,
        help_text=_("The server runs a tools/call re-sent with the same Idempotency-Key only once."),
    )
    # The holder that runs this stdio server now (a lease: exactly one at a time).
    stdio_holder = models.ForeignKey(
        Holder, null=True, blank=True, on_delete=models.SET_NULL, related_name="stdio_servers", editable=False
    )
    # Credentials sent with every request, e.g. {"Authorization": "Bearer ..."}. Write-only: never shown.
    headers = models.JSONField(default=dict, blank=True)
    enabled = models.BooleanField(default=True)
    default_team = models.ForeignKey(Team, null=True, blank=True, on_delete=models.SET_NULL)
    round_ttl = models.PositiveIntegerField(
        null=True, blank=True, help_text=_("Seconds a round may wait for answers (default from settings).")
    )
    on_expiry = models.CharField(max_length=16, choices=ExpiryAction.choices, blank=True)
    discover = models.JSONField(null=True, blank=True, editable=False)
    tools = models.JSONField(null=True, blank=True, editable=False)
    tools_fetched_at = models.DateTimeField(null=True, blank=True, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]
        verbose_name = "MCP server"
        constraints = [
            models.CheckConstraint(
                condition=(Q(transport="http") & ~Q(url="")) | (Q(transport="stdio") & ~Q(command="")),
                name="mcpserver_transport_has_target",
            ),
        ]

    # The server's stored configuration (credentials among it) and what the hub learned of it: JSON that a
    # request's inbox item, queue card and answer never show, so their reads leave it undecoded.
    STORED_JSON = ("args", "env", "headers", "probe", "tool_timeouts", "discover", "tools")

    def __str__(self) -> str:
        return self.name

    def __repr__(self) -> str:
        return f"<McpServer {self.slug} ({self.transport})>"  # not its URL: it may carry a credential

    def clean(self) -> None:
        """A new slug, or a changed one, must suit the gateway (`validate_server_slug`); a server registered
        before the rule keeps its slug (the gateway leaves out a tool name it makes ambiguous). Here, not
        as the field's validator, which would need a migration for no change to the database."""
        super().clean()
        if not self.slug or (self.pk and McpServer.objects.filter(pk=self.pk, slug=self.slug).exists()):
            return
        try:
            validate_server_slug(self.slug)
        except ValidationError as exc:
            raise ValidationError({"slug": exc.error_list}) from None

    @classmethod
    def stored_json(cls, path: str) -> tuple[str, ...]:
        """``STORED_JSON`` as ``defer()`` names it through a relation (``path``: ``round__call__server``)."""
        return tuple(f"{path}__{name}" for name in cls.STORED_JSON)

    def tool(self, name: str) -> dict | None:
        return next((tool for tool in self.tools or [] if tool.get("name") == name), None)

    @property
    def needs_session(self) -> bool:
        """Calls to this server run on a holder's session (stdio servers, and the handshake era), not on a
        Celery worker's stateless 2026-07-28 request. Under "auto" the last probe decides."""
        return self.session_needed(self.transport, self.era, (self.probe or {}).get("era"))

    @classmethod
    def session_needed(cls, transport: str, era: str, probed_era: object) -> bool:
        """`needs_session` from the three values it depends on (for a read of those values alone)."""
        if transport == cls.Transport.STDIO or era == cls.Era.HANDSHAKE:
            return True
        if era == cls.Era.MODERN:
            return False
        return probed_era == "handshake"


class Revised(models.Model):
    """A row whose ``revision`` goes up by one on every save (the admin's included): an approval records the
    revision of the rule and the policy that required it, and any later edit voids that approval."""

    revision = models.PositiveIntegerField(default=1, editable=False)

    class Meta:
        abstract = True

    def save(self, *args: Any, **kwargs: Any) -> None:
        if self.pk is not None and not kwargs.get("force_insert"):
            self.revision = (
                type(self)._default_manager.filter(pk=self.pk).values_list("revision", flat=True).first() or 0
            ) + 1
            if kwargs.get("update_fields") is not None:
                kwargs["update_fields"] = {*kwargs["update_fields"], "revision"}
        super().save(*args, **kwargs)


class Policy(Revised):
    """What a routed request needs before its answer goes to the server, and what happens when no one acts."""

    class Risk(models.TextChoices):
        LOW = "low", _("Low")
        MEDIUM = "medium", _("Medium")
        HIGH = "high", _("High")

    name = models.CharField(max_length=120, unique=True)
    risk = models.CharField(max_length=8, choices=Risk.choices, default=Risk.LOW)
    approvals_required = models.PositiveSmallIntegerField(
        default=1, help_text=_("Distinct reviewers who must approve the same values.")
    )
    forbid_self_approval = models.BooleanField(
        default=True, help_text=_("The person the agent acts for, and the agent's owner, cannot answer.")
    )
    ttl = models.PositiveIntegerField(null=True, blank=True, help_text=_("Seconds before the round expires."))
    on_expiry = models.CharField(max_length=16, choices=ExpiryAction.choices, blank=True)
    escalate_after = models.PositiveIntegerField(
        null=True, blank=True, help_text=_("Seconds without an answer before the fallback team is asked too.")
    )
    escalation_team = models.ForeignKey(
        Team, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    reauth_within = models.PositiveIntegerField(
        null=True, blank=True, help_text=_("Reviewers must have signed in within this many seconds.")
    )
    extend_by = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text=_("Seconds a reviewer may add to a round's deadline. Empty: no extension."),
    )
    max_extensions = models.PositiveSmallIntegerField(
        default=1, help_text=_("How many times a round's deadline may be extended.")
    )

    class Meta:
        verbose_name_plural = "policies"
        constraints = [
            models.CheckConstraint(
                condition=Q(approvals_required__gte=1), name="policy_at_least_one_approval"
            ),
        ]

    def __str__(self) -> str:
        return self.name


class RoutingRule(Revised):
    """Evaluated in order when a round opens; the first match names the team and the policy.

    A rule with ``gate`` set is a gate: a call it matches waits for approval before it is sent upstream
    (``services.gates``). Gate rules are evaluated apart from the routing of a server's input requests."""

    position = models.PositiveIntegerField(default=100)
    name = models.CharField(max_length=120)
    enabled = models.BooleanField(default=True)
    server = models.ForeignKey(
        McpServer, null=True, blank=True, on_delete=models.CASCADE, help_text=_("Empty: any server.")
    )
    tool_pattern = models.CharField(max_length=200, default="*", help_text=_("A glob, e.g. create_* or *."))
    mode = models.CharField(
        max_length=8,
        blank=True,
        choices=[("form", "Form"), ("url", "URL")],
        help_text=_("Empty: either mode."),
    )
    destructive = models.BooleanField(null=True, blank=True, help_text=_("Match the tool's destructiveHint."))
    read_only = models.BooleanField(null=True, blank=True, help_text=_("Match the tool's readOnlyHint."))
    open_world = models.BooleanField(null=True, blank=True, help_text=_("Match the tool's openWorldHint."))
    conditions = models.JSONField(
        default=list,
        blank=True,
        help_text=_(
            "Conditions on the call's arguments, all must hold: "
            '[{"argument": "environment", "op": "==", "value": "production"}]; '
            "ops: ==, !=, in, not in, exists."
        ),
    )
    gate = models.BooleanField(
        default=False,
        help_text=_(
            "Stop the calls this rule matches for approval before they are sent to the server. A gate rule "
            "matches on server, tool, annotations and arguments; its team approves under its policy."
        ),
    )
    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="rules")
    policy = models.ForeignKey(Policy, null=True, blank=True, on_delete=models.PROTECT, related_name="rules")

    class AnsweredBy(models.TextChoices):
        TEAM = "team", _("The team's reviewers")
        REQUESTER = "requester", _("The requester (the agent's own person, through the agent's MCP client)")

    answered_by = models.CharField(
        max_length=10,
        choices=AnsweredBy.choices,
        default=AnsweredBy.TEAM,
        help_text=_(
            "Requester: a call made through /mcp by a client that declared the elicitation capability (and "
            "the mode asked for) gets the question itself, for the person it acts for; otherwise the team "
            "answers."
        ),
    )

    class Meta:
        ordering = ["position", "id"]
        constraints = [
            models.CheckConstraint(condition=Q(gate=False) | Q(mode=""), name="routingrule_gate_any_mode"),
        ]

    def __str__(self) -> str:
        return self.name


class AgentClient(models.Model):
    name = models.CharField(max_length=120, unique=True)
    token_hash = models.CharField(max_length=64, unique=True, editable=False)
    token_prefix = models.CharField(max_length=12, editable=False)
    webhook_secret = models.CharField(max_length=100, blank=True, editable=False)
    # The secret a rotation replaced, still signing beside the new one until `previous_webhook_secret_until`,
    # so the receiver can switch to the new one without refusing a delivery meanwhile.
    # A database default too: a process of the release before this column inserts agents without it.
    previous_webhook_secret = models.CharField(max_length=100, blank=True, editable=False, db_default="")
    previous_webhook_secret_until = models.DateTimeField(null=True, blank=True, editable=False)
    servers = models.ManyToManyField(McpServer, related_name="agents", blank=True)
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="agents"
    )
    # Whom the agent may name in `on_behalf_of`: these users and the members of these teams; no one else.
    acts_for_users: models.ManyToManyField[User, Any] = models.ManyToManyField(
        settings.AUTH_USER_MODEL,
        related_name="+",
        blank=True,
        verbose_name=_("may act for (users)"),
        help_text=_("Users this agent may name in on_behalf_of."),
    )
    acts_for_teams: models.ManyToManyField[Team, Any] = models.ManyToManyField(
        Team,
        related_name="+",
        blank=True,
        verbose_name=_("may act for (teams)"),
        help_text=_("Every member of these teams may be named in on_behalf_of."),
    )
    is_active = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True, editable=False)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    def __repr__(self) -> str:
        return f"<AgentClient {self.name} {self.token_prefix}…>"


class PersonalToken(models.Model):
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens")
    name = models.CharField(max_length=120, blank=True)
    token_hash = models.CharField(max_length=64, unique=True, editable=False)
    token_prefix = models.CharField(max_length=12, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True, editable=False)

    def __str__(self) -> str:
        return f"{self.user} {self.token_prefix}…"

    def __repr__(self) -> str:
        return f"<PersonalToken {self.user_id} {self.token_prefix}…>"


class ToolCallQuerySet(models.QuerySet["ToolCall"]):
    def open(self) -> ToolCallQuerySet:
        return self.exclude(status__in=ToolCall.Status.finals())


class CallStatus(models.TextChoices):
    """A call's status (``ToolCall.Status``). ``finals()`` are the ones it never leaves; the rest are open."""

    QUEUED = "queued", _("Queued")
    RUNNING = "running", _("Running")
    AWAITING_INPUT = "awaiting_input", _("Awaiting input")
    RESUMING = "resuming", _("Resuming")
    ANSWERED = "answered", _("Answered")  # relays only: every input request has its answer
    COMPLETED = "completed", _("Completed")
    FAILED = "failed", _("Failed")
    EXPIRED = "expired", _("Expired")
    CANCELLED = "cancelled", _("Cancelled")

    @classmethod
    def finals(cls) -> list[str]:
        return [cls.COMPLETED, cls.FAILED, cls.EXPIRED, cls.CANCELLED, cls.ANSWERED]

    @classmethod
    def opens(cls) -> list[str]:
        return [status for status in cls if status not in cls.finals()]

    @classmethod
    def sending(cls) -> list[str]:
        """While a send is on its way: a server's answer, or its progress, applies to the call only then."""
        return [cls.RUNNING, cls.RESUMING]


class ToolCall(models.Model):
    class Kind(models.TextChoices):
        CALL = "call", _("Hub-driven call")
        RELAY = "relay", _("Relay")

    Status = CallStatus

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    kind = models.CharField(max_length=8, choices=Kind.choices, default=Kind.CALL)
    # NULL only for a relay naming a server the hub does not know; server_label then holds the agent's name.
    server = models.ForeignKey(
        McpServer, null=True, blank=True, on_delete=models.PROTECT, related_name="calls"
    )
    server_label = models.CharField(max_length=200, blank=True)
    tool = models.CharField(max_length=200)
    arguments = models.JSONField(default=dict, blank=True)
    agent = models.ForeignKey(AgentClient, null=True, on_delete=models.PROTECT, related_name="calls")
    requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    on_behalf_of = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    # The remembered grant that let the call through its gate rule at submit; checked again before the first
    # send (gates.gate_at_send). No constraint: a grant deleted since must stop the call, not clear the link.
    grant = models.ForeignKey(
        "Grant",
        null=True,
        blank=True,
        on_delete=models.DO_NOTHING,
        db_constraint=False,
        db_index=False,
        related_name="+",
    )
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.QUEUED)
    idempotency_key = models.CharField(max_length=200, null=True, blank=True)  # noqa: DJ001  (NULL: none given)
    callback_url = models.URLField(max_length=500, blank=True)
    result = models.JSONField(null=True, blank=True)
    # A result over ELICIT_MAX_RESULT is stored truncated: flagged, with the size the server sent (bytes).
    result_truncated = models.BooleanField(default=False)
    result_size = models.PositiveBigIntegerField(null=True, blank=True)
    error = models.JSONField(null=True, blank=True)
    input_responses = models.JSONField(null=True, blank=True)  # relays: what goes back to the agent
    attempts = models.PositiveIntegerField(default=0)  # transient failures retried on the current send
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(auto_now=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    # The last progress notification: {"progress", "total", "message", "at"}.
    progress = models.JSONField(null=True, blank=True)
    # The holder process whose session runs this call (handshake era and stdio), while it runs there.
    holder = models.ForeignKey(
        Holder, null=True, blank=True, on_delete=models.SET_NULL, related_name="calls", editable=False
    )
    # A call made through /mcp: what the agent's MCP client can answer itself, as the gateway last saw it:
    # {"era": "2026-07-28" | "handshake", "modes": ["form", "url"]} (modes empty: no elicitation capability).
    agent_client = models.JSONField(null=True, blank=True, editable=False)

    objects = ToolCallQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.UniqueConstraint(
                fields=["agent", "idempotency_key"],
                condition=Q(idempotency_key__isnull=False),
                name="toolcall_idempotency_per_agent",
            ),
            models.CheckConstraint(
                condition=Q(status__in=CallStatus.finals()) | Q(finished_at__isnull=True),
                name="toolcall_finished_only_when_final",
            ),
            models.CheckConstraint(
                condition=~Q(status="completed") | Q(result__isnull=False),
                name="toolcall_completed_has_result",
            ),
            models.CheckConstraint(
                condition=Q(server__isnull=False) | (Q(kind="relay") & ~Q(server_label="")),
                name="toolcall_server_known_unless_relay",
            ),
            models.CheckConstraint(
                condition=~Q(status="failed") | Q(error__isnull=False), name="toolcall_failed_has_error"
            ),
        ]
        indexes = [
            models.Index(
                fields=["status", "updated_at"],
                condition=Q(status__in=CallStatus.opens()),
                name="toolcall_open_idx",
            ),
            models.Index(fields=["finished_at"], name="toolcall_finished_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.tool} on {self.server_name} ({self.status})"

    @property
    def server_name(self) -> str:
        return self.server.name if self.server else self.server_label

    @property
    def server_slug(self) -> str:
        return self.server.slug if self.server else self.server_label

    @property
    def is_final(self) -> bool:
        return self.status in self.Status.finals()

    @property
    def tool_annotations(self) -> dict[str, Any]:
        """What the server says about the tool in its cached tools/list: claims, never facts."""
        tool = self.server.tool(self.tool) if self.server else None
        return dict((tool or {}).get("annotations") or {})


class RoundQuerySet(models.QuerySet["Round"]):
    def open(self) -> RoundQuerySet:
        return self.filter(status=Round.Status.OPEN)

    def stale(self, now: datetime) -> RoundQuerySet:
        return self.open().filter(deadline__lte=now)


class Round(models.Model):
    class Status(models.TextChoices):
        OPEN = "open", _("Waiting for answers")
        READY = "ready", _("Answered, retry queued")
        SENDING = "sending", _("Retry in flight")
        CLOSED = "closed", _("Closed")

    class Outcome(models.TextChoices):
        ANSWERED = "answered", _("Answered")
        EXPIRED = "expired", _("Expired")
        CANCELLED = "cancelled", _("Cancelled")
        ABANDONED = "abandoned", _("Abandoned")
        GONE = "gone", _("The server stopped waiting")

    class Kind(models.TextChoices):
        RETRY = "retry", _("input_required: answered by retrying the call")
        PUSH = "push", _("elicitation/create on an open session: answered on that session")
        GATE = "gate", _("a gate: approval before the call is sent")

    call = models.ForeignKey(ToolCall, on_delete=models.CASCADE, related_name="rounds")
    number = models.PositiveIntegerField()
    kind = models.CharField(max_length=8, choices=Kind.choices, default=Kind.RETRY)
    # Push rounds: when the server stops waiting for the answer (its clock, shown to reviewers).
    server_deadline = models.DateTimeField(null=True, blank=True)
    status = models.CharField(max_length=8, choices=Status.choices, default=Status.OPEN)
    outcome = models.CharField(max_length=10, choices=Outcome.choices, blank=True)
    # The server's input_required result verbatim, minus requestState, which is kept apart below.
    raw = models.JSONField(default=dict)
    # Opaque and secret: echoed byte for byte on the retry, never shown, logged or audited. NULL = absent, or
    # forgotten once the call is final (beat: `rounds.rounds_forget_state`).
    request_state = models.TextField(null=True, blank=True, editable=False)  # noqa: DJ001  ("" is a value)
    opened_at = models.DateTimeField(default=timezone.now)  # when the input_required result arrived
    deadline = models.DateTimeField()
    extensions = models.PositiveSmallIntegerField(default=0)  # times a reviewer extended the deadline
    answered_at = models.DateTimeField(null=True, blank=True)  # the last answer that made the round ready
    send_started_at = models.DateTimeField(null=True, blank=True)
    send_attempts = models.PositiveIntegerField(default=0)
    closed_at = models.DateTimeField(null=True, blank=True)

    objects = RoundQuerySet.as_manager()

    class Meta:
        ordering = ["call", "number"]
        constraints = [
            models.UniqueConstraint(fields=["call", "number"], name="round_number_unique"),
            models.UniqueConstraint(
                fields=["call"], condition=~Q(status="closed"), name="round_one_open_per_call"
            ),
            models.CheckConstraint(
                condition=(Q(status="closed") & Q(closed_at__isnull=False))
                | (~Q(status="closed") & Q(closed_at__isnull=True)),
                name="round_closed_at_iff_closed",
            ),
        ]
        indexes = [
            models.Index(fields=["deadline"], condition=Q(status="open"), name="round_open_deadline_idx"),
            models.Index(
                fields=["status", "send_started_at"],
                condition=Q(status__in=["ready", "sending"]),
                name="round_pending_send_idx",
            ),
            # The rounds still holding a server's requestState: beat clears it once their call is final
            # (`rounds.rounds_forget_state`), so this stays about as small as the open calls.
            models.Index(
                fields=["call"], condition=Q(request_state__isnull=False), name="round_request_state_idx"
            ),
        ]

    def __str__(self) -> str:
        return f"round {self.number} of {self.call_id} ({self.status})"

    def __repr__(self) -> str:
        return f"<Round {self.pk} call={self.call_id} number={self.number} status={self.status}>"

    @property
    def idempotency_key(self) -> str:
        """Sent with every send of this round's retry, so a server can recognise a re-send."""
        return send_idempotency_key(self.call_id, self.number)


class Written(models.Expression):
    """A constant written into the statement (``'pending'``), not sent as a parameter.

    With server-side binding every value is a parameter, and a prepared statement's generic plan cannot use
    a partial index whose condition a parameter stands in for (``inputrequest_pending_idx``: status =
    'pending'). PostgreSQL then plans the statement anew at every run: the inbox page's ten-table join spent
    5-6 ms planning and 0.5 ms running. Only a word of lowercase letters and underscores is written (the
    status values), so nothing from outside can reach the statement's text this way."""

    def __init__(self, value: str) -> None:
        if not isinstance(value, str) or not value or not all(c.islower() or c == "_" for c in value):
            raise ValueError(f"not a constant that may be written into a statement: {value!r}")
        super().__init__(output_field=models.CharField())
        self.value = str(value)

    def as_sql(self, compiler: Any, connection: Any) -> tuple[str, list[Any]]:
        return f"'{self.value}'", []


class InputRequestQuerySet(models.QuerySet["InputRequest"]):
    def pending(self) -> InputRequestQuerySet:
        # Written, not bound: the pending-requests index applies to the prepared statements that use it.
        return self.filter(status=Written(InputRequest.Status.PENDING))


class InputRequest(models.Model):
    class Mode(models.TextChoices):
        FORM = "form", _("Form")
        URL = "url", _("URL")

    class Status(models.TextChoices):
        PENDING = "pending", _("Pending")
        ANSWERED = "answered", _("Answered")
        EXPIRED = "expired", _("Expired")
        UNSUPPORTED = "unsupported", _("Unsupported")
        CANCELLED = "cancelled", _("Cancelled")
        GONE = "gone", _("No longer asked")  # the server stopped waiting, or the session holding it ended

    class Action(models.TextChoices):
        ACCEPT = "accept", _("Accept")
        DECLINE = "decline", _("Decline")
        CANCEL = "cancel", _("Cancel")

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    round = models.ForeignKey(Round, on_delete=models.CASCADE, related_name="input_requests")
    key = models.CharField(max_length=500)
    method = models.CharField(max_length=100, default="elicitation/create")
    mode = models.CharField(max_length=8, choices=Mode.choices, default=Mode.FORM)
    message = models.TextField(blank=True)
    requested_schema = models.JSONField(null=True, blank=True)
    # PostgreSQL's jsonb does not keep key order: the server's order of the form's fields is kept here.
    property_order = models.JSONField(default=list, blank=True)
    url = models.TextField(blank=True)
    params = models.JSONField(default=dict)  # the elicitation params verbatim, as the server sent them
    team = models.ForeignKey(Team, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    status = models.CharField(max_length=12, choices=Status.choices, default=Status.PENDING)
    # The final answer sent to the server: set together with a non-pending status, never changed after.
    action = models.CharField(max_length=8, choices=Action.choices, blank=True)
    content = models.JSONField(null=True, blank=True)
    reason = models.TextField(blank=True)
    answered_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    answered_at = models.DateTimeField(null=True, blank=True)
    flags = models.JSONField(default=list, blank=True)  # e.g. ["sensitive_fields"], shown to reviewers
    problem = models.TextField(blank=True)  # why it is unsupported, shown to reviewers and the agent
    policy = models.ForeignKey(Policy, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    rule = models.ForeignKey(RoutingRule, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    routing = models.JSONField(default=dict, blank=True)  # which rule matched and why, for the explain page
    approvals_required = models.PositiveSmallIntegerField(default=1)
    # url mode: the person the URL was made for (the call's on_behalf_of); only they may open it.
    assignee = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    escalated_at = models.DateTimeField(null=True, blank=True)
    escalation_team = models.ForeignKey(
        Team, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    # Passed through to the agent (its rule says the requester answers): never in a reviewer's queue.
    for_requester = models.BooleanField(default=False)
    created_at = models.DateTimeField(default=timezone.now)

    objects = InputRequestQuerySet.as_manager()

    class Meta:
        ordering = ["created_at", "key"]
        constraints = [
            models.UniqueConstraint(fields=["round", "key"], name="inputrequest_key_unique_per_round"),
            models.CheckConstraint(
                condition=(Q(status="pending") & Q(action="") & Q(answered_at__isnull=True))
                | (~Q(status="pending") & ~Q(action="") & Q(answered_at__isnull=False)),
                name="inputrequest_final_answer_iff_not_pending",
            ),
            models.CheckConstraint(
                condition=Q(action="accept") | Q(content__isnull=True),
                name="inputrequest_content_only_on_accept",
            ),
            models.CheckConstraint(
                condition=(Q(mode="form") & Q(requested_schema__isnull=False)) | (Q(mode="url") & ~Q(url="")),
                name="inputrequest_mode_has_payload",
            ),
        ]
        indexes = [
            models.Index(
                fields=["team", "created_at"], condition=Q(status="pending"), name="inputrequest_pending_idx"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.key} ({self.status})"

    @property
    def form_schema(self) -> dict:
        """requestedSchema with its properties in the order the server sent them."""
        schema = dict(self.requested_schema or {})
        properties = schema.get("properties")
        if isinstance(properties, dict) and self.property_order:
            ordered = {key: properties[key] for key in self.property_order if key in properties}
            ordered.update((key, value) for key, value in properties.items() if key not in ordered)
            schema["properties"] = ordered
        return schema

    def as_input_response(self) -> dict:
        """The ElicitResult sent back to the server under this request's key."""
        response: dict = {"action": self.action}
        if self.action == self.Action.ACCEPT and self.mode == self.Mode.FORM:
            response["content"] = self.content or {}
        return response


class Gate(models.Model):
    """The approval a gate rule asked for, bound to the exact call: one per gate round.

    ``digest`` covers the server, the tool definition as the hub holds it, the canonical arguments, the agent,
    the person it acts for and the revisions of the rule and the policy (``services.gates.call_digest``).
    An approval is used once, by the call's send; the send recomputes the digest first, and any difference
    voids the approval and opens a new gate."""

    class Status(models.TextChoices):
        OPEN = "open", _("Waiting for a decision")
        APPROVED = "approved", _("Approved, not sent yet")
        USED = "used", _("Approved and sent")
        DECLINED = "declined", _("Declined")
        VOIDED = "voided", _("Voided: the call changed after approval")
        EXPIRED = "expired", _("No one decided in time")
        CANCELLED = "cancelled", _("Cancelled by the agent: not sent")

    round = models.OneToOneField(Round, on_delete=models.CASCADE, related_name="gate")
    call = models.ForeignKey(ToolCall, on_delete=models.CASCADE, related_name="gates")
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.OPEN)
    rule = models.ForeignKey(RoutingRule, null=True, on_delete=models.SET_NULL, related_name="+")
    rule_revision = models.PositiveIntegerField()
    policy = models.ForeignKey(Policy, null=True, on_delete=models.SET_NULL, related_name="+")
    policy_revision = models.PositiveIntegerField(null=True)
    # The tool's definition as the hub held it when the gate opened: name, description, schemas, annotations.
    tool = models.JSONField(default=dict)
    arguments = models.JSONField(default=dict)  # what the agent asked to send
    digest = models.CharField(max_length=64)  # of the call as asked
    # Set by the decision: what will be sent (the reviewer may have edited it), and its digest.
    approved_arguments = models.JSONField(null=True, blank=True)
    approved_digest = models.CharField(max_length=64, blank=True)
    diff = models.JSONField(default=list, blank=True)  # [{"path", "op", "from", "to"}]: asked -> approved
    decided_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    decided_at = models.DateTimeField(null=True, blank=True)
    reason = models.TextField(blank=True)  # why it was declined, or voided
    used_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["created_at"]
        constraints = [
            models.CheckConstraint(
                condition=~Q(status__in=["approved", "used"]) | ~Q(approved_digest=""),
                name="gate_approved_has_digest",
            ),
        ]

    def __str__(self) -> str:
        return f"gate of {self.call_id} ({self.status})"


class Decision(models.Model):
    """One reviewer's action on one input request (several when a policy wants N approvals)."""

    input_request = models.ForeignKey(InputRequest, on_delete=models.CASCADE, related_name="decisions")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+")
    action = models.CharField(max_length=8, choices=InputRequest.Action.choices)
    content = models.JSONField(null=True, blank=True)
    reason = models.TextField(blank=True)
    is_final = models.BooleanField(default=False)
    # An approval whose values a later reviewer changed: the count restarted without it.
    superseded = models.BooleanField(default=False)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["created_at"]
        constraints = [
            models.UniqueConstraint(
                fields=["input_request"], condition=Q(is_final=True), name="decision_one_final_per_request"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.action} by {self.user_id}"


class GrantQuerySet(models.QuerySet["Grant"]):
    def active(self, now: datetime) -> GrantQuerySet:
        """Neither revoked nor expired at ``now``: the only grants that let a call through."""
        return self.filter(Q(expires_at__isnull=True) | Q(expires_at__gt=now), revoked_at__isnull=True)

    def expired(self, now: datetime) -> GrantQuerySet:
        return self.filter(revoked_at__isnull=True, expires_at__lte=now)

    def revoked(self) -> GrantQuerySet:
        return self.filter(revoked_at__isnull=False)


class Grant(models.Model):
    """ "The same again": a reviewer's approval of a gated call, remembered for later calls of the same
    agent, for the same person, to the same tool (as defined when it was approved), with exactly the same
    arguments or with arguments meeting stated conditions. Made by ``grants.create_from_approval``;
    revocable; expires."""

    class Arguments(models.TextChoices):
        EXACT = "exact", _("Exactly these arguments")
        CONDITIONS = "conditions", _("Arguments meeting conditions")

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    agent = models.ForeignKey(AgentClient, on_delete=models.CASCADE, related_name="grants")
    # The person the agent acts for; NULL: calls naming no one. Deleting the person deletes the grant (it must
    # never widen to "no one").
    on_behalf_of = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.CASCADE, related_name="+"
    )
    server = models.ForeignKey(McpServer, on_delete=models.CASCADE, related_name="grants")
    tool = models.CharField(max_length=200)
    tool_digest = models.CharField(max_length=64)  # the tool definition as the hub held it when approved
    arguments_mode = models.CharField(max_length=10, choices=Arguments.choices)
    arguments_digest = models.CharField(max_length=64, blank=True)  # exact: digest of the canonical arguments
    arguments = models.JSONField(null=True, blank=True)  # exact: the arguments, for display
    conditions = models.JSONField(default=list, blank=True)  # conditions: RoutingRule.conditions' shape
    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="grants")
    granted_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )
    source_call = models.ForeignKey(
        ToolCall, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )  # the call whose approval made it
    created_at = models.DateTimeField(default=timezone.now)
    expires_at = models.DateTimeField(null=True, blank=True)  # NULL: until revoked
    revoked_at = models.DateTimeField(null=True, blank=True)
    revoked_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    uses = models.PositiveIntegerField(default=0)
    last_used_at = models.DateTimeField(null=True, blank=True)

    objects = GrantQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.CheckConstraint(
                condition=(Q(arguments_mode="exact") & ~Q(arguments_digest=""))
                | (Q(arguments_mode="conditions") & ~Q(conditions=[])),
                name="grant_mode_has_arguments",
            ),
            models.CheckConstraint(
                condition=Q(expires_at__isnull=True) | Q(expires_at__gt=models.F("created_at")),
                name="grant_expires_after_creation",
            ),
        ]
        indexes = [
            models.Index(
                fields=["agent", "server", "tool"],
                condition=Q(revoked_at__isnull=True),
                name="grant_lookup_idx",
            ),
        ]

    def __str__(self) -> str:
        return f"grant {self.pk} for {self.tool}"

    def state(self, now: datetime | None = None) -> str:
        """ "active", "expired" or "revoked"."""
        if self.revoked_at is not None:
            return "revoked"
        if self.expires_at is not None and self.expires_at <= (now or timezone.now()):
            return "expired"
        return "active"

    def audit_data(self) -> dict[str, Any]:
        """What an audit event about this grant names of it: never its arguments or conditions."""
        return {"grant": str(self.pk), "server": self.server.slug, "tool": self.tool}


class WebhookDelivery(models.Model):
    class Status(models.TextChoices):
        PENDING = "pending", _("Pending")
        DELIVERED = "delivered", _("Delivered")
        FAILED = "failed", _("Gave up")

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    call = models.ForeignKey(ToolCall, on_delete=models.CASCADE, related_name="deliveries")
    event_type = models.CharField(max_length=40)
    url = models.URLField(max_length=500)
    payload = models.JSONField()
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField(default=timezone.now)
    delivered_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["created_at"]
        constraints = [
            models.UniqueConstraint(fields=["call", "event_type"], name="webhook_one_per_event"),
        ]

    def __str__(self) -> str:
        # Admin titles and breadcrumbs show this: never the URL, whose query may hold the receiver's token.
        return f"{self.event_type} ({self.status})"


class WebhookAttempt(models.Model):
    delivery = models.ForeignKey(WebhookDelivery, on_delete=models.CASCADE, related_name="attempt_log")
    number = models.PositiveIntegerField()
    at = models.DateTimeField(default=timezone.now)
    status_code = models.PositiveIntegerField(null=True, blank=True)
    error = models.TextField(blank=True)
    duration_ms = models.PositiveIntegerField(default=0)

    class Meta:
        ordering = ["delivery", "number"]
        constraints = [models.UniqueConstraint(fields=["delivery", "number"], name="webhookattempt_unique")]

    def __str__(self) -> str:
        return f"attempt {self.number}: {self.status_code or self.error}"


class Notification(models.Model):
    class Kind(models.TextChoices):
        EMAIL = "email", _("Email")
        CHAT = "chat", _("Chat webhook")

    class Status(models.TextChoices):
        PENDING = "pending", _("Pending")
        SENT = "sent", _("Sent")
        FAILED = "failed", _("Gave up")

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="notifications")
    input_request = models.ForeignKey(InputRequest, on_delete=models.CASCADE, related_name="notifications")
    kind = models.CharField(max_length=8, choices=Kind.choices)
    event = models.CharField(max_length=20)  # routed | escalated | expiring | expiring.N (after extension N)
    status = models.CharField(max_length=8, choices=Status.choices, default=Status.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    last_error = models.TextField(blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    # When its latest try began: the recovery sweep waits out that try's retry from here, not from creation.
    last_attempt_at = models.DateTimeField(null=True, blank=True, editable=False)
    sent_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["created_at"]
        constraints = [
            models.UniqueConstraint(
                fields=["team", "input_request", "kind", "event"], name="notification_once"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.kind} {self.event} to {self.team_id} ({self.status})"


class AuditEvent(models.Model):
    """Append-only (PostgreSQL triggers refuse UPDATE, TRUNCATE and any DELETE but a recorded prune, migration
    0007), hash-chained row by row.

    ``tool``, ``action`` and ``outcome`` are filled by ``audit.record`` and covered by the hash; ``search`` is
    derived (a BEFORE INSERT trigger fills it, migration 0003) and is not.
    """

    class ActorType(models.TextChoices):
        USER = "user", _("User")
        AGENT = "agent", _("Agent")
        SYSTEM = "system", _("System")

    id = models.BigAutoField(primary_key=True)
    at = models.DateTimeField()
    actor_type = models.CharField(max_length=8, choices=ActorType.choices)
    actor_id = models.CharField(max_length=64, blank=True)
    actor_label = models.CharField(max_length=200, blank=True)
    verb = models.CharField(max_length=64)
    call_id = models.UUIDField(null=True, blank=True)
    input_request_id = models.UUIDField(null=True, blank=True)
    server_slug = models.CharField(max_length=50, blank=True)
    team_slug = models.CharField(max_length=50, blank=True)
    tool = models.CharField(max_length=200, blank=True, default="")
    action = models.CharField(max_length=8, blank=True, default="")
    outcome = models.CharField(max_length=16, blank=True, default="")
    data = models.JSONField(default=dict)
    prev_hash = models.CharField(max_length=64)
    hash = models.CharField(max_length=64, unique=True)
    search = SearchVectorField(null=True, editable=False)

    class Meta:
        ordering = ["id"]
        indexes = [
            models.Index(fields=["call_id", "id"], name="audit_call_idx"),
            models.Index(fields=["verb", "id"], name="audit_verb_idx"),
            models.Index(fields=["at"], name="audit_at_idx"),
            # The dashboard's grant suggestion: gate decisions of the last days, per team and tool.
            models.Index(
                fields=["at", "team_slug", "server_slug", "tool"],
                condition=Q(verb__in=["gate.approved", "gate.declined"]),
                name="audit_gate_decisions_idx",
            ),
            # Every filter of the audit page is "column = value, newest first": (column, id) serves both.
            models.Index(fields=["input_request_id", "id"], name="audit_input_request_idx"),
            models.Index(fields=["team_slug", "id"], name="audit_team_idx"),
            models.Index(fields=["server_slug", "id"], name="audit_server_idx"),
            models.Index(fields=["tool", "id"], name="audit_tool_idx"),
            models.Index(fields=["actor_label", "id"], name="audit_actor_idx"),
            models.Index(fields=["action", "id"], condition=~Q(action=""), name="audit_action_idx"),
            models.Index(fields=["outcome", "id"], condition=~Q(outcome=""), name="audit_outcome_idx"),
            GinIndex(fields=["search"], name="audit_search_idx"),
        ]

    def __str__(self) -> str:
        return f"#{self.pk} {self.verb} by {self.actor_label or self.actor_type}"


class AuditHead(models.Model):
    """The newest audit event the chain check last verified, kept outside the audit table: a later check that
    finds it gone (and not pruned) or changed reports a cut or rewritten tail. One row, and a trigger lets it
    only move forward (migration 0007)."""

    id = models.PositiveSmallIntegerField(primary_key=True, default=1)
    head_id = models.BigIntegerField()
    head_hash = models.CharField(max_length=64)
    recorded_at = models.DateTimeField()

    class Meta:
        constraints = [models.CheckConstraint(condition=Q(id=1), name="audithead_single_row")]

    def __str__(self) -> str:
        return f"audit head #{self.head_id}"
