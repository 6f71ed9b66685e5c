"""A policy may let a reviewer extend a round's deadline (``extend_by`` seconds, at most ``max_extensions``
times); a round counts its ``extensions`` (`services.extensions.round_extend`). Columns with constant
defaults: PostgreSQL adds them without rewriting the tables."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("approvals", "0016_gate_cancelled_round_state_index"),
    ]

    operations = [
        migrations.AddField(
            model_name="policy",
            name="extend_by",
            field=models.PositiveIntegerField(
                blank=True,
                help_text="Seconds a reviewer may add to a round's deadline. Empty: no extension.",
                null=True,
            ),
        ),
        migrations.AddField(
            model_name="policy",
            name="max_extensions",
            field=models.PositiveSmallIntegerField(
                default=1, help_text="How many times a round's deadline may be extended."
            ),
        ),
        migrations.AddField(
            model_name="round",
            name="extensions",
            field=models.PositiveSmallIntegerField(default=0),
        ),
    ]
