"""`approvals_audit_reserve(n, lock)`: an append's chain lock, ids and head hash in one round trip.

An append used to take the lock in one statement and read the head in the next: a statement that both waits
for the lock and reads would read with a snapshot taken before the lock was granted, and could miss the
append it waited for. A VOLATILE PL/pgSQL function takes a fresh snapshot for each statement it runs, so its
read after the lock sees every append committed before the lock was granted, and the caller saves the round
trip. It takes the same advisory lock as before, so a process of the previous release appending meanwhile (a
rolling deploy) is serialised with it as before.
"""

from django.db import migrations

FORWARD = """
CREATE FUNCTION approvals_audit_reserve(n integer, lock_key bigint)
RETURNS TABLE (last_id bigint, head_hash varchar) LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(lock_key);
    -- A statement of its own after the lock: its snapshot sees every append committed before the grant.
    RETURN QUERY SELECT
        setval(pg_get_serial_sequence('approvals_auditevent', 'id'),
               nextval(pg_get_serial_sequence('approvals_auditevent', 'id')) + n - 1),
        (SELECT e.hash FROM approvals_auditevent e ORDER BY e.id DESC LIMIT 1);
END
$$;
"""

BACKWARD = "DROP FUNCTION IF EXISTS approvals_audit_reserve(integer, bigint);"


class Migration(migrations.Migration):
    dependencies = [
        ("approvals", "0014_round_visible_at_removed"),
    ]

    operations = [migrations.RunSQL(FORWARD, BACKWARD)]
