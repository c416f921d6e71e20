from importlib import import_module

from django.db import migrations

_filtered = import_module("memories.migrations.0010_filtered_search")

# Guarantees: a filtered search whose filters match at most p_most memories
# reads each match once. recall_filtered_nearest() finds the matches through
# their indexes, as recall_filtered_ids() did (0010), and measures their
# distance to the query in the same pass; it returns the p_nearest closest
# ids, nearest first, or NULL when more than p_most match. The caller then
# reads those few rows by primary key under its own policy, as before.
#
# recall_filtered_ids() returned every match's id, and the caller read every
# match a second time, by primary key, to rank it: at 100k memories a 1%
# filter's 969 matches took 3.7 ms to find and 8 ms to read again.
#
# The distance is pgvector's cosine distance on the stored vector, the same
# function the exact branch ranks by; matches of one model share its width.
# Ties go to the smaller id, so the p_nearest are always the same rows.
#
# A memory's vector stays in its row (STORAGE MAIN, as search_documents'
# vector since 0006), where pgvector's default (EXTERNAL) moved it to the
# TOAST table whenever the row outgrew 2 KB: beside a 384-wide vector, any
# memory of more than about 300 characters (one in ten of bench/scale.py's
# corpus, 22 MB of TOAST for 100k memories). Every exact ranking (a small
# namespace, a filter's matches) then fetched such a memory's vector from
# the TOAST table through its index: at 100k memories, measuring a 1%
# filter's matches took 1 ms longer than reading them. Content, compressed or moved out first, takes the TOAST
# table instead. Rows written before this keep their layout until rewritten
# (VACUUM FULL memories, which rebuilds the HNSW index too).
NEAREST = """
ALTER TABLE memories ALTER COLUMN embedding SET STORAGE MAIN;
CREATE FUNCTION recall_filtered_nearest(
    p_namespace text, p_model text, p_created_after timestamptz, p_created_before timestamptz,
    p_metadata jsonb, p_priorities text[], p_sources jsonb, p_most integer,
    p_vector vector, p_nearest integer
) RETURNS uuid[]
    LANGUAGE plpgsql STABLE SECURITY DEFINER
    SET search_path = pg_catalog, public
    AS $$
DECLARE
    clauses text := 'm.user_id = recall_current_user_id() AND m.namespace = $1'
                    ' AND m.embedding_model = $2 AND VISIBLE_M';
    matched integer;
    nearest uuid[];
BEGIN
CLAUSES
    EXECUTE 'SELECT count(*)::int, (array_agg(id ORDER BY distance, id))[1:$10]'
            ' FROM (SELECT m.id, m.embedding <=> $9 AS distance FROM memories m WHERE '
            || clauses || ' LIMIT $8 + 1) AS found'
        INTO matched, nearest
        USING p_namespace, p_model, p_created_after, p_created_before, p_metadata,
              p_priorities, p_sources, p_most, p_vector, p_nearest;
    IF matched > p_most THEN
        RETURN NULL;
    END IF;
    RETURN coalesce(nearest, '{}');
END
$$;
HAND_OVER
DROP FUNCTION recall_filtered_ids(OLD_SIGNATURE);
"""

SIGNATURE = "text, text, timestamptz, timestamptz, jsonb, text[], jsonb, integer, vector, integer"
NEAREST = (
    NEAREST.replace("CLAUSES\n", _filtered.CLAUSES)
    .replace("HAND_OVER\n", _filtered.hand_over("recall_filtered_nearest(SIGNATURE)"))
    .replace("VISIBLE_M", _filtered._index.visible("m").replace("'", "''"))
    .replace("SOURCES_M", _filtered.SOURCES)
    .replace("OLD_SIGNATURE", _filtered.SIGNATURE)
    .replace("SIGNATURE", SIGNATURE)
)
NEAREST_REVERSE = (
    "ALTER TABLE memories ALTER COLUMN embedding SET STORAGE EXTERNAL;\n"
    f"DROP FUNCTION IF EXISTS recall_filtered_nearest({SIGNATURE});\n" + _filtered.FILTERED
)


class Migration(migrations.Migration):
    dependencies = [("memories", "0011_search_reads_no_pending_list")]

    operations = [migrations.RunSQL(NEAREST, NEAREST_REVERSE)]
