from importlib import import_module

from django.db import migrations

_index = import_module("memories.migrations.0006_search_index")

# Guarantees: a filtered search of a big namespace can find the memories its
# filters match through their indexes (the metadata GIN index, the creation
# b-tree, the source columns' b-trees) while row-level security stays forced.
# Behind the tenant policy the planner will not use `@>` on jsonb as an index
# condition (it is not leakproof), so a metadata filter used to be checked
# row by row along the HNSW scan: 1% of 100k memories cost 44 ms.
# recall_filtered_ids() runs as recall_search, whose own policy on memories
# is USING (true), reads the tenant only from the transaction's settings,
# applies the agent rule and expiry (0006's visible()) and every filter
# itself, and returns ids only, at most p_limit; the caller ranks those rows
# as recall_app or recall_agent, under its own policy, so an id could never
# surface a row the caller may not read. Dynamic SQL, so each call is planned
# for the filters it has: a NULL-or-match condition would hide the GIN index
# from a generic plan.
FILTERED = """
CREATE FUNCTION recall_filtered_ids(
    p_namespace text, p_model text, p_created_after timestamptz, p_created_before timestamptz,
    p_metadata jsonb, p_priorities text[], p_sources jsonb, p_limit integer
) RETURNS SETOF uuid
    LANGUAGE plpgsql STABLE SECURITY DEFINER
    SET search_path = pg_catalog, public
    AS $$
DECLARE
    clauses text := 'm.user_id = recall_current_user_id() AND m.namespace = $1'
                    ' AND m.embedding_model = $2 AND VISIBLE_M';
BEGIN
CLAUSES
    RETURN QUERY EXECUTE 'SELECT m.id FROM memories m WHERE ' || clauses || ' LIMIT $8'
        USING p_namespace, p_model, p_created_after, p_created_before, p_metadata,
              p_priorities, p_sources, p_limit;
END
$$;
HAND_OVER
"""

SIGNATURE = "text, text, timestamptz, timestamptz, jsonb, text[], jsonb, integer"


def hand_over(function: str) -> str:
    """Let only the tenant roles call ``function`` and give it to recall_search."""
    return f"""REVOKE ALL ON FUNCTION {function} FROM PUBLIC;
GRANT EXECUTE ON FUNCTION {function} TO recall_app, recall_agent;
-- The hand-over, as for recall_lexical_matches (0006).
GRANT recall_search TO CURRENT_USER;
GRANT CREATE ON SCHEMA public TO recall_search;
ALTER FUNCTION {function} OWNER TO recall_search;
REVOKE CREATE ON SCHEMA public FROM recall_search;
REVOKE recall_search FROM CURRENT_USER;
"""


# The filters' conditions, added to `clauses` for those given; parameters $3
# to $7 are the filters in the signature's order (also 0012's).
CLAUSES = """    IF p_created_after IS NOT NULL THEN
        clauses := clauses || ' AND m.created_at >= $3';
    END IF;
    IF p_created_before IS NOT NULL THEN
        clauses := clauses || ' AND m.created_at < $4';
    END IF;
    IF p_metadata IS NOT NULL THEN
        clauses := clauses || ' AND m.metadata @> $5';
    END IF;
    IF p_priorities IS NOT NULL THEN
        clauses := clauses || ' AND m.priority = ANY($6)';
    END IF;
    IF p_sources IS NOT NULL THEN
        clauses := clauses || ' AND SOURCES_M';
    END IF;
"""
SOURCES = " AND ".join(
    f"(p_sources->>''{column}'' IS NULL OR m.{column} = p_sources->>''{column}'')"
    for column in ("source_kind", "author", "path", "thread_id", "task_id")
).replace("p_sources", "$7")
FILTERED = (
    FILTERED.replace("CLAUSES\n", CLAUSES)
    .replace("HAND_OVER\n", hand_over("recall_filtered_ids(SIGNATURE)"))
    .replace("VISIBLE_M", _index.visible("m").replace("'", "''"))
    .replace("SOURCES_M", SOURCES)
    .replace("SIGNATURE", SIGNATURE)
)
FILTERED_REVERSE = f"DROP FUNCTION IF EXISTS recall_filtered_ids({SIGNATURE});"


class Migration(migrations.Migration):
    dependencies = [("memories", "0009_lexical_scan_by_index")]

    operations = [migrations.RunSQL(FILTERED, FILTERED_REVERSE)]
