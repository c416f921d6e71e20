import time

from django.db import OperationalError, migrations, transaction

# Guarantee: the words inside a host, an e-mail address or a dotted name are
# searchable words of the memory, as well as the whole token.
#
# PostgreSQL's parser reads "smtp.sendgrid.net", "press@lumen.dev",
# "kafka-orders.corp" and "/etc/nginx/nginx.conf" as one token each (a host,
# an e-mail address, a file), so a lexical search for "sendgrid", "press",
# "orders" or "nginx" found nothing in a memory that says where mail is
# relayed, whom journalists write to or which broker carries the orders.
# recall_search_text() now appends the parts of each token the parser keeps
# whole as a host, an e-mail address or a file, as words after the text:
# every part that begins with two letters, each once, but the last label
# (".net", ".dev", ".io", ".conf" name no subject, and "dev" or "io" would
# match the words). Only those tokens: a word the parser already reads on
# its own ("straße@bücher.de" is three words to it, "https://user@host" two)
# is not counted twice, and a URL gives its host's parts once, through the
# host token the parser also emits. Numbers are no parts: "192.168.1.40",
# "v2.17.1" and "3.11" add nothing. The whole token stays, so a search for
# the exact host matches it on every lexeme, and a query goes through the
# same function, so "smtp.sendgrid.net" asked matches the parts too.
#
# The hyphen rule of 0006 (a hyphen before a digit separates) applies
# first, as before: "rabbit-01.corp" is the word "rabbit" and the host
# "01.corp", which has no part to add. 3722 is the default parser's fixed
# OID; ts_parse() by OID is immutable, by name only stable.
NEW = r"""
CREATE OR REPLACE FUNCTION recall_search_text(value text) RETURNS text
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$ SELECT h.s || coalesce(' ' || (
            SELECT string_agg(DISTINCT lower(p.part), ' ')
              FROM ts_parse(3722, h.s) AS t(tokid, token)
             CROSS JOIN LATERAL regexp_split_to_table(
                   regexp_replace(t.token, '[.][^./@]*$', ''), '[./@]+') AS p(part)
             WHERE t.tokid IN (4, 6, 19) AND p.part ~ '^[[:alpha:]]{2}'), '')
      FROM regexp_replace(value, '([[:alnum:]])-(?=[[:digit:]])', '\1 ', 'g') AS h(s) $$;
"""
OLD = r"""
CREATE OR REPLACE FUNCTION recall_search_text(value text) RETURNS text
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$ SELECT regexp_replace(value, '([[:alnum:]])-(?=[[:digit:]])', '\1 ', 'g') $$;
"""

BATCH = 2000

# Each document analysed the old way is analysed again, a batch of memories
# per transaction in primary-key order, as 0007 filled them: no memory row is
# rewritten (nor re-inserted into the HNSW graph), no lock is held for long,
# and a document whose words do not change is not written at all. The
# statistics follow by 0006's trigger on search_documents.
#
# Servers keep writing meanwhile (upgrades roll), so the batch's memories are
# locked FOR SHARE first: that waits for a write in progress to commit and
# holds off new ones until the batch commits, and the UPDATE, a statement
# with a later snapshot, then reads the content they committed. Without the
# lock, an edit committed while the UPDATE waited for its document would be
# read as it was before, and its old words written back over the new ones.
# A session that takes two memories out of id order (the service's writers
# take them in id order; an operator's SQL need not) can close a cycle with
# a batch's locks; PostgreSQL then rolls one of the two back (40P01). A batch
# that loses such a race, or a serialization failure, is run again, a few
# times, after a pause; a writer that loses it gets the contention error
# every write may get, and the same call again succeeds.
# A memory inserted meanwhile is analysed by its own trigger with whichever
# function was current; a search meanwhile reads documents of both readings.
REANALYSE = """
UPDATE search_documents d
   SET vector = a.vector,
       length = (SELECT coalesce(sum(cardinality(positions)), 0) FROM unnest(a.vector))
  FROM memories m
 CROSS JOIN LATERAL recall_search_vector(m.content, m.metadata) AS a(vector)
 WHERE m.id = ANY(%s) AND d.memory_id = m.id AND d.vector IS DISTINCT FROM a.vector
"""


# Tries per batch, and the pause before the next, in seconds, times the try.
ATTEMPTS = 5
PAUSE = 0.2


def reanalyse(apps, schema_editor):
    connection = schema_editor.connection
    last = None
    while True:
        ids = _batch(connection, last)
        if len(ids) < BATCH:
            return
        last = ids[-1]


def _batch(connection, last):
    """Analyse again the memories after ``last`` (a batch); return their ids."""
    for attempt in range(1, ATTEMPTS + 1):
        try:
            with transaction.atomic(using=connection.alias), connection.cursor() as cursor:
                # Both tables are under forced row-level security: only the
                # operator role sees every tenant's rows.
                cursor.execute("SET LOCAL ROLE recall_operator")
                if last is None:
                    cursor.execute(
                        "SELECT id FROM memories ORDER BY id LIMIT %s FOR SHARE", [BATCH]
                    )
                else:
                    cursor.execute(
                        "SELECT id FROM memories WHERE id > %s ORDER BY id LIMIT %s FOR SHARE",
                        [last, BATCH],
                    )
                ids = [row[0] for row in cursor.fetchall()]
                if ids:
                    cursor.execute(REANALYSE, [ids])
                cursor.execute("RESET ROLE")
            return ids
        except OperationalError as error:
            if attempt == ATTEMPTS or not _lost_race(error):
                raise
            time.sleep(PAUSE * attempt)
    raise AssertionError("unreachable")


def _lost_race(error):
    """Whether PostgreSQL rolled the batch back to settle a race (40P01, 40001)."""
    return getattr(error.__cause__, "sqlstate", None) in {"40P01", "40001"}


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
