from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('approvals', '0007_audit_tail_guard'),
    ]

    operations = [
        migrations.AddField(
            model_name='toolcall',
            name='result_truncated',
            field=models.BooleanField(default=False),
        ),
        migrations.AddField(
            model_name='toolcall',
            name='result_size',
            field=models.PositiveBigIntegerField(blank=True, null=True),
        ),
    ]
