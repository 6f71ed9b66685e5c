"""The audit table is append-only, enforced by PostgreSQL itself.

UPDATE, DELETE and TRUNCATE are refused for every role. The one way out is the retention command, which
sets the transaction-local flag ``elicit_hub.audit_maintenance`` and records what it removed; tests that
must empty the table between cases use the same flag. Anyone able to disable triggers can still alter rows:
the hash chain (``verify_audit``) is what detects that.
"""

from django.db import migrations

FORWARD = """
CREATE FUNCTION approvals_audit_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP IN ('DELETE', 'TRUNCATE')
       AND coalesce(current_setting('elicit_hub.audit_maintenance', true), '') = 'on' THEN
        RETURN OLD;  -- lets a DELETE through; ignored for the statement-level TRUNCATE
    END IF;
    RAISE EXCEPTION 'the audit log is append-only: % refused on %', TG_OP, TG_TABLE_NAME
        USING ERRCODE = 'insufficient_privilege';
END
$$;

CREATE TRIGGER approvals_audit_no_update BEFORE UPDATE ON approvals_auditevent
    FOR EACH ROW EXECUTE FUNCTION approvals_audit_append_only();
CREATE TRIGGER approvals_audit_no_delete BEFORE DELETE ON approvals_auditevent
    FOR EACH ROW EXECUTE FUNCTION approvals_audit_append_only();
CREATE TRIGGER approvals_audit_no_truncate BEFORE TRUNCATE ON approvals_auditevent
    FOR EACH STATEMENT EXECUTE FUNCTION approvals_audit_append_only();
"""

BACKWARD = """
DROP TRIGGER IF EXISTS approvals_audit_no_truncate ON approvals_auditevent;
DROP TRIGGER IF EXISTS approvals_audit_no_delete ON approvals_auditevent;
DROP TRIGGER IF EXISTS approvals_audit_no_update ON approvals_auditevent;
DROP FUNCTION IF EXISTS approvals_audit_append_only();
"""


class Migration(migrations.Migration):
    dependencies = [("approvals", "0001_initial")]

    operations = [migrations.RunSQL(FORWARD, BACKWARD)]
