"""Two admins on the same team page: the member rows one of them did not touch are not put back as the page
showed them, over the other admin's change, and recorded as this admin's change."""

from __future__ import annotations

import shutil
import sys
from html.parser import HTMLParser
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from approvals.models import AuditEvent, InputRequest, McpServer, Membership, Team
from tests import factories

pytestmark = pytest.mark.django_db


class _Posted(HTMLParser):
    """What a browser posts for a change form as it was drawn: inputs, checked boxes, selected options and
    textareas (the first submit button only)."""

    def __init__(self, form_id: str) -> None:
        super().__init__()
        self.form_id = form_id
        self.inside = False
        self.data: dict[str, str] = {}
        self.select: str | None = None
        self.first_option: str | None = None
        self.textarea: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = {name: value or "" for name, value in attrs}
        if tag == "form" and found.get("id") == self.form_id:
            self.inside = True
        if not self.inside:
            return
        name = found.get("name", "")
        if tag == "input" and name:
            if found.get("type") in {"checkbox", "radio"} and "checked" not in found:
                return
            if found.get("type") == "submit" and name != "_save":
                return
            self.data[name] = found.get("value", "")
        elif tag == "select" and name:
            self.select, self.first_option = name, None
        elif tag == "option" and self.select:
            value = found.get("value", "")
            if self.first_option is None:
                self.first_option = value
            if "selected" in found:
                self.data[self.select] = value
        elif tag == "textarea" and name:
            self.textarea = name
            self.data[name] = ""

    def handle_data(self, data: str) -> None:
        if self.textarea:
            self.data[self.textarea] += data

    def handle_endtag(self, tag: str) -> None:
        if tag == "form":
            self.inside = False
        elif tag == "select" and self.select:
            if self.select not in self.data and self.first_option is not None:
                self.data[self.select] = self.first_option
            self.select = None
        elif tag == "textarea" and self.textarea:
            self.data[self.textarea] = self.data[self.textarea].removeprefix("\n")
            self.textarea = None


def posted_as_shown(page: str, form_id: str) -> dict[str, str]:
    parser = _Posted(form_id)
    parser.feed(page)
    return parser.data


def row_of(data: dict[str, str], membership: Membership) -> str:
    return next(
        name[: -len("-id")]
        for name, value in data.items()
        if name.startswith("memberships-") and name.endswith("-id") and value == str(membership.pk)
    )


def change_page(team: Team) -> str:
    return f"/admin/approvals/team/{team.pk}/change/"


def test_a_member_demoted_by_someone_else_meanwhile_stays_demoted(admin_client: Client) -> None:
    bob, carol = factories.user("bob"), factories.user("carol")
    team = factories.team("ops", (bob, "reviewer"), (carol, "reviewer"))
    shown = posted_as_shown(admin_client.get(change_page(team)).text, "team_form")
    # Meanwhile another admin takes bob's power to approve away.
    Membership.objects.filter(team=team, user=bob).update(role="viewer")
    events = AuditEvent.objects.count()

    page = admin_client.post(change_page(team), shown | {"name": "Ops on call"})  # this admin renames it

    assert page.status_code == 302, page.text
    team.refresh_from_db()
    assert team.name == "Ops on call"
    assert Membership.objects.get(team=team, user=bob).role == "viewer"
    verbs = [event.verb for event in AuditEvent.objects.order_by("pk")[events:]]
    assert verbs == ["team.changed"]


def test_a_member_this_admin_changes_is_saved(admin_client: Client) -> None:
    bob, carol = factories.user("bob"), factories.user("carol")
    team = factories.team("ops", (bob, "reviewer"), (carol, "reviewer"))
    shown = posted_as_shown(admin_client.get(change_page(team)).text, "team_form")
    Membership.objects.filter(team=team, user=bob).update(role="viewer")  # another admin, another row
    carol_row = row_of(shown, Membership.objects.get(user=carol))

    page = admin_client.post(change_page(team), shown | {f"{carol_row}-role": "admin"})

    assert page.status_code == 302, page.text
    assert Membership.objects.get(team=team, user=carol).role == "admin"
    assert Membership.objects.get(team=team, user=bob).role == "viewer"
    changed = AuditEvent.objects.filter(verb="membership.changed").get()
    assert "carol" in changed.data["message"]


def test_a_member_row_both_admins_changed_is_refused_and_says_so(admin_client: Client) -> None:
    bob = factories.user("bob")
    team = factories.team("ops", (bob, "reviewer"))
    shown = posted_as_shown(admin_client.get(change_page(team)).text, "team_form")
    Membership.objects.filter(team=team, user=bob).update(role="viewer")
    bob_row = row_of(shown, Membership.objects.get(user=bob))

    page = admin_client.post(change_page(team), shown | {f"{bob_row}-role": "admin"})

    assert page.status_code == 200
    assert "changed by someone else" in page.text
    assert Membership.objects.get(team=team, user=bob).role == "viewer"
    assert not AuditEvent.objects.filter(verb="membership.changed").exists()


