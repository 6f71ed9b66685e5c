"""The audit table's tail cannot be cut by any session, and the hub remembers the head it last verified.

Until now DELETE and TRUNCATE went through when the transaction-local setting
``elicit_hub.audit_maintenance`` was ``on``: any session could set it, so any session could cut the chain's
tail, and a cut tail leaves a chain that still verifies. A flag cannot be made private to the retention code
in PostgreSQL: a secret value would sit where the hub's own role can read it, and a SECURITY DEFINER
function owned by the hub's role gives that role nothing it does not already have (it owns the table: it can
``ALTER TABLE ... DISABLE TRIGGER`` or replace any function the trigger calls). So there is no flag any more.
The trigger checks what a DELETE did instead of who asked:

* UPDATE and TRUNCATE are refused, always.
* A DELETE statement stands only if, after it, the newest event is an ``audit.pruned`` event that records
  the removed range (``data.last_id`` at or above every removed id) and no event at or below that id is
  left. Retention records its ``audit.pruned`` event first, then deletes the prefix it names, in one
  transaction under the chain lock (``approvals.audit.prune``).

The guarantee, for every session that cannot alter the table (any role but its owner and superusers):
DML can only remove a prefix of the chain, and only one that the chain itself, in its newest event, says was
removed. The newest event can never be removed, so the tail cannot be cut, and no removal is silent. What
the table's owner or a superuser does with DDL (disable the triggers, drop the table) is outside what a
trigger can stop; ``approvals_audithead`` (the head the chain check last verified, which only moves forward)
and a head exported off the machine (``export_audit_head``) are what catch that.

Tests that must empty these tables between cases disable the TRUNCATE triggers explicitly, inside the same
transaction as the flush (tests/conftest.py): a table owner's power, named where it is used.
"""

from django.db import migrations, models

FORWARD = """
CREATE OR REPLACE FUNCTION approvals_audit_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'the audit log is append-only: % refused on %', TG_OP, TG_TABLE_NAME
        USING ERRCODE = 'insufficient_privilege';
END
$$;

CREATE FUNCTION approvals_audit_prefix_only() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    removed_through bigint;
    newest record;
    recorded_through bigint;
BEGIN
    SELECT max(id) INTO removed_through FROM removed;
    IF removed_through IS NULL THEN
        RETURN NULL;
    END IF;
    SELECT id, verb, data INTO newest FROM approvals_auditevent ORDER BY id DESC LIMIT 1;
    IF newest.verb IS DISTINCT FROM 'audit.pruned' OR jsonb_typeof(newest.data -> 'last_id') <> 'number' THEN
        RAISE EXCEPTION 'the audit log is append-only: DELETE refused on % (only a recorded prune may remove '
            'events, and never the newest)', TG_TABLE_NAME USING ERRCODE = 'insufficient_privilege';
    END IF;
    recorded_through := (newest.data ->> 'last_id')::bigint;
    IF removed_through > recorded_through
       OR EXISTS (SELECT 1 FROM approvals_auditevent WHERE id <= recorded_through) THEN
        RAISE EXCEPTION 'the audit log is append-only: DELETE refused on % (it must remove exactly the events '
            'up to #% that the newest audit.pruned event records)', TG_TABLE_NAME, recorded_through
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    RETURN NULL;
END
$$;

DROP TRIGGER approvals_audit_no_delete ON approvals_auditevent;
CREATE TRIGGER approvals_audit_prefix_delete AFTER DELETE ON approvals_auditevent
    REFERENCING OLD TABLE AS removed
    FOR EACH STATEMENT EXECUTE FUNCTION approvals_audit_prefix_only();

CREATE FUNCTION approvals_audit_head_forward() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'UPDATE' AND NEW.head_id >= OLD.head_id THEN
        RETURN NEW;
    END IF;
    RAISE EXCEPTION 'the recorded audit head only moves forward: % refused on %', TG_OP, TG_TABLE_NAME
        USING ERRCODE = 'insufficient_privilege';
END
$$;

CREATE TRIGGER approvals_audithead_forward BEFORE UPDATE OR DELETE ON approvals_audithead
    FOR EACH ROW EXECUTE FUNCTION approvals_audit_head_forward();
CREATE TRIGGER approvals_audithead_no_truncate BEFORE TRUNCATE ON approvals_audithead
    FOR EACH STATEMENT EXECUTE FUNCTION approvals_audit_head_forward();
"""

BACKWARD = """
DROP TRIGGER IF EXISTS approvals_audithead_no_truncate ON approvals_audithead;
DROP TRIGGER IF EXISTS approvals_audithead_forward ON approvals_audithead;
DROP FUNCTION IF EXISTS approvals_audit_head_forward();
DROP TRIGGER IF EXISTS approvals_audit_prefix_delete ON approvals_auditevent;
DROP FUNCTION IF EXISTS approvals_audit_prefix_only();
CREATE OR REPLACE FUNCTION approvals_audit_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP IN ('DELETE', 'TRUNCATE')
       AND coalesce(current_setting('elicit_hub.audit_maintenance', true), '') = 'on' THEN
        RETURN OLD;
    END IF;
    RAISE EXCEPTION 'the audit log is append-only: % refused on %', TG_OP, TG_TABLE_NAME
        USING ERRCODE = 'insufficient_privilege';
END
$$;
CREATE TRIGGER approvals_audit_no_delete BEFORE DELETE ON approvals_auditevent
    FOR EACH ROW EXECUTE FUNCTION approvals_audit_append_only();
"""


class Migration(migrations.Migration):
    dependencies = [("approvals", "0006_agent_acts_for")]

    operations = [
        migrations.CreateModel(
            name="AuditHead",
            fields=[
                ("id", models.PositiveSmallIntegerField(default=1, primary_key=True, serialize=False)),
                ("head_id", models.BigIntegerField()),
                ("head_hash", models.CharField(max_length=64)),
                ("recorded_at", models.DateTimeField()),
            ],
            options={
                "constraints": [models.CheckConstraint(condition=models.Q(("id", 1)), name="audithead_single_row")]
            },
        ),
        migrations.RunSQL(FORWARD, BACKWARD),
    ]
