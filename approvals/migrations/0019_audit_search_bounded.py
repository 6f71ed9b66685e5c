"""The audit search vector is bounded: a large event's data is searched by its first 64 KiB of text.

PostgreSQL refuses a ``tsvector`` over 1 MB, and ``jsonb_to_tsvector`` over an event's data (every string
value in it, each distinct word with its positions) passed that for a call whose arguments are some 700 KB of
distinct words, under the hub's 1 MB body limit: the trigger raised, the append failed, and the call could
never be submitted. An event whose data takes more than 64 KiB now gets the vector of its first 64 KiB as
JSON text (keys included: the cut cannot keep JSON whole); every other event keeps the vector it had, and
the event's own columns (verb, actor, server, team, tool, action, outcome) are searched in full either way.
The hash chain does not cover the vector, so no hash changes; existing rows keep theirs.
"""

from __future__ import annotations

from django.db import migrations

WORDS = """setweight(to_tsvector('simple', concat_ws(' ', NEW.verb, NEW.actor_label, NEW.server_slug,
        NEW.team_slug, NEW.tool, NEW.action, NEW.outcome)), 'A')"""

FORWARD = f"""
CREATE OR REPLACE FUNCTION approvals_audit_search_vector() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF pg_column_size(NEW.data) <= 65536 THEN
        NEW.search := {WORDS}
            || setweight(jsonb_to_tsvector('simple', NEW.data, '["string"]'), 'B');
    ELSE
        NEW.search := {WORDS}
            || setweight(to_tsvector('simple', left(NEW.data::text, 65536)), 'B');
    END IF;
    RETURN NEW;
END
$$;
"""

BACKWARD = f"""
CREATE OR REPLACE FUNCTION approvals_audit_search_vector() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.search := {WORDS}
        || setweight(jsonb_to_tsvector('simple', NEW.data, '["string"]'), 'B');
    RETURN NEW;
END
$$;
"""


class Migration(migrations.Migration):
    dependencies = [("approvals", "0018_team_slugs")]

    operations = [migrations.RunSQL(FORWARD, BACKWARD)]
