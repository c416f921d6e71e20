# Guarantee: a word written inside angle brackets is a searchable word of the
# memory ("List<String>", "<section class=...>", "Map<UserId, Order>").
#
# PostgreSQL's default parser reads "<String>" or "<section ...>" as an XML
# tag, and the english configuration indexes no tag, so the words in one
# vanished from the lexical index: a coding agent's note about List<String>
# was not found by "String", nor an HTML snippet by "section", and hybrid
# search fell back to the vectors alone for them. recall_search_text() now
# reads each angle bracket as a space before anything else (0025's parts,
# 0006's hyphen rule), in documents and queries alike, so a query with
# brackets matches the same words. No other text changes: a memory without a
# bracket is analysed exactly as before, and 0025's batches (which write only
# the documents whose words change) bring the stored ones up to date.

from importlib import import_module

from django.db import migrations

parts = import_module("memories.migrations.0025_search_address_parts")

NEW = r"""
CREATE OR REPLACE FUNCTION recall_search_text(value text) RETURNS text
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$ SELECT h.s || coalesce(' ' || (
            SELECT string_agg(DISTINCT lower(p.part), ' ')
              FROM ts_parse(3722, h.s) AS t(tokid, token)
             CROSS JOIN LATERAL regexp_split_to_table(
                   regexp_replace(t.token, '[.][^./@]*$', ''), '[./@]+') AS p(part)
             WHERE t.tokid IN (4, 6, 19) AND p.part ~ '^[[:alpha:]]{2}'), '')
      FROM regexp_replace(translate(value, '<>', '  '),
                          '([[:alnum:]])-(?=[[:digit:]])', '\1 ', 'g') AS h(s) $$;
"""
OLD = parts.NEW


class Migration(migrations.Migration):
    # Each batch commits on its own (see 0025).
    atomic = False

    dependencies = [("memories", "0027_priority_touches_updated_at")]

    # Undone in reverse order: the old function first, then the documents
    # analysed again with it.
    operations = [
        migrations.RunPython(migrations.RunPython.noop, parts.reanalyse),
        migrations.RunSQL(NEW, OLD),
        migrations.RunPython(parts.reanalyse, migrations.RunPython.noop),
    ]
