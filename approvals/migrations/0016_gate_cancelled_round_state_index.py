"""A gate whose call the agent cancelled is ``cancelled`` (a choice only: no change to the column), and a
partial index finds the rounds still holding a server's requestState, which beat clears once their call is
final (`rounds.rounds_forget_state`). The index is built concurrently: the rounds table stays writable while
it is built, however many rounds it holds."""

from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("approvals", "0015_audit_reserve"),
    ]

    operations = [
        migrations.AlterField(
            model_name="gate",
            name="status",
            field=models.CharField(
                choices=[
                    ("open", "Waiting for a decision"),
                    ("approved", "Approved, not sent yet"),
                    ("used", "Approved and sent"),
                    ("declined", "Declined"),
                    ("voided", "Voided: the call changed after approval"),
                    ("expired", "No one decided in time"),
                    ("cancelled", "Cancelled by the agent: not sent"),
                ],
                default="open",
                max_length=10,
            ),
        ),
        AddIndexConcurrently(
            model_name="round",
            index=models.Index(
                condition=models.Q(("request_state__isnull", False)),
                fields=["call"],
                name="round_request_state_idx",
            ),
        ),
    ]
