"""Admin: servers, agents, teams. Secrets are write-only here; calls and audit events are read-only.

Every add, change and delete of configuration made here is audited (``AuditedAdmin``)."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.auth import get_user_model
from django.contrib.auth.admin import GroupAdmin, UserAdmin
from django.contrib.auth.models import Group, Permission
from django.core.serializers.json import DjangoJSONEncoder
from django.core.validators import validate_email
from django.db import models, transaction
from django.db.models import Count, Q, QuerySet
from django.db.models.constants import LOOKUP_SEP
from django.forms.fields import InvalidJSONInput
from django.http import HttpRequest
from django.utils import timezone
from django.utils.crypto import constant_time_compare, salted_hmac
from django.utils.text import capfirst

from approvals import netguard, rules, safejson, schema_forms, urlsafety
from approvals.audit.core import Actor
from approvals.audit.verbs import VERBS
from approvals.mcp_client import toollist
from approvals.models import (
    AgentClient,
    AuditEvent,
    Gate,
    Grant,
    InputRequest,
    McpServer,
    Membership,
    Notification,
    PersonalToken,
    Policy,
    Round,
    RoutingRule,
    Team,
    TeamSlug,
    ToolCall,
    WebhookAttempt,
    WebhookDelivery,
)
from approvals.services import config_audit, tokens
from approvals.services import stdio as stdio_rules
from approvals.services.notifications import ADDRESS_BREAK
from approvals.services.sending import check_call_timeout, check_tool_timeouts
from approvals.services.servers import (
    LEARNED,
    parse_header_lines,
    probe_summary,
    server_moved,
    server_probe,
    server_probe_run,
)
from approvals.throttling import ThrottledAdminAuthenticationForm, answer_throttled_with_429


class HubAdmin(admin.ModelAdmin):
    """Filters a changelist only as its ``list_filter`` (and ``date_hierarchy``) offer. Django lets a query
    string filter on any of the model's own fields (``?headers__Authorization__startswith=Bearer a``): with
    the count it shows, a user who may only view the list could read a credential, a hidden part of a URL or
    a token's hash letter by letter."""

    def lookup_allowed(self, lookup: str, value: Any, request: HttpRequest | None = None) -> bool:
        offered = {self.date_hierarchy} if self.date_hierarchy else set()
        for item in self.get_list_filter(request) if request is not None else self.list_filter:
            if isinstance(item, type) and issubclass(item, admin.SimpleListFilter):
                offered.add(str(item.parameter_name))
            else:
                name = item[0] if isinstance(item, list | tuple) else item
                offered.add(str(getattr(name, "name", name)))  # a path, or a field
        first = lookup.split(LOOKUP_SEP, 1)[0]
        if first not in {name.split(LOOKUP_SEP, 1)[0] for name in offered}:
            return False
        return super().lookup_allowed(lookup, value, request)


class ReadOnlyAdmin(HubAdmin):
    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


SEEN_STATE = "seen_state"


def _state_token(obj: models.Model) -> str:
    """A keyed digest of `obj`'s configuration as the audit compares it (`config_audit.state`: secrets as
    digests of their own, never their values; what the hub writes itself left out). Keyed, so that a page
    holding it tells nothing of a secret that a guess could be checked against."""
    values = config_audit.state(obj).values
    text = json.dumps(values, sort_keys=True, cls=DjangoJSONEncoder, default=str)
    return salted_hmac("approvals.admin.seen_state", text).hexdigest()


class SeenStateForm(forms.ModelForm):
    """A change form that remembers the object as it was shown (`SEEN_STATE`, hidden) and is refused if
    someone saved the object since: the form posts every field, so saving it would put back, unseen, what
    the other admin had just changed (a gate switched on again, a team or policy restored), and record it as
    this admin's change. A post without it (a script that builds the form itself) is not checked."""

    seen_state = forms.CharField(required=False, widget=forms.HiddenInput)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.instance.pk and not self.is_bound and SEEN_STATE in self.fields:
            self.initial[SEEN_STATE] = _state_token(self.instance)

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean() or {}
        seen = cleaned.get(SEEN_STATE)
        if seen and self.instance.pk:
            stored = type(self.instance)._default_manager.filter(pk=self.instance.pk).first()
            if stored is not None and not constant_time_compare(seen, _state_token(stored)):
                name = capfirst(str(self.instance._meta.verbose_name))
                raise forms.ValidationError(
                    f"{name} “{stored}” was changed by someone else since this page was opened. Reload the "
                    "page to see that change, then make yours again: saving this form would undo it.",
                    code="changed_meanwhile",
                )
        return cleaned


