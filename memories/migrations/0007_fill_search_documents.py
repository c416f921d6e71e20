from django.db import migrations, transaction

BATCH = 2000

# The memories stored before the search index existed get their search
# documents here (the statistics follow by trigger). Safe on a large table:
# `memories` is only read, in primary-key order, a batch per transaction, so
# no row is rewritten, no lock is held for long, and an interrupted run
# resumes where it stopped. Rows written meanwhile are indexed by the
# triggers; ON CONFLICT skips them.
FILL = """
INSERT INTO search_documents (memory_id, user_id, namespace, created_at, agent_id, task_id,
                              expires_at, vector, length)
SELECT m.id, m.user_id, m.namespace, m.created_at, m.agent_id, m.task_id, m.expires_at, a.vector,
       (SELECT coalesce(sum(cardinality(positions)), 0) FROM unnest(a.vector))
  FROM memories m
 CROSS JOIN LATERAL recall_search_vector(m.content, m.metadata) AS a(vector)
 WHERE m.id = ANY(%s)
 ORDER BY m.id
    ON CONFLICT (memory_id) DO NOTHING
"""


def fill_search_documents(apps, schema_editor):
    connection = schema_editor.connection
    last = None
    while True:
        with transaction.atomic(using=connection.alias), connection.cursor() as cursor:
            # memories is under forced row-level security: only the operator
            # role sees every tenant's rows.
            cursor.execute("SET LOCAL ROLE recall_operator")
            if last is None:
                cursor.execute("SELECT id FROM memories ORDER BY id LIMIT %s", [BATCH])
            else:
                cursor.execute(
                    "SELECT id FROM memories WHERE id > %s ORDER BY id LIMIT %s", [last, BATCH]
                )
            ids = [row[0] for row in cursor.fetchall()]
            if ids:
                cursor.execute(FILL, [ids])
            cursor.execute("RESET ROLE")
        if len(ids) < BATCH:
            return
        last = ids[-1]


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("memories", "0006_search_index"),
    ]

    operations = [
        migrations.RunPython(fill_search_documents, migrations.RunPython.noop),
    ]