def test_a_new_member_is_added_with_the_page_as_shown(admin_client: Client) -> None:
    bob, dave = factories.user("bob"), factories.user("dave")
    team = factories.team("ops", (bob, "reviewer"))
    shown = posted_as_shown(admin_client.get(change_page(team)).text, "team_form")
    assert shown["memberships-TOTAL_FORMS"] == "2"

    page = admin_client.post(
        change_page(team), shown | {"memberships-1-user": str(dave.pk), "memberships-1-role": "viewer"}
    )

    assert page.status_code == 302, page.text
    assert Membership.objects.get(team=team, user=dave).role == "viewer"
    assert Membership.objects.get(team=team, user=bob).role == "reviewer"


# Someone who may change users (to add reviewers, to deactivate one who left) and groups: no superuser.
def _user_manager(client: Client) -> tuple[Any, Client]:
    from django.contrib.auth.models import Permission

    manager = factories.user("helpdesk", is_staff=True)
    codenames = ["view_user", "change_user", "delete_user", "view_group", "change_group"]
    manager.user_permissions.set(Permission.objects.filter(codename__in=codenames))
    client.force_login(manager)
    return manager, client


def test_someone_who_may_change_users_cannot_make_themselves_a_superuser(client: Client) -> None:
    from django.contrib.auth.models import Group, Permission

    manager, client = _user_manager(client)
    powerful = Group.objects.create(name="everything")
    powerful.permissions.set(Permission.objects.all())
    page = f"/admin/auth/user/{manager.pk}/change/"
    shown = posted_as_shown(client.get(page).text, "user_form")
    assert "is_superuser" not in shown

    answer = client.post(
        page,
        shown
        | {
            "first_name": "Help",
            "is_superuser": "on",
            "groups": str(powerful.pk),
            "user_permissions": str(Permission.objects.get(codename="delete_auditevent").pk),
        },
    )

    assert answer.status_code == 302, answer.text
    manager.refresh_from_db()
    assert manager.first_name == "Help"  # the rest of the form is saved
    assert not manager.is_superuser
    assert not manager.groups.exists()
    assert not manager.has_perm("approvals.delete_auditevent")


def test_someone_who_may_change_users_cannot_take_over_a_superuser(client: Client) -> None:
    root = get_user_model().objects.create_superuser("root", password="pw-root-long-enough")
    _, client = _user_manager(client)
    password = {"password1": "Taken-0ver-Now!", "password2": "Taken-0ver-Now!", "usable_password": "true"}

    assert client.post(f"/admin/auth/user/{root.pk}/password/", password).status_code == 403
    assert client.post(f"/admin/auth/user/{root.pk}/change/", {"username": "rooted"}).status_code == 403
    assert client.post(f"/admin/auth/user/{root.pk}/delete/", {"post": "yes"}).status_code == 403
    deleting = {"action": "delete_selected", "_selected_action": [str(root.pk)], "post": "yes"}
    client.post("/admin/auth/user/", deleting)

    root.refresh_from_db()
    assert root.username == "root"
    assert root.check_password("pw-root-long-enough")


def test_someone_who_may_change_users_still_deactivates_a_reviewer(client: Client) -> None:
    bob = factories.user("bob")
    _, client = _user_manager(client)
    page = f"/admin/auth/user/{bob.pk}/change/"
    shown = posted_as_shown(client.get(page).text, "user_form")
    shown.pop("is_active")

    assert client.post(page, shown).status_code == 302
    bob.refresh_from_db()
    assert not bob.is_active


def test_someone_who_may_change_groups_cannot_widen_what_one_permits(client: Client) -> None:
    from django.contrib.auth.models import Group, Permission

    _, client = _user_manager(client)
    group = Group.objects.create(name="reviewers")
    page = f"/admin/auth/group/{group.pk}/change/"
    shown = posted_as_shown(client.get(page).text, "group_form")

    every = [str(pk) for pk in Permission.objects.values_list("pk", flat=True)]
    answer = client.post(page, shown | {"name": "Reviewers", "permissions": every})

    assert answer.status_code == 302, answer.text
    group.refresh_from_db()
    assert group.name == "Reviewers"
    assert not group.permissions.exists()


def test_a_superuser_still_grants_privileges(admin_client: Client) -> None:
    bob = factories.user("bob")
    page = f"/admin/auth/user/{bob.pk}/change/"
    shown = posted_as_shown(admin_client.get(page).text, "user_form")

    assert admin_client.post(page, shown | {"is_superuser": "on"}).status_code == 302
    bob.refresh_from_db()
    assert bob.is_superuser


def test_a_url_requests_sign_in_link_is_shown_without_its_token(admin_client: Client) -> None:
    call = factories.call(factories.server())
    rnd = factories.open_round(call)
    link = "https://auth.example.com/device/Zq81TrWx0pLmN4vB7cY2?code=OTP-774411&state=s3cr3t-state"
    ir = rnd.input_requests.get()
    InputRequest.objects.filter(pk=ir.pk).update(mode="url", url=link, requested_schema=None)

    page = admin_client.get(f"/admin/approvals/inputrequest/{ir.pk}/change/")

    assert page.status_code == 200
    assert "https://auth.example.com/" in page.text
    for secret in ("OTP-774411", "s3cr3t-state", "Zq81TrWx0pLmN4vB7cY2"):
        assert secret not in page.text