class AuditedAdmin(HubAdmin):
    """Audits what is saved or deleted here, in the admin's own transaction, by the signed-in user: the
    object's fields and many-to-many fields (``approvals.services.config_audit``), then each row its inlines
    add, change or delete, and on deletion the audited rows that go or change with it. Secrets only as
    "set", "changed" or "cleared". A change form is refused when the object changed since it was shown
    (`SeenStateForm`)."""

    form = SeenStateForm

    def get_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        fields = [name for name in super().get_fields(request, obj) if name != SEEN_STATE]
        checked = obj is not None and issubclass(self.form, SeenStateForm)
        if checked and self.has_change_permission(request, obj):
            fields.append(SEEN_STATE)
        return fields

    def get_changelist_form(self, request: HttpRequest, **kwargs: Any) -> Any:
        """The list's editable columns (``list_editable``) compared with the values the page showed (each with
        its hidden initial value), not with those stored as the list is saved: a row is saved only where
        this admin changed it. Compared with the stored row, every row someone else changed since the page
        was shown (a gate switched on) would count as changed, be put back as shown, unseen, and recorded as
        this admin's change."""
        base = super().get_changelist_form(request, **kwargs)

        class ComparedAsShown(base):  # type: ignore[valid-type,misc]
            def __init__(self, *args: Any, **kwargs: Any) -> None:
                super().__init__(*args, **kwargs)
                for field in self.fields.values():
                    field.show_hidden_initial = True

        return ComparedAsShown

    def save_model(self, request: HttpRequest, obj: Any, form: Any, change: bool) -> None:
        form.audit_before = config_audit.stored(obj) if change else None  # before the form's values land
        written = self.saved_fields(form) if change else None
        if written is None:
            super().save_model(request, obj, form, change)
        else:
            obj.save(update_fields=written)

    def saved_fields(self, form: Any) -> list[str] | None:
        """The fields a change writes: those an admin edits, never those the hub writes itself (a token's
        hash, a webhook secret, a last use, a server's probe). The row was read as the request began, and
        writing it back whole would put back what the hub changed since (a token rotated meanwhile would
        work again). None: all of them."""
        return [
            field.name
            for field in self.model._meta.concrete_fields
            if field.editable and not field.primary_key
        ]

    def save_related(self, request: HttpRequest, form: Any, formsets: Sequence[Any], change: bool) -> None:
        super().save_related(request, form, [], change)  # the object's many-to-many fields, then its event
        config_audit.saved(form.instance, getattr(form, "audit_before", None), actor=Actor.user(request.user))
        for formset in formsets:
            self.save_formset(request, form, formset, change=change)

    def save_formset(self, request: HttpRequest, form: Any, formset: Any, change: bool) -> None:
        if formset.model not in config_audit.AUDITED:
            super().save_formset(request, form, formset, change)
            return
        touched = [row.instance.pk for row in formset.initial_forms if row.has_changed() and row.instance.pk]
        gone = [row.instance.pk for row in formset.deleted_forms if row.instance.pk]
        before = config_audit.stored_many(formset.model, touched)
        super().save_formset(request, form, formset, change)
        actor = Actor.user(request.user)
        for obj in formset.new_objects:
            config_audit.saved(obj, None, actor=actor)
        for obj, _ in formset.changed_objects:
            config_audit.saved(obj, before.get(obj.pk), actor=actor)
        for pk in gone:
            config_audit.deleted(before[pk], actor=actor)

    def delete_model(self, request: HttpRequest, obj: Any) -> None:
        with config_audit.deleting([obj], actor=Actor.user(request.user)):
            super().delete_model(request, obj)

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[models.Model]) -> None:
        with config_audit.deleting(list(queryset), actor=Actor.user(request.user)):
            super().delete_queryset(request, queryset)


@contextmanager
def _users_deleting(users: Sequence[Any], *, actor: Actor) -> Iterator[None]:
    """Record, as the deletion of ``users`` (done in the block) makes them, the configuration changes it
    takes along: their memberships and personal tokens deleted, each naming the user, the agents they
    owned or that could act for them changed (the owner set to null, the user gone from those acted for),
    and the active grants made for them ended."""
    with transaction.atomic():
        via = [config_audit.state(user) for user in users]
        gone = [
            config_audit.state(row)
            for model in (Membership, PersonalToken)
            for row in model.objects.filter(user__in=users).select_related("user")
        ]
        agents = AgentClient.objects.filter(Q(owner__in=users) | Q(acts_for_users__in=users)).distinct()
        before = {agent.pk: config_audit.state(agent) for agent in agents}
        grants = config_audit.active_grants(Grant.objects.filter(on_behalf_of__in=users))
        yield
        for row in gone:
            config_audit.deleted(row, actor=actor, via=via)
        config_audit.grants_ended(grants, actor=actor, via=via)
        for agent in AgentClient.objects.filter(pk__in=list(before)):
            config_audit.saved(agent, before[agent.pk], actor=actor)


# What makes an account more than its holder: shown, never changed, to a user who is not a superuser.
PRIVILEGES = ("is_superuser", "groups", "user_permissions")


def _holds_more(account: Any, user: Any) -> bool:
    """Whether `account` holds more than `user`: it is a superuser and `user` is not, or it holds a
    permission (its own or a group's, whether or not it is active: it may be made active again) that `user`
    lacks."""
    if user.is_superuser:
        return False
    if account.is_superuser:
        return True
    held = Permission.objects.filter(Q(user=account) | Q(group__user=account)).values_list(
        "content_type__app_label", "codename"
    )
    return not {f"{app}.{codename}" for app, codename in held} <= user.get_all_permissions()


class AuditedUserAdmin(HubAdmin, UserAdmin):
    """Django's own user admin, but a user's deletion audits the configuration it takes along, and its list
    filters only as offered (not on a password's hash).

    Only a superuser grants privileges (`PRIVILEGES`), and an account that holds more than the signed-in user
    (a superuser, or a permission they lack: `_holds_more`) is theirs only to view: whoever may change users
    (to add reviewers, to deactivate one who left) could otherwise make themselves a superuser, give
    themselves a group's permissions, or take over a stronger account by setting its password."""

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        fields = list(super().get_readonly_fields(request, obj))
        if not request.user.is_superuser:
            fields += [name for name in PRIVILEGES if name not in fields]
        return fields

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        if obj is not None and _holds_more(obj, request.user):
            return False
        return super().has_change_permission(request, obj)

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        if obj is not None and _holds_more(obj, request.user):
            return False
        return super().has_delete_permission(request, obj)

    def delete_model(self, request: HttpRequest, obj: Any) -> None:
        with _users_deleting([obj], actor=Actor.user(request.user)):
            super().delete_model(request, obj)

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        with _users_deleting(list(queryset), actor=Actor.user(request.user)):
            super().delete_queryset(request, queryset)


admin.site.unregister(get_user_model())
admin.site.register(get_user_model(), AuditedUserAdmin)


class HubGroupAdmin(HubAdmin, GroupAdmin):
    """Django's own group admin, but only a superuser changes what a group permits: whoever may change
    groups could otherwise give every permission to a group they are in."""

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        fields = list(super().get_readonly_fields(request, obj))
        return fields if request.user.is_superuser else [*fields, "permissions"]


admin.site.unregister(Group)
admin.site.register(Group, HubGroupAdmin)


