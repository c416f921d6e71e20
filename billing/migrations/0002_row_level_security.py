from django.db import migrations

# Guarantees: a user's usage events are readable and insertable only inside
# that user's tenant transaction (the usage recorder writes through it) or on
# the operator path (admin, CSV export). Events are never updated or deleted
# by the tenant path.
RLS = """
ALTER TABLE usage_events ENABLE ROW LEVEL SECURITY;
ALTER TABLE usage_events FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON usage_events FOR ALL TO PUBLIC
    USING (user_id = recall_current_user_id())
    WITH CHECK (user_id = recall_current_user_id());
CREATE POLICY operator_access ON usage_events FOR ALL TO recall_operator
    USING (current_user = 'recall_operator')
    WITH CHECK (current_user = 'recall_operator');
GRANT SELECT, INSERT ON usage_events TO recall_app;
GRANT USAGE ON SEQUENCE usage_events_id_seq TO recall_app;
"""

RLS_REVERSE = """
REVOKE ALL ON SEQUENCE usage_events_id_seq FROM recall_app;
REVOKE ALL ON usage_events FROM recall_app;
DROP POLICY IF EXISTS operator_access ON usage_events;
DROP POLICY IF EXISTS tenant_isolation ON usage_events;
ALTER TABLE usage_events NO FORCE ROW LEVEL SECURITY;
ALTER TABLE usage_events DISABLE ROW LEVEL SECURITY;
"""


class Migration(migrations.Migration):
    dependencies = [
        ("billing", "0001_initial"),
        ("accounts", "0002_database_roles"),
    ]

    operations = [
        migrations.RunSQL(RLS, RLS_REVERSE),
    ]
