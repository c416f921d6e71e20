from django.db import migrations, transaction

# Guarantee: the words inside a host, an e-mail address or a dotted name are
# searchable words of the memory, as well as the whole token.
#
# PostgreSQL's parser reads "smtp.sendgrid.net", "press@lumen.dev" and
# "kafka-orders.corp" as one token each (a host, an e-mail), so a lexical
# search for "sendgrid", "press" or "orders" found nothing in a memory that
# says where mail is relayed, whom journalists write to or which broker
# carries the orders. recall_search_text() now appends each such token's
# parts, as words, after the text: every label that begins with two
# letters, but the last (".net", ".dev", ".io", ".py" name no subject, and
# "dev" or "io" would match the words). The whole token stays, so a search
# for the exact host matches it on every lexeme. Numbers are no parts:
# "192.168.1.40", "v2.17.1" and "3.11" add nothing. A query goes through
# the same function, so "smtp.sendgrid.net" asked matches the parts too.
#
# The hyphen rule of 0006 (a hyphen before a digit separates) applies to the
# parts as well: "rabbit-01.corp" gives "rabbit" and "01".
NEW = r"""
CREATE OR REPLACE FUNCTION recall_search_text(value text) RETURNS text
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$ SELECT regexp_replace(
        value || coalesce(' ' || (
            SELECT string_agg(p.part, ' ' ORDER BY m.n, p.k)
              FROM regexp_matches(value, '[[:alnum:]_%+-]+(?:[.@][[:alnum:]_-]+)+', 'g')
                   WITH ORDINALITY AS m(found, n)
             CROSS JOIN LATERAL regexp_split_to_table(
                   regexp_replace(m.found[1], '[.][^.@]*$', ''), '[.@]')
                   WITH ORDINALITY AS p(part, k)
             WHERE p.part ~ '^[[:alpha:]]{2}'), ''),
        '([[:alnum:]])-(?=[[:digit:]])', '\1 ', 'g') $$;
"""
OLD = r"""
CREATE OR REPLACE FUNCTION recall_search_text(value text) RETURNS text
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$ SELECT regexp_replace(value, '([[:alnum:]])-(?=[[:digit:]])', '\1 ', 'g') $$;
"""

BATCH = 2000

# Each document analysed the old way is analysed again, a batch of memories
# per transaction in primary-key order, as 0007 filled them: memories is only
# read, no memory row is rewritten (nor re-inserted into the HNSW graph), no
# lock is held for long, and a document whose words do not change is not
# written at all. The statistics follow by 0006's trigger on
# search_documents. A memory written meanwhile is analysed by its own
# write's trigger with the new function; a search meanwhile reads some
# documents of each kind, and finds the parts only in the new ones.
REANALYSE = """
UPDATE search_documents d
   SET vector = a.vector,
       length = (SELECT coalesce(sum(cardinality(positions)), 0) FROM unnest(a.vector))
  FROM memories m
 CROSS JOIN LATERAL recall_search_vector(m.content, m.metadata) AS a(vector)
 WHERE m.id = ANY(%s) AND d.memory_id = m.id AND d.vector IS DISTINCT FROM a.vector
"""


def reanalyse(apps, schema_editor):
    connection = schema_editor.connection
    last = None
    while True:
        with transaction.atomic(using=connection.alias), connection.cursor() as cursor:
            # Both tables are under forced row-level security: only the
            # operator role sees every tenant's rows.
            cursor.execute("SET LOCAL ROLE recall_operator")
            if last is None:
                cursor.execute("SELECT id FROM memories ORDER BY id LIMIT %s", [BATCH])
            else:
                cursor.execute(
                    "SELECT id FROM memories WHERE id > %s ORDER BY id LIMIT %s", [last, BATCH]
                )
            ids = [row[0] for row in cursor.fetchall()]
            if ids:
                cursor.execute(REANALYSE, [ids])
            cursor.execute("RESET ROLE")
        if len(ids) < BATCH:
            return
        last = ids[-1]


class Migration(migrations.Migration):
    # Each batch commits on its own (see reanalyse).
    atomic = False

    dependencies = [("memories", "0024_lexical_matches_held_only")]

    # Undone in reverse order: the old function first, then the documents
    # analysed again with it.
    operations = [
        migrations.RunPython(migrations.RunPython.noop, reanalyse),
        migrations.RunSQL(NEW, OLD),
        migrations.RunPython(reanalyse, migrations.RunPython.noop),
    ]