# Someone who may add and change servers, but is no superuser.
def _server_manager(client: Client) -> Client:
    from django.contrib.auth.models import Permission

    manager = factories.user("platform", is_staff=True)
    codenames = ["view_mcpserver", "add_mcpserver", "change_mcpserver"]
    manager.user_permissions.set(Permission.objects.filter(codename__in=codenames))
    client.force_login(manager)
    return client


def stdio_form(**extra: str) -> dict[str, str]:
    return {
        "slug": "local-tools",
        "name": "Local tools",
        "transport": "stdio",
        "url": "",
        "command": sys.executable,
        "arguments": "-m\nmy_server",
        "new_env": "",
        "enabled": "on",
        "on_expiry": "",
    } | extra


def stdio_server() -> McpServer:
    return McpServer.objects.create(
        slug="local-tools",
        name="Local tools",
        transport="stdio",
        command=sys.executable,
        args=["-m", "my_server"],
        env={"API_TOKEN": "kept-secret"},
    )


def test_only_a_superuser_registers_a_server_the_hub_runs(client: Client) -> None:
    client = _server_manager(client)

    page = client.post("/admin/approvals/mcpserver/add/", stdio_form(arguments="-c\nimport os"))

    assert page.status_code == 200
    assert "Only a superuser registers a server the hub runs" in page.text
    assert not McpServer.objects.exists()


@pytest.mark.parametrize(
    "change",
    [
        {"arguments": "-c\nimport os; print(os.environ)"},  # another program, with the stored environment
        {"command": shutil.which("env") or "/usr/bin/env", "arguments": "", "clear_env": "on"},
        {"new_env": "LD_PRELOAD=/tmp/mine.so"},  # the same program, made to load one of theirs
    ],
)
def test_only_a_superuser_changes_what_the_hub_runs(client: Client, change: dict[str, str]) -> None:
    server = stdio_server()
    client = _server_manager(client)

    page = client.post(f"/admin/approvals/mcpserver/{server.pk}/change/", stdio_form(**change))

    assert page.status_code == 200
    assert "Only a superuser" in page.text
    server.refresh_from_db()
    assert (server.command, server.args) == (sys.executable, ["-m", "my_server"])
    assert server.env == {"API_TOKEN": "kept-secret"}


def test_a_server_with_a_url_cannot_become_one_the_hub_runs_but_by_a_superuser(client: Client) -> None:
    server = factories.server("local-tools")
    client = _server_manager(client)

    page = client.post(f"/admin/approvals/mcpserver/{server.pk}/change/", stdio_form())

    assert page.status_code == 200
    server.refresh_from_db()
    assert (server.transport, server.command) == ("http", "")


def test_someone_who_may_change_servers_still_renames_one_the_hub_runs_or_removes_its_environment(
    client: Client,
) -> None:
    server = stdio_server()
    client = _server_manager(client)
    page = f"/admin/approvals/mcpserver/{server.pk}/change/"

    assert client.post(page, stdio_form(name="Local tools (renamed)")).status_code == 302
    server.refresh_from_db()
    assert (server.name, server.env) == ("Local tools (renamed)", {"API_TOKEN": "kept-secret"})
    assert client.post(page, stdio_form(clear_env="on")).status_code == 302
    server.refresh_from_db()
    assert server.env == {}


def test_a_superuser_still_registers_a_server_the_hub_runs(admin_client: Client) -> None:
    page = admin_client.post("/admin/approvals/mcpserver/add/", stdio_form(new_env="MODE=fast"))

    assert page.status_code == 302, page.text
    assert McpServer.objects.get(slug="local-tools").env == {"MODE": "fast"}


def test_someone_who_may_add_users_still_adds_one(client: Client) -> None:
    from django.contrib.auth.models import Permission

    manager, client = _user_manager(client)
    manager.user_permissions.add(Permission.objects.get(codename="add_user"))
    password = "Reviewer-pw-2026!"
    form = {"username": "erin", "usable_password": "true", "password1": password, "password2": password}

    page = client.post("/admin/auth/user/add/", form)

    assert page.status_code == 302, page.text
    erin = get_user_model().objects.get(username="erin")
    assert erin.check_password(password) and not erin.is_superuser


def test_someone_who_may_change_users_cannot_take_over_a_stronger_account(client: Client) -> None:
    from django.contrib.auth.models import Permission

    platform = factories.user("platform", is_staff=True, is_active=False)  # may be made active again
    platform.user_permissions.set(Permission.objects.filter(codename="change_mcpserver"))
    _, client = _user_manager(client)
    password = {"password1": "Taken-0ver-Now!", "password2": "Taken-0ver-Now!", "usable_password": "true"}

    assert client.post(f"/admin/auth/user/{platform.pk}/password/", password).status_code == 403
    assert client.post(f"/admin/auth/user/{platform.pk}/change/", {"is_active": "on"}).status_code == 403

    platform.refresh_from_db()
    assert platform.check_password("pw-platform") and not platform.is_active
