from django.db import migrations

# Guarantees: two NOLOGIN roles exist and the migrating (owner) role may switch
# to them. recall_app is the tenant path: NOBYPASSRLS, and it receives only
# the per-table grants that later migrations give it. recall_operator is the
# explicit privileged path; the operator_access policies admit it, and only
# while it is the active role. recall_current_user_id() reads the
# per-transaction tenant; unset, it is NULL, and NULL matches no row.
ROLES = """
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'recall_app') THEN
        CREATE ROLE recall_app NOLOGIN NOBYPASSRLS NOINHERIT;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'recall_operator') THEN
        CREATE ROLE recall_operator NOLOGIN NOBYPASSRLS NOINHERIT;
    END IF;
END
$$;
GRANT recall_app TO CURRENT_USER;
GRANT recall_operator TO CURRENT_USER;
GRANT USAGE ON SCHEMA public TO recall_app, recall_operator;
CREATE OR REPLACE FUNCTION recall_current_user_id() RETURNS uuid
    LANGUAGE sql STABLE
    AS $$ SELECT NULLIF(current_setting('app.current_user_id', true), '')::uuid $$;
"""

# Roles are cluster-wide and another database may still use them, so the
# reverse revokes this database's grants and drops the roles only if free.
ROLES_REVERSE = """
DROP FUNCTION IF EXISTS recall_current_user_id();
REVOKE USAGE ON SCHEMA public FROM recall_app, recall_operator;
DO $$
BEGIN
    DROP ROLE IF EXISTS recall_app;
    DROP ROLE IF EXISTS recall_operator;
EXCEPTION WHEN dependent_objects_still_exist THEN
    RAISE NOTICE 'recall roles are still used by another database; kept';
END
$$;
"""

# Guarantees: the operator path can reach every table, including ones that
# later migrations create (admin, sessions, auth). Tenant tables still filter
# it through operator_access, which checks that it is the active role.
OPERATOR_GRANTS = """
GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO recall_operator;
GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA public TO recall_operator;
ALTER DEFAULT PRIVILEGES IN SCHEMA public
    GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO recall_operator;
ALTER DEFAULT PRIVILEGES IN SCHEMA public
    GRANT USAGE, SELECT ON SEQUENCES TO recall_operator;
"""

OPERATOR_GRANTS_REVERSE = """
ALTER DEFAULT PRIVILEGES IN SCHEMA public
    REVOKE USAGE, SELECT ON SEQUENCES FROM recall_operator;
ALTER DEFAULT PRIVILEGES IN SCHEMA public
    REVOKE SELECT, INSERT, UPDATE, DELETE ON TABLES FROM recall_operator;
REVOKE ALL ON ALL SEQUENCES IN SCHEMA public FROM recall_operator;
REVOKE ALL ON ALL TABLES IN SCHEMA public FROM recall_operator;
"""

# Guarantees: api_keys rows are invisible and unwritable to everyone, the
# owner included (FORCE), except a tenant for its own keys and the operator.
# Tenants may create keys and rename or revoke them, never re-tier or delete.
API_KEYS_RLS = """
ALTER TABLE api_keys ENABLE ROW LEVEL SECURITY;
ALTER TABLE api_keys FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON api_keys FOR ALL TO PUBLIC
    USING (user_id = recall_current_user_id())
    WITH CHECK (user_id = recall_current_user_id());
CREATE POLICY operator_access ON api_keys FOR ALL TO recall_operator
    USING (current_user = 'recall_operator')
    WITH CHECK (current_user = 'recall_operator');
GRANT SELECT, INSERT ON api_keys TO recall_app;
GRANT UPDATE (name, revoked_at) ON api_keys TO recall_app;
"""

API_KEYS_RLS_REVERSE = """
REVOKE ALL ON api_keys FROM recall_app;
DROP POLICY IF EXISTS operator_access ON api_keys;
DROP POLICY IF EXISTS tenant_isolation ON api_keys;
ALTER TABLE api_keys NO FORCE ROW LEVEL SECURITY;
ALTER TABLE api_keys DISABLE ROW LEVEL SECURITY;
"""


class Migration(migrations.Migration):
    dependencies = [
        ("accounts", "0001_initial"),
        ("auth", "0012_alter_user_first_name_max_length"),
        ("contenttypes", "0002_remove_content_type_name"),
    ]

    operations = [
        migrations.RunSQL(ROLES, ROLES_REVERSE),
        migrations.RunSQL(OPERATOR_GRANTS, OPERATOR_GRANTS_REVERSE),
        migrations.RunSQL(API_KEYS_RLS, API_KEYS_RLS_REVERSE),
    ]