class KeepsPendingAdmin(AuditedAdmin):
    """Refuses to delete what a pending input request still points to (``pending_links``: its team, its
    escalation team, its policy): the link would be set to null under the request, which would then lose
    its reviewers (a request of no team is any staff member's), its fallback team, or its policy's recent
    sign-in and escalation. The deletion page says which requests hold it; it may go once they are closed."""

    pending_links: tuple[str, ...] = ()
    SHOWN_PENDING = 20

    def get_deleted_objects(self, objs: Any, request: HttpRequest) -> Any:
        deleted, counts, perms_needed, protected = super().get_deleted_objects(objs, request)
        pks = [obj.pk for obj in objs]
        held = Q()
        for link in self.pending_links:
            held |= Q(**{f"{link}__in": pks})
        pending = (
            InputRequest.objects.filter(held, status=InputRequest.Status.PENDING)
            .select_related("round")
            .only("key", "round__call_id")
            .order_by("created_at", "pk")
        )
        total = pending.count()
        if total:
            shown = [
                f"Pending input request “{ir.key}” of call {ir.round.call_id}"
                for ir in pending[: self.SHOWN_PENDING]
            ]
            if total > len(shown):
                shown.append(f"… and {total - len(shown)} more pending input requests")
            protected = [*protected, *shown]
        return deleted, counts, perms_needed, protected


def _guarded_url(url: str) -> str:
    """A field error unless the outbound guard lets the hub send requests to `url`."""
    if url:
        try:
            netguard.check_url(url)
        except netguard.Refused as exc:
            raise forms.ValidationError(
                f"The hub may not send requests here: {exc.message}. ELICIT_OUTBOUND_ALLOW lists exceptions."
            ) from None
    return url


class WriteOnlyTextarea(forms.Textarea):
    """A textarea for secrets: what was typed is never rendered back, not even when the form has errors."""

    def format_value(self, value: Any) -> None:
        return None


class ShownUrlInput(forms.URLInput):
    """A server's URL as it may be shown (`urlsafety.shown`): its query values and password are credentials,
    never rendered, not even the ones just typed beside a form's errors."""

    def format_value(self, value: Any) -> str | None:
        return urlsafety.shown(str(value)) if value else None


class StorableJSONField(forms.JSONField):
    """JSON as typed, parsed as the hub parses what arrives from outside (`safejson`), so that what cannot be
    stored (NUL, a lone surrogate, ``NaN``, nesting past `MAX_DEPTH`: PostgreSQL or Python's recursion would
    refuse it at save or where it is read) or is too long is a field error, never a server error."""

    MAX_DEPTH = 16
    MAX_CHARS = 64 * 1024
    too_long = "At most {chars} characters of JSON."
    unstorable = "This cannot be stored: {problem}."

    def to_python(self, value: Any) -> Any:
        if self.disabled or not isinstance(value, str):
            return super().to_python(value)
        if value in self.empty_values:
            return None
        if len(value) > self.MAX_CHARS:
            raise forms.ValidationError(self.too_long.format(chars=self.MAX_CHARS))
        try:
            return safejson.loads(value, max_depth=self.MAX_DEPTH)
        except safejson.Unstorable as exc:
            raise forms.ValidationError(self.unstorable.format(problem=exc)) from None
        except ValueError:
            raise forms.ValidationError(self.error_messages["invalid"], code="invalid") from None

    def bound_data(self, data: Any, initial: Any) -> Any:
        if self.disabled or not isinstance(data, str):
            return super().bound_data(data, initial)
        try:
            return self.to_python(data)
        except forms.ValidationError:
            return InvalidJSONInput(data)


