from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.core.management.base import CommandError

from approvals.audit.core import Actor
from approvals.management.commands._cli import HubCommand
from approvals.models import PersonalToken
from approvals.services import tokens


class Command(HubCommand):
    help = "Create a personal API token for a user (for reviewers' bots and scripts). Shown once."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("username")
        parser.add_argument("--name", default="")

    def handle(self, *args: Any, username: str, name: str, **options: Any) -> None:
        try:
            PersonalToken._meta.get_field("name").clean(name, None)
        except ValidationError as exc:
            raise CommandError(f"--name: {' '.join(exc.messages)}") from None
        user = get_user_model().objects.filter(username=username).first()
        if user is None:
            raise CommandError(f"no user named {username!r}")
        if not user.is_active:
            # The API refuses an inactive user's tokens: one printed now would never work.
            raise CommandError(f"{username!r} is inactive; make the user active first (the admin's Users)")
        _, token = tokens.personal_token_create(
            user=user, name=name, actor=Actor.system("manage.py create_token")
        )
        self.stdout.write(f"token: {token}")
        self.stdout.write("Store it now: it is not shown again.")
