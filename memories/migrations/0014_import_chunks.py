import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models

# Guarantees: a piece of an uploaded file goes with its job and its user,
# whoever deletes them (maintenance removes finished jobs with raw SQL; a user
# is deleted with their jobs by the cascade of migration 0005). And: a file
# uploaded for import is readable and deletable only inside
# its owner's tenant transaction (user-wide: agents have no grant) or on the
# operator path, like the job it belongs to. Pieces are never updated.
RLS = """
ALTER TABLE memory_import_chunks ADD CONSTRAINT memory_import_chunks_job_fk
    FOREIGN KEY (job_id) REFERENCES memory_jobs (id) ON DELETE CASCADE;
ALTER TABLE memory_import_chunks ADD CONSTRAINT memory_import_chunks_user_fk
    FOREIGN KEY (user_id) REFERENCES users (id) ON DELETE CASCADE;
ALTER TABLE memory_import_chunks ENABLE ROW LEVEL SECURITY;
ALTER TABLE memory_import_chunks FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON memory_import_chunks FOR ALL TO recall_app
    USING (user_id = recall_current_user_id())
    WITH CHECK (user_id = recall_current_user_id());
CREATE POLICY operator_access ON memory_import_chunks FOR ALL TO recall_operator
    USING (current_user = 'recall_operator')
    WITH CHECK (current_user = 'recall_operator');
GRANT SELECT, INSERT, DELETE ON memory_import_chunks TO recall_app;
GRANT USAGE ON SEQUENCE memory_import_chunks_id_seq TO recall_app;
"""

RLS_REVERSE = """
REVOKE ALL ON SEQUENCE memory_import_chunks_id_seq FROM recall_app;
REVOKE ALL ON memory_import_chunks FROM recall_app;
DROP POLICY IF EXISTS operator_access ON memory_import_chunks;
DROP POLICY IF EXISTS tenant_isolation ON memory_import_chunks;
ALTER TABLE memory_import_chunks NO FORCE ROW LEVEL SECURITY;
ALTER TABLE memory_import_chunks DISABLE ROW LEVEL SECURITY;
ALTER TABLE memory_import_chunks DROP CONSTRAINT IF EXISTS memory_import_chunks_user_fk;
ALTER TABLE memory_import_chunks DROP CONSTRAINT IF EXISTS memory_import_chunks_job_fk;
"""


class Migration(migrations.Migration):
    dependencies = [
        ("memories", "0013_metadata_counts"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.CreateModel(
            name="ImportChunk",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                ("seq", models.PositiveIntegerField()),
                ("data", models.BinaryField()),
                (
                    "job",
                    models.ForeignKey(
                        db_constraint=False,
                        db_index=False,
                        on_delete=django.db.models.deletion.DO_NOTHING,
                        related_name="+",
                        to="memories.job",
                    ),
                ),
                (
                    "user",
                    models.ForeignKey(
                        db_constraint=False,
                        db_index=False,
                        on_delete=django.db.models.deletion.DO_NOTHING,
                        related_name="+",
                        to=settings.AUTH_USER_MODEL,
                    ),
                ),
            ],
            options={"db_table": "memory_import_chunks"},
        ),
        migrations.AddConstraint(
            model_name="importchunk",
            constraint=models.UniqueConstraint(
                fields=("job", "seq"), name="memory_import_chunks_seq"
            ),
        ),
        migrations.RunSQL(RLS, reverse_sql=RLS_REVERSE),
    ]