class McpServerForm(SeenStateForm):
    may_run_commands = True  # whether the user may set what the hub runs (`_check_may_run`): `get_form` says
    new_headers = forms.CharField(
        label="Set credentials",
        required=False,
        widget=WriteOnlyTextarea(attrs={"rows": 3, "autocomplete": "off"}),
        help_text='One "Name: value" per line, e.g. "Authorization: Bearer ..."; replaces stored headers. '
        "Stored values are never shown; leave empty to keep them.",
    )
    clear_headers = forms.BooleanField(label="Remove stored credentials", required=False)
    # stdio servers (a command the hub runs): its arguments, and its environment (write-only, like headers).
    arguments = forms.CharField(
        label="Arguments",
        required=False,
        max_length=stdio_rules.MAX_ARGS * (stdio_rules.MAX_ARG + 1),
        widget=forms.Textarea(attrs={"rows": 3}),
        help_text="stdio: one argument per line, passed as they are (no shell).",
    )
    new_env = forms.CharField(
        label="Set environment",
        required=False,
        max_length=stdio_rules.MAX_ENV * (stdio_rules.MAX_ENV_VALUE + 130),
        widget=WriteOnlyTextarea(attrs={"rows": 3, "autocomplete": "off"}),
        help_text='stdio: one "NAME=value" per line; replaces the stored environment. Stored values are '
        "never shown; leave empty to keep them. The server gets only these over a minimal PATH and HOME.",
    )
    clear_env = forms.BooleanField(label="Remove stored environment", required=False)
    tool_timeouts = StorableJSONField(
        required=False, help_text=McpServer._meta.get_field("tool_timeouts").help_text
    )

    class Meta:
        model = McpServer
        fields = [
            "slug",
            "name",
            "transport",
            "url",
            "command",
            "era",
            "enabled",
            "default_team",
            "round_ttl",
            "on_expiry",
            # Long tools: how long a tools/call may run, and whether a re-send is safe.
            "call_timeout",
            "tool_timeouts",
            "honours_idempotency_key",
        ]
        help_texts = {
            "command": "stdio: an absolute path, or a name found on the hub's PATH.",
            "url": f"Query values, a password and a key in the path are credentials: shown as "
            f"{urlsafety.HIDDEN}. Leave the "
            "address as shown to keep it; to change it, type the whole address again, with its values.",
        }
        widgets = {"url": ShownUrlInput(attrs={"autocomplete": "off"})}

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Streamable HTTP unless stdio is chosen; call_timeout: the model's default (600 s) when left empty;
        # era left out: automatic. (Shown read-only, to a user who may only view, the form has no fields.)
        for name in ("transport", "call_timeout", "era"):
            if name in self.fields:
                self.fields[name].required = False
        # The stored address is compared as shown: left as shown, it is unchanged (and kept, in `clean_url`).
        self.stored_url = self.instance.url if self.instance.pk else ""
        if self.stored_url:
            self.initial["url"] = urlsafety.shown(self.stored_url)
        if self.instance.pk and not self.is_bound:
            self.initial["arguments"] = "\n".join(self.instance.args or [])

    def clean_url(self) -> str:
        url = self.cleaned_data.get("url") or ""
        if self.stored_url and url == urlsafety.shown(self.stored_url):
            return self.stored_url  # left as shown: the stored address, hidden values included, stays
        if urlsafety.holds_hidden(url):
            raise forms.ValidationError(
                f"The address holds {urlsafety.HIDDEN} where a hidden value was: the stored values do not "
                "follow an edited address. Type the whole address again, with its values."
            )
        return _guarded_url(url)

    def clean_call_timeout(self) -> int:
        value = self.cleaned_data.get("call_timeout")
        if value is None:
            return int(McpServer._meta.get_field("call_timeout").get_default())
        try:
            return check_call_timeout(value)
        except ValueError as exc:
            raise forms.ValidationError(str(exc)) from None

    def clean_tool_timeouts(self) -> dict[str, int]:
        try:
            return check_tool_timeouts(self.cleaned_data.get("tool_timeouts"))
        except ValueError as exc:
            raise forms.ValidationError(str(exc)) from None

    def clean_era(self) -> str:
        return self.cleaned_data.get("era") or McpServer.Era.AUTO

    def clean_new_headers(self) -> dict[str, str] | None:
        raw = self.cleaned_data.get("new_headers") or ""
        try:
            return parse_header_lines(raw.splitlines()) or None
        except ValueError as exc:  # never names a value: what was typed is a credential
            raise forms.ValidationError(capfirst(f"{exc}.")) from None

    def clean_arguments(self) -> list[str]:
        raw = self.cleaned_data.get("arguments") or ""
        try:
            return stdio_rules.check_args(line.rstrip("\r") for line in raw.split("\n") if line.strip())
        except ValueError as exc:
            raise forms.ValidationError(str(exc)) from None

    def clean_new_env(self) -> dict[str, str] | None:
        raw = self.cleaned_data.get("new_env") or ""
        try:
            return stdio_rules.parse_env_lines(raw.split("\n")) or None
        except ValueError as exc:
            raise forms.ValidationError(f"The environment: {exc}.") from None

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean() or {}
        transport = cleaned.get("transport") or McpServer.Transport.HTTP
        cleaned["transport"] = transport
        if transport == McpServer.Transport.STDIO:
            if cleaned.get("url"):
                self.add_error("url", "A stdio server has no URL.")
            try:
                cleaned["command"] = stdio_rules.check_command(cleaned.get("command") or "")
            except ValueError as exc:
                self.add_error("command", str(exc))
            else:
                self._check_may_run(cleaned)
                self._check_environment_follows(cleaned)
        else:
            if not cleaned.get("url") and "url" not in self.errors:
                self.add_error("url", "A Streamable HTTP server needs its URL.")
            if cleaned.get("command") or cleaned.get("arguments") or cleaned.get("new_env"):
                self.add_error("command", "Only a stdio server has a command, arguments or environment.")
            self._check_credentials_follow(cleaned)
        return cleaned

    def _check_credentials_follow(self, cleaned: dict[str, Any]) -> None:
        """Stored credentials are never shown, so they never follow the server to another origin (scheme,
        host, port) unseen: whoever may edit the URL could otherwise read them at an address of their own.
        Moved elsewhere, the server's credentials are set again with it, or removed."""
        stored, url = self.stored_url, cleaned.get("url") or ""
        if not (stored and url and self.instance.headers):
            return
        if cleaned.get("new_headers") or cleaned.get("clear_headers"):
            return
        before, after = urlsafety.request_origin(stored), urlsafety.request_origin(url)
        if before != after:
            self.add_error(
                "new_headers",
                f"The stored credentials were set for {before or 'another address'}; to send requests to "
                f"{after or 'this address'}, set them again here, or remove them.",
            )

    def _check_may_run(self, cleaned: dict[str, Any]) -> None:
        """A stdio server's command, arguments and environment (``LD_PRELOAD``, ``NODE_OPTIONS``...) say
        what the hub runs on its own host, as the hub's user, who can read the hub's secrets: only a
        superuser registers one or changes them. Whoever may only change servers could otherwise make
        themselves a superuser by running a program of theirs. Removing the environment is a change that runs
        nothing new."""
        if self.may_run_commands:
            return
        stored = self.instance
        same = (
            stored.pk is not None
            and stored.transport == McpServer.Transport.STDIO
            and (cleaned.get("command"), cleaned.get("arguments") or [])
            == (stored.command, list(stored.args or []))
        )
        if not same or cleaned.get("new_env"):
            self.add_error(
                "command",
                "Only a superuser registers a server the hub runs (stdio) or changes its command, arguments "
                "or environment: they run on the hub's own host.",
            )

    def _check_environment_follows(self, cleaned: dict[str, Any]) -> None:
        """A stdio server's stored environment (its secrets, never shown) was given to one program: it does
        not follow the server to another command or other arguments unseen. Whoever may edit them could
        otherwise run a program of their own with it (``env``, or a package of theirs under ``npx``) and read
        it there. Changed, the environment is set again with them, or removed."""
        stored = self.instance
        if not (stored.pk and stored.env and stored.transport == McpServer.Transport.STDIO):
            return
        if cleaned.get("new_env") or cleaned.get("clear_env") or "arguments" in self.errors:
            return
        if (cleaned.get("command"), cleaned.get("arguments") or []) != (
            stored.command,
            list(stored.args or []),
        ):
            self.add_error(
                "new_env",
                "The stored environment was set for the command and arguments as they were; to run these, "
                "set it again here, or remove it.",
            )

    def save(self, commit: bool = True) -> McpServer:
        server = super().save(commit=False)
        self.moved = bool(
            self.instance.pk and (server.url != self.stored_url or "transport" in self.changed_data)
        )
        if self.moved:
            server_moved(server)  # the old address's era and tools are not the new one's
        if self.cleaned_data.get("clear_headers"):
            server.headers = {}
        elif self.cleaned_data.get("new_headers"):
            server.headers = self.cleaned_data["new_headers"]
        server.args = self.cleaned_data.get("arguments") or []
        if self.cleaned_data.get("clear_env"):
            server.env = {}
        elif self.cleaned_data.get("new_env"):
            server.env = self.cleaned_data["new_env"]
        if commit:
            server.save()
        return server


