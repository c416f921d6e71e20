from django.db import migrations

# Guarantees: updated_at moves whenever what a user can see changes (content,
# metadata, namespace), whoever writes the row, and not when only the vector
# is recomputed by `manage.py reembed`.
TOUCH_TRIGGER = """
CREATE FUNCTION memories_touch_updated_at() RETURNS trigger
    LANGUAGE plpgsql
    AS $$ BEGIN NEW.updated_at := statement_timestamp(); RETURN NEW; END $$;
CREATE TRIGGER memories_touch_updated_at
    BEFORE UPDATE ON memories
    FOR EACH ROW
    WHEN (OLD.content IS DISTINCT FROM NEW.content
          OR OLD.metadata IS DISTINCT FROM NEW.metadata
          OR OLD.namespace IS DISTINCT FROM NEW.namespace)
    EXECUTE FUNCTION memories_touch_updated_at();
"""

TOUCH_TRIGGER_REVERSE = """
DROP TRIGGER IF EXISTS memories_touch_updated_at ON memories;
DROP FUNCTION IF EXISTS memories_touch_updated_at();
"""

# Guarantees: a memory or pending forget confirmation is visible and writable
# only inside its owner's tenant transaction or on the operator path. FORCE
# binds the table owner too, so a query that forgets `WHERE user_id = ...`
# still cannot return another tenant's rows, and no context means no rows.
RLS = """
ALTER TABLE memories ENABLE ROW LEVEL SECURITY;
ALTER TABLE memories FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON memories FOR ALL TO PUBLIC
    USING (user_id = recall_current_user_id())
    WITH CHECK (user_id = recall_current_user_id());
CREATE POLICY operator_access ON memories FOR ALL TO recall_operator
    USING (current_user = 'recall_operator')
    WITH CHECK (current_user = 'recall_operator');
GRANT SELECT, INSERT, UPDATE, DELETE ON memories TO recall_app;

ALTER TABLE forget_confirmations ENABLE ROW LEVEL SECURITY;
ALTER TABLE forget_confirmations FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON forget_confirmations FOR ALL TO PUBLIC
    USING (user_id = recall_current_user_id())
    WITH CHECK (user_id = recall_current_user_id());
CREATE POLICY operator_access ON forget_confirmations FOR ALL TO recall_operator
    USING (current_user = 'recall_operator')
    WITH CHECK (current_user = 'recall_operator');
GRANT SELECT, INSERT, DELETE ON forget_confirmations TO recall_app;
"""

RLS_REVERSE = """
REVOKE ALL ON forget_confirmations FROM recall_app;
DROP POLICY IF EXISTS operator_access ON forget_confirmations;
DROP POLICY IF EXISTS tenant_isolation ON forget_confirmations;
ALTER TABLE forget_confirmations NO FORCE ROW LEVEL SECURITY;
ALTER TABLE forget_confirmations DISABLE ROW LEVEL SECURITY;

REVOKE ALL ON memories FROM recall_app;
DROP POLICY IF EXISTS operator_access ON memories;
DROP POLICY IF EXISTS tenant_isolation ON memories;
ALTER TABLE memories NO FORCE ROW LEVEL SECURITY;
ALTER TABLE memories DISABLE ROW LEVEL SECURITY;
"""


def create_vector_index(apps, schema_editor):
    # The HNSW index for whichever model is configured when migrating; other
    # models get theirs from `manage.py reembed`. See memories/indexes.py.
    from memories import embeddings, indexes

    model_id, dimensions = embeddings.model_spec()
    indexes.ensure_vector_index(model_id, dimensions, schema_editor.connection)


def drop_vector_indexes(apps, schema_editor):
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(
            "SELECT indexname FROM pg_indexes "
            "WHERE tablename = 'memories' AND indexname LIKE 'memories_hnsw_%'"
        )
        for (name,) in cursor.fetchall():
            cursor.execute(f'DROP INDEX IF EXISTS "{name}"')


class Migration(migrations.Migration):
    dependencies = [
        ("memories", "0001_initial"),
        ("accounts", "0002_database_roles"),
    ]

    operations = [
        migrations.RunSQL(TOUCH_TRIGGER, TOUCH_TRIGGER_REVERSE),
        migrations.RunSQL(RLS, RLS_REVERSE),
        migrations.RunPython(create_vector_index, drop_vector_indexes),
    ]
