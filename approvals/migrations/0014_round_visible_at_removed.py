"""`Round.visible_at` is no longer written. The column stays in the database for this release, so a process of
the previous release (which writes it after each new round's commit) keeps working while a rolling deploy
replaces it; a later release drops it."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("approvals", "0013_call_grant"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[migrations.RemoveField(model_name="round", name="visible_at")],
            database_operations=[],
        ),
    ]