@admin.register(McpServer)
class McpServerAdmin(AuditedAdmin):
    form = McpServerForm
    list_display = [
        "slug",
        "name",
        "transport",
        "address",
        "era",
        "probe_state",
        "enabled",
        "default_team",
        "credentials",
    ]
    list_select_related = ["default_team"]
    list_filter = ["era"]
    search_fields = ["slug", "name"]  # not the URL: a search would tell its hidden values letter by letter
    readonly_fields = ["probe_details"]

    def get_form(self, request: HttpRequest, obj: Any = None, change: bool = False, **kwargs: Any) -> Any:
        form = super().get_form(request, obj, change=change, **kwargs)
        if request.user.is_superuser:
            return form
        return type(form.__name__, (form,), {"may_run_commands": False})

    def get_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        """Read-only (a user who may only view servers), a field shows as stored: the URL only as shown."""
        fields = super().get_fields(request, obj)
        if obj is not None and not self.has_change_permission(request, obj):
            return ["address" if name == "url" else name for name in fields]
        return fields

    def save_model(self, request: HttpRequest, obj: McpServer, form: Any, change: bool) -> None:
        """An HTTP server is probed as the form configures it before anything is written: the admin's
        transaction then holds no lock (the audit chain's, the server's row) while a slow server answers."""
        form.probe_result = server_probe_run(obj)
        super().save_model(request, obj, form, change)

    def saved_fields(self, form: Any) -> list[str] | None:
        """What an admin configures, and what the server learned at its address when it moved (emptied):
        never its probe and tool list otherwise, nor a stdio server's holder lease (a holder that took it
        since the request began would lose it, and a second holder would start the same server)."""
        fields = super().saved_fields(form) or []
        return [*fields, *LEARNED] if getattr(form, "moved", False) else fields

    def save_related(self, request: HttpRequest, form: Any, formsets: Sequence[Any], change: bool) -> None:
        """Saved (and audited) first, then what the probe found is stored: an unreachable or incompatible
        server is flagged at once and still registered."""
        super().save_related(request, form, formsets, change)
        obj: McpServer = form.instance
        result = getattr(form, "probe_result", None)
        if result is None:
            return
        found = server_probe(obj, result=result, actor=Actor.user(request.user))
        # What the server said (its name, its error) quoted as the list and the server's page quote it: a
        # direction override or a control character must not make a failed probe read as a good one.
        summary = f"Probe of {obj.slug}: {rules.shown(probe_summary(found))}"
        if found.get("ok"):
            self.message_user(request, summary, messages.SUCCESS)
            return
        error = found.get("error") or {}
        hint = f" Hint: {found['hint']}." if found.get("hint") else ""
        self.message_user(
            request,
            f"{summary}. {rules.shown(str(error.get('message', '')))}.{hint} The server is registered all "
            "the same.",
            messages.WARNING,
        )

    @admin.display(description="URL")
    def address(self, obj: McpServer) -> str:
        return urlsafety.shown(obj.url)

    @admin.display(description="probe")
    def probe_state(self, obj: McpServer) -> str:
        return rules.shown(probe_summary(obj.probe))  # the server's own name, as it says it

    @admin.display(description="last probe")
    def probe_details(self, obj: McpServer) -> str:
        found = obj.probe
        if not found:
            return "Not probed yet: saving an HTTP server probes it."
        lines = [probe_summary(found)]
        if found.get("protocol_version"):
            lines.append(f"Protocol version: {found['protocol_version']}")
        if found.get("capabilities"):
            lines.append("Capabilities: " + ", ".join(sorted(found["capabilities"])))
        error = found.get("error")
        if error:
            lines.append(f"Error: {error.get('code')}: {error.get('message')}")
        if found.get("hint"):
            lines.append(f"Hint: {found['hint']}")
        if obj.probed_at:
            lines.append(f"Probed at {obj.probed_at:%Y-%m-%d %H:%M:%S %Z}")
        if obj.tools:
            names = (str(tool.get("name"))[: toollist.MAX_NAME] for tool in obj.tools[:100])
            lines.append("Tools: " + ", ".join(names))
        # What the server said (its name, capabilities, tool names, error) as the hub quotes it elsewhere: a
        # direction override or a control character must not make a tool's name read as another's.
        return "\n".join(rules.shown(line) for line in lines)

    @admin.display(description="credentials")
    def credentials(self, obj: McpServer) -> str:
        held = [f"{len(obj.headers)} header(s)"] if obj.headers else []
        held += [f"{len(obj.env)} environment variable(s)"] if obj.env else []
        return " and ".join(held) + " set" if held else "none"


