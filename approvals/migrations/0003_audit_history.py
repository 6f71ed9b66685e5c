"""Audit history: filterable columns, a full-text search vector, and the indexes the audit page relies on.

``tool``, ``action`` and ``outcome`` are written by ``audit.record`` and covered by the hash only when not
empty, so the rows before this migration keep their hashes (and keep these columns empty: filling them would
change what their hashes cover). ``search`` is derived, outside the hash: a BEFORE INSERT trigger fills it
from the event's words and every string value in ``data``, with the ``simple`` configuration (no stemming,
so German, Persian and identifiers match as typed). The existing rows get their vector once, here, with the
append-only trigger paused for the length of this migration's transaction.
"""

import django.contrib.postgres.indexes
import django.contrib.postgres.search
from django.db import migrations, models

SEARCH_VECTOR = """
    setweight(to_tsvector('simple', concat_ws(' ', {row}.verb, {row}.actor_label, {row}.server_slug,
        {row}.team_slug, {row}.tool, {row}.action, {row}.outcome)), 'A')
    || setweight(jsonb_to_tsvector('simple', {row}.data, '["string"]'), 'B')
"""

FORWARD = f"""
CREATE FUNCTION approvals_audit_search_vector() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.search := {SEARCH_VECTOR.format(row="NEW")};
    RETURN NEW;
END
$$;

CREATE TRIGGER approvals_audit_search BEFORE INSERT ON approvals_auditevent
    FOR EACH ROW EXECUTE FUNCTION approvals_audit_search_vector();

ALTER TABLE approvals_auditevent DISABLE TRIGGER approvals_audit_no_update;
UPDATE approvals_auditevent AS e SET search = {SEARCH_VECTOR.format(row="e")};
ALTER TABLE approvals_auditevent ENABLE TRIGGER approvals_audit_no_update;
"""

BACKWARD = """
DROP TRIGGER IF EXISTS approvals_audit_search ON approvals_auditevent;
DROP FUNCTION IF EXISTS approvals_audit_search_vector();
"""


class Migration(migrations.Migration):
    dependencies = [("approvals", "0002_audit_append_only")]

    operations = [
        migrations.AddField(
            model_name="auditevent",
            name="action",
            field=models.CharField(blank=True, default="", max_length=8),
        ),
        migrations.AddField(
            model_name="auditevent",
            name="outcome",
            field=models.CharField(blank=True, default="", max_length=16),
        ),
        migrations.AddField(
            model_name="auditevent",
            name="search",
            field=django.contrib.postgres.search.SearchVectorField(editable=False, null=True),
        ),
        migrations.AddField(
            model_name="auditevent",
            name="tool",
            field=models.CharField(blank=True, default="", max_length=200),
        ),
        migrations.RunSQL(FORWARD, BACKWARD),
        migrations.AddIndex(
            model_name="auditevent",
            index=models.Index(fields=["input_request_id", "id"], name="audit_input_request_idx"),
        ),
        migrations.AddIndex(
            model_name="auditevent",
            index=models.Index(fields=["team_slug", "id"], name="audit_team_idx"),
        ),
        migrations.AddIndex(
            model_name="auditevent",
            index=models.Index(fields=["server_slug", "id"], name="audit_server_idx"),
        ),
        migrations.AddIndex(
            model_name="auditevent",
            index=models.Index(fields=["tool", "id"], name="audit_tool_idx"),
        ),
        migrations.AddIndex(
            model_name="auditevent",
            index=models.Index(fields=["actor_label", "id"], name="audit_actor_idx"),
        ),
        migrations.AddIndex(
            model_name="auditevent",
            index=models.Index(
                condition=models.Q(("action", ""), _negated=True), fields=["action", "id"], name="audit_action_idx"
            ),
        ),
        migrations.AddIndex(
            model_name="auditevent",
            index=models.Index(
                condition=models.Q(("outcome", ""), _negated=True),
                fields=["outcome", "id"],
                name="audit_outcome_idx",
            ),
        ),
        migrations.AddIndex(
            model_name="auditevent",
            index=django.contrib.postgres.indexes.GinIndex(fields=["search"], name="audit_search_idx"),
        ),
    ]