@admin.register(AgentClient)
class AgentClientAdmin(AuditedAdmin):
    list_display = ["name", "token_prefix", "owner", "is_active", "last_used_at"]
    list_select_related = ["owner"]
    fields = [
        "name",
        "servers",
        "owner",
        "acts_for_users",
        "acts_for_teams",
        "is_active",
        "token_prefix",
        "has_webhook_secret",
        "previous_secret_signs_until",
        "last_used_at",
    ]
    readonly_fields = ["token_prefix", "has_webhook_secret", "previous_secret_signs_until", "last_used_at"]
    filter_horizontal = ["servers", "acts_for_users", "acts_for_teams"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # tokens are shown once, by `manage.py create_agent` (and `rotate_agent`)

    @admin.display(boolean=True, description="webhook secret set")
    def has_webhook_secret(self, obj: AgentClient) -> bool:
        return bool(obj.webhook_secret)

    @admin.display(description="replaced secret still signs until")
    def previous_secret_signs_until(self, obj: AgentClient) -> Any:
        # `manage.py rotate_agent --webhook-secret` keeps the replaced secret signing for an overlap.
        held = tokens.signing_secrets(obj, timezone.now())
        return obj.previous_webhook_secret_until if len(held) > 1 else "-"


@admin.register(PersonalToken)
class PersonalTokenAdmin(AuditedAdmin):
    list_display = ["user", "name", "token_prefix", "created_at", "last_used_at"]
    # A tuple: the same names serve as `fields` and `readonly_fields`, whose stubs want different lists.
    fields = ("user", "name", "token_prefix", "created_at", "last_used_at")
    readonly_fields = fields

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False


class ShownRowForm(forms.ModelForm):
    """An inline's row compared with the values the page showed (each field with its hidden initial value),
    not with those stored as the page is saved: a row is saved only where this admin changed it. Compared with
    the stored row, every row someone else changed since the page was shown (a member made a viewer) would
    count as changed, be put back as shown, unseen, and recorded as this admin's change. A row both changed
    is refused, saying so."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for field in self.fields.values():
            field.show_hidden_initial = True

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean() or {}
        if self.instance.pk and self.has_changed() and self._changed_meanwhile():
            raise forms.ValidationError(
                f"“{self.instance}” was changed by someone else since this page was opened. Reload the page "
                "to see that change, then make yours again: saving this row would undo it.",
                code="changed_meanwhile",
            )
        return cleaned

    def _changed_meanwhile(self) -> bool:
        """A field's stored value is not the one the page showed (a post without them is not checked)."""
        for name, field in self.fields.items():
            shown_as = self[name].html_initial_name
            if shown_as not in self.data:
                continue
            shown = field.hidden_widget().value_from_datadict(self.data, self.files, shown_as)
            if field.has_changed(self.get_initial_for_field(field, name), shown):
                return True
        return False


class MembershipInline(admin.TabularInline):
    model = Membership
    form = ShownRowForm
    extra = 1
    autocomplete_fields = ["user"]


class WriteOnlyUrlInput(forms.URLInput):
    """A URL that is a credential (a chat webhook's): never rendered back, not even beside a form's errors."""

    def format_value(self, value: Any) -> None:
        return None


# A team's notice addresses: separated as notices separate them (`notifications.ADDRESS_BREAK`).
MAX_NOTIFY_ADDRESSES = 50
MAX_NOTIFY_CHARS = 10_000


class TeamForm(SeenStateForm):
    clear_chat_webhook_url = forms.BooleanField(label="Remove the chat webhook", required=False)

    class Meta:
        model = Team
        fields = ["slug", "name", "notify_emails", "chat_webhook_url"]
        widgets = {"chat_webhook_url": WriteOnlyUrlInput(attrs={"autocomplete": "off"})}
        help_texts = {
            "slug": "Names the team in the audit log for good: it cannot be changed once the team is added, "
            "and is never given to another team, even after this one is deleted.",
            "chat_webhook_url": "A Slack-compatible incoming webhook. Its address is a credential: the "
            "stored one is never shown (only its host); leave empty to keep it.",
        }

    def clean_slug(self) -> str:
        slug = str(self.cleaned_data.get("slug") or "")
        if TeamSlug.objects.filter(slug=slug).exists() and not Team.objects.filter(slug=slug).exists():
            # A slug a team holds now is Team.slug's unique check's to report; this one a team held before.
            raise forms.ValidationError(
                "This slug was used by a team before: the audit log names that team by it, so it is not "
                "given to another team. Choose another slug."
            )
        return slug

    def clean_notify_emails(self) -> str:
        """The addresses as notices are sent to them (split as `notifications` splits them: commas, semicolons
        or white space), each a plain address, stored one a line. A typo or a display name ("Ops <ops@…>",
        split at its spaces) would otherwise be sent to as it is, unseen: mail to a local mailbox or to no
        one, while the team waits for notices that never come."""
        text = str(self.cleaned_data.get("notify_emails") or "")
        if len(text) > MAX_NOTIFY_CHARS:
            raise forms.ValidationError(f"At most {MAX_NOTIFY_CHARS} characters of addresses.")
        addresses = list(dict.fromkeys(part for part in ADDRESS_BREAK.split(text) if part))
        if len(addresses) > MAX_NOTIFY_ADDRESSES:
            raise forms.ValidationError(f"At most {MAX_NOTIFY_ADDRESSES} addresses.")
        wrong = []
        for address in addresses:
            try:
                validate_email(address)
            except forms.ValidationError:
                wrong.append(address)
        if wrong:
            shown = ", ".join(f"“{rules.shown(address[:80])}”" for address in wrong[:5])
            raise forms.ValidationError(
                f"Not an email address: {shown}. Give plain addresses (no names), separated by commas or "
                "one a line."
            )
        return "\n".join(addresses)

    def clean_chat_webhook_url(self) -> str:
        url = self.cleaned_data.get("chat_webhook_url") or ""
        if not url:
            return self.instance.chat_webhook_url if self.instance.pk else ""  # kept, as it was never shown
        return _guarded_url(url)

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean() or {}
        if cleaned.get("clear_chat_webhook_url"):
            cleaned["chat_webhook_url"] = ""
        return cleaned


@admin.register(Team)
class TeamAdmin(KeepsPendingAdmin):
    form = TeamForm
    list_display = ["slug", "name", "member_count"]
    search_fields = ["slug", "name"]
    fields = ["slug", "name", "notify_emails", "chat_webhook", "chat_webhook_url", "clear_chat_webhook_url"]
    readonly_fields = ["chat_webhook"]
    inlines = [MembershipInline]
    pending_links = ("team", "escalation_team")

    def get_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        """Read-only (a user who may only view teams), the webhook shows only as ``chat_webhook``: where it
        goes. The stored address is a credential, and a read-only field would show it as stored."""
        fields = super().get_fields(request, obj)
        if obj is not None and not self.has_change_permission(request, obj):
            return [name for name in fields if name not in {"chat_webhook_url", "clear_chat_webhook_url"}]
        return fields

    def get_readonly_fields(self, request: HttpRequest, obj: Team | None = None) -> Any:
        # The slug names the team in the audit log for good (``TeamSlug``): set once, as the team is added.
        return [*self.readonly_fields, "slug"] if obj is not None else self.readonly_fields

    @admin.display(description="chat webhook")
    def chat_webhook(self, obj: Team) -> str:
        return urlsafety.origin(obj.chat_webhook_url) or "—"  # where it goes, never the address itself

    def get_queryset(self, request: HttpRequest) -> QuerySet[Team]:
        return super().get_queryset(request).annotate(member_total=Count("memberships"))

    @admin.display(description="members", ordering="member_total")
    def member_count(self, obj: Team) -> int:
        return obj.member_total  # type: ignore[attr-defined]


# A policy's clocks: a deadline, and every extension added to it, must stay a date (Python's stop at the
# year 9999: an hour that far out is an error on every page and answer that reads it).
MAX_POLICY_SECONDS = 366 * 24 * 3600
MAX_EXTENSIONS = 100


class PolicyForm(SeenStateForm):
    class Meta:
        model = Policy
        fields = [
            "name",
            "risk",
            "approvals_required",
            "forbid_self_approval",
            "ttl",
            "on_expiry",
            "escalate_after",
            "escalation_team",
            "reauth_within",
            "extend_by",
            "max_extensions",
        ]

    def _seconds(self, name: str, *, zero: str = "") -> int | None:
        value = self.cleaned_data.get(name)
        if value is None:
            return None
        if value == 0 and zero:
            raise forms.ValidationError(zero)
        if value > MAX_POLICY_SECONDS:
            raise forms.ValidationError(
                f"At most {MAX_POLICY_SECONDS} seconds (366 days); leave empty for none."
            )
        return int(value)

    def clean_ttl(self) -> int | None:
        return self._seconds("ttl", zero="A round cannot expire at once: leave empty for the server's clock.")

    def clean_escalate_after(self) -> int | None:
        return self._seconds("escalate_after")

    def clean_reauth_within(self) -> int | None:
        return self._seconds(
            "reauth_within",
            zero="Zero seconds would ask no sign-in at all: leave empty for none, or say how recent.",
        )

    def clean_extend_by(self) -> int | None:
        return self._seconds("extend_by")

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean() or {}
        after, fallback = cleaned.get("escalate_after"), cleaned.get("escalation_team")
        if after is not None and fallback is None and "escalate_after" not in self.errors:
            self.add_error("escalation_team", "Escalating after a delay needs the team to escalate to.")
        if fallback is not None and after is None and "escalate_after" not in self.errors:
            self.add_error("escalate_after", "Say after how many seconds the fallback team is asked too.")
        return cleaned

    def clean_max_extensions(self) -> int:
        value = self.cleaned_data.get("max_extensions")
        if value is not None and value > MAX_EXTENSIONS:
            raise forms.ValidationError(f"At most {MAX_EXTENSIONS} extensions per round.")
        return int(value or 0)


@admin.register(Policy)
class PolicyAdmin(KeepsPendingAdmin):
    form = PolicyForm
    pending_links = ("policy",)
    list_display = [
        "name",
        "risk",
        "approvals_required",
        "forbid_self_approval",
        "ttl",
        "on_expiry",
        "escalate_after",
        "escalation_team",
        "reauth_within",
        "extend_by",
        "max_extensions",
        "revision",
    ]
    list_select_related = ["escalation_team"]
    list_filter = ["risk"]


class ConditionsField(StorableJSONField):
    """A rule's conditions as typed (`StorableJSONField`)."""

    too_long = "Conditions are at most {chars} characters of JSON."
    unstorable = "The conditions cannot be stored: {problem}."


class RoutingRuleForm(SeenStateForm):
    conditions = ConditionsField(
        required=False, help_text=RoutingRule._meta.get_field("conditions").help_text
    )

    class Meta:
        model = RoutingRule
        fields = [
            "position",
            "name",
            "enabled",
            "server",
            "tool_pattern",
            "mode",
            "destructive",
            "read_only",
            "open_world",
            "conditions",
            "gate",
            "team",
            "policy",
            "answered_by",
        ]

    def clean(self) -> dict[str, Any]:
        cleaned: dict[str, Any] = super().clean() or {}
        if cleaned.get("gate") and cleaned.get("mode"):
            self.add_error(
                "mode", "A gate stops calls, whatever mode a later question has: leave mode empty."
            )
        policy, team = cleaned.get("policy"), cleaned.get("team")
        if policy is not None and team is not None and policy.escalation_team_id == team.pk:
            self.add_error(
                "policy",
                f"The policy “{policy}” escalates to {team}, this rule's own team: escalation would ask no "
                "one new. Choose a policy whose fallback is another team.",
            )
        if cleaned.get("gate") and cleaned.get("answered_by") == RoutingRule.AnsweredBy.REQUESTER:
            self.add_error(
                "answered_by",
                "A gate is decided by the team's reviewers; the requester answers only questions.",
            )
        return cleaned

    def clean_conditions(self) -> list:
        conditions = self.cleaned_data.get("conditions") or []
        if not isinstance(conditions, list):
            raise forms.ValidationError("Conditions must be a list.")
        problems = [p for p in (rules.check_condition(c) for c in conditions) if p]
        if problems:
            raise forms.ValidationError(problems)
        return conditions


@admin.register(RoutingRule)
class RoutingRuleAdmin(AuditedAdmin):
    form = RoutingRuleForm
    list_display = [
        "position",
        "name",
        "enabled",
        "gate",
        "server",
        "tool_pattern",
        "mode",
        "team",
        "policy",
        "answered_by",
        "revision",
    ]
    list_select_related = ["server", "team", "policy"]
    list_display_links = ["name"]
    list_editable = ["position", "enabled"]
    list_filter = ["enabled", "gate", "team", "server"]


@admin.register(Notification)
class NotificationAdmin(ReadOnlyAdmin):
    list_display = ["created_at", "team", "kind", "event", "status", "attempts", "sent_at", "last_error"]
    list_filter = ["status", "kind", "event", "team"]


class RoundInline(admin.TabularInline):
    model = Round
    fields = (
        "number",
        "status",
        "outcome",
        "opened_at",
        "deadline",
        "answered_at",
        "closed_at",
        "send_attempts",
    )
    extra = 0
    can_delete = False


class GateInline(admin.TabularInline):
    """The call's gates: what was approved, by whom, and why an approval was voided."""

    model = Gate
    fields = ("status", "digest", "approved_digest", "decided_by", "decided_at", "reason", "used_at", "diff")
    readonly_fields = fields
    extra = 0
    can_delete = False

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


HIDDEN_ANSWER = "(hidden)"


def _answer_shown(content: Any, schema: Any) -> Any:
    """An answer as the dashboard shows it: the value of a field that looks like it asks for a credential
    (a password, a token) hidden."""
    if not isinstance(content, dict):
        return content
    secret = set(schema_forms.sensitive_fields(schema))
    return {key: HIDDEN_ANSWER if key in secret else value for key, value in content.items()}


def _responses_shown(responses: Any, call_id: Any) -> Any:
    """A relay's answers (``ToolCall.input_responses``, key -> ElicitResult) with `_answer_shown`'s hiding,
    each by the form its request asked."""
    if not isinstance(responses, dict):
        return responses
    schemas = dict(
        InputRequest.objects.filter(round__call_id=call_id)
        .order_by("round__number")
        .values_list("key", "requested_schema")
    )
    return {
        key: {**sent, "content": _answer_shown(sent["content"], schemas.get(key))}
        if isinstance(sent, dict) and "content" in sent
        else sent
        for key, sent in responses.items()
    }


def _json(value: Any) -> str:
    return "—" if value is None else json.dumps(value, ensure_ascii=False, indent=1, cls=DjangoJSONEncoder)


@admin.register(ToolCall)
class ToolCallAdmin(ReadOnlyAdmin):
    list_display = ["id", "kind", "server", "tool", "status", "agent", "created_at"]
    list_select_related = ["server", "agent"]
    list_filter = ["status", "kind", "server"]
    search_fields = ["id", "tool", "idempotency_key"]
    # The callback URL often carries the receiver's token in its query, and a relay's answers may hold a
    # password its person typed: both shown as the rest of the hub shows them.
    exclude = ["callback_url", "input_responses"]
    readonly_fields = ["callback_address", "relayed_answers"]
    inlines = [GateInline, RoundInline]

    @admin.display(description="callback URL")
    def callback_address(self, obj: ToolCall) -> str:
        return urlsafety.shown(obj.callback_url) if obj.callback_url else "—"

    @admin.display(description="input responses")
    def relayed_answers(self, obj: ToolCall) -> str:
        return _json(_responses_shown(obj.input_responses, obj.pk))


@admin.register(InputRequest)
class InputRequestAdmin(ReadOnlyAdmin):
    list_display = ["key", "mode", "status", "action", "team", "answered_by", "created_at"]
    list_select_related = ["team", "answered_by"]
    list_filter = ["status", "mode", "team"]
    # A URL-mode request's page often carries a sign-in link's token in its query or path: shown as the rest
    # of the hub shows a stored URL (the audit trail names only where it was). The params hold it verbatim.
    exclude = ["params", "content", "url"]
    readonly_fields = ["address", "answer"]

    @admin.display(description="URL")
    def address(self, obj: InputRequest) -> str:
        return urlsafety.shown(obj.url) if obj.url else "—"

    @admin.display(description="content")
    def answer(self, obj: InputRequest) -> str:
        return _json(_answer_shown(obj.content, obj.requested_schema))


class WebhookAttemptInline(admin.TabularInline):
    """Each try of a delivery and why it failed: what an operator needs to see before asking the agent's
    owner about their receiver."""

    model = WebhookAttempt
    fields = readonly_fields = ("number", "at", "status_code", "error", "duration_ms")
    extra = 0
    can_delete = False

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(WebhookDelivery)
class WebhookDeliveryAdmin(ReadOnlyAdmin):
    # A callback URL often carries the receiver's token in its query: shown masked, like a server's.
    list_display = ["event_type", "address", "status", "attempts", "created_at", "delivered_at"]
    list_filter = ["status", "event_type"]
    fields = readonly_fields = (
        "call",
        "event_type",
        "address",
        "status",
        "attempts",
        "created_at",
        "delivered_at",
        "body",
    )
    inlines = [WebhookAttemptInline]

    @admin.display(description="URL")
    def address(self, obj: WebhookDelivery) -> str:
        return urlsafety.shown(obj.url)

    @admin.display(description="payload")
    def body(self, obj: WebhookDelivery) -> str:
        """As sent, but for a relay's answers, hidden as on the call's page."""
        payload = obj.payload
        data = payload.get("data") if isinstance(payload, dict) else None
        if isinstance(data, dict) and "input_responses" in data:
            shown = _responses_shown(data["input_responses"], obj.call_id)
            payload = {**payload, "data": {**data, "input_responses": shown}}
        return _json(payload)


class RegisteredVerbFilter(admin.SimpleListFilter):
    """The verbs of the registry (``approvals.audit.verbs``), as the audit page offers them: Django's own
    filter would read the verbs the log holds, ``SELECT DISTINCT`` over the whole log on every page."""

    title = "verb"
    parameter_name = "verb"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [(verb, verb) for verb in VERBS]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        return queryset.filter(verb=self.value()) if self.value() else queryset


@admin.register(AuditEvent)
class AuditEventAdmin(ReadOnlyAdmin):
    list_display = ["id", "at", "actor_type", "actor_label", "verb", "server_slug", "call_id"]
    list_filter = [RegisteredVerbFilter, "actor_type"]
    show_full_result_count = False  # a count of the whole log on every page: the paginator's is enough
    search_fields = ["verb", "actor_label"]


admin.site.login_form = ThrottledAdminAuthenticationForm
admin.site.login = answer_throttled_with_429(admin.site.login)  # type: ignore[method-assign]
