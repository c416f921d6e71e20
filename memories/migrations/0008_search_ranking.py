from importlib import import_module

from django.db import migrations

_index = import_module("memories.migrations.0006_search_index")

# Guarantees: one ranking for hybrid and lexical search, for the user-wide
# path and for agents alike. It runs as recall_search (SECURITY DEFINER), the
# only role that reads the search tables of every agent's memories, so it
# applies memories' agent rule and expiry itself (0006's visible()) to every
# document and memory it reads, and the search's filters (admits()) to every
# candidate it adds; it reads the tenant only from the transaction's
# settings and returns ids and scores only, which the caller joins back to
# memories under its own policy. PL/pgSQL
# with a generic plan, so its statement is planned once per connection rather
# than per search: left to choose, PostgreSQL kept re-planning it (custom
# plans), which cost more than the ranking itself (10 of 25 ms at 100k).
# Every access in it is by primary key or by a fixed index, so the generic
# plan is the custom one.
# What it computes, and why each step is there, is in memories/search.py;
# every constant comes in as an argument from there.
#
# Candidates are the dense neighbours the caller found (p_nearest) and the
# best BM25 matches among the documents holding the query's rarest lexemes
# (at most p_scan documents read). Each candidate gets its cosine similarity
# and its BM25 score over all the query's lexemes, each min-max normalised
# over the candidates and mixed with p_weight on the lexical side. The
# p_providers best then lend their score to the memories up to p_window
# places before and after them in the namespace (by creation): a memory
# scores at least p_lift of the way to its best such neighbour. coverage is
# BM25 over the query's total IDF: the share of its information a memory
# matches, which the caller's threshold reads beside similarity.
RANK = """
CREATE FUNCTION recall_rank(
    p_namespace text, p_query text, p_vector vector, p_nearest uuid[], p_distances float8[],
    p_model text, p_created_after timestamptz, p_created_before timestamptz, p_metadata jsonb,
    p_priorities text[], p_sources jsonb, p_pool integer, p_scan integer, p_k1 float8, p_b float8, p_weight float8,
    p_providers integer, p_window integer, p_lift float8
) RETURNS TABLE (id uuid, similarity float8, coverage float8, score float8)
    LANGUAGE plpgsql STABLE SECURITY DEFINER
    SET search_path = pg_catalog, public
    SET plan_cache_mode = force_generic_plan
    SET enable_seqscan = off
    AS $$
BEGIN
    RETURN QUERY
    WITH space AS MATERIALIZED (
        SELECT coalesce(max(s.documents), 0) AS documents,
               greatest(coalesce(max(s.length)::float8 / nullif(max(s.documents), 0), 1), 1)
                   AS average_length
          FROM search_namespaces s
         WHERE s.user_id = recall_current_user_id() AND s.namespace = p_namespace
    ),
    terms AS MATERIALIZED (
        SELECT q.lexeme, coalesce(t.documents, 0) AS documents,
               ln(1 + (sp.documents - coalesce(t.documents, 0) + 0.5)
                      / (coalesce(t.documents, 0) + 0.5)) AS idf
          FROM (SELECT DISTINCT u.lexeme
                  FROM unnest(to_tsvector('pg_catalog.english', recall_search_text(p_query))) AS u
               ) AS q
         CROSS JOIN space sp
          LEFT JOIN LATERAL (
            SELECT st.documents FROM search_terms st
             WHERE st.user_id = recall_current_user_id() AND st.namespace = p_namespace
               AND st.lexeme = q.lexeme
          ) AS t ON true
    ),
    -- Words no memory holds match nothing, but they are part of what was
    -- asked: they count in the query's total IDF (its mass), so a memory that
    -- matches only part of a specific question covers only that part.
    query AS MATERIALIZED (
        SELECT coalesce(array_agg(tm.lexeme ORDER BY tm.lexeme)
                            FILTER (WHERE tm.documents > 0), '{}') AS lexemes,
               coalesce(array_agg(tm.idf ORDER BY tm.lexeme)
                            FILTER (WHERE tm.documents > 0), '{}') AS idfs,
               coalesce(sum(tm.idf), 0) AS mass,
               ARRAY(SELECT r.lexeme
                       FROM (SELECT tt.lexeme,
                                    sum(tt.documents) OVER (ORDER BY tt.documents, tt.lexeme) AS reads
                               FROM terms tt WHERE tt.documents > 0) AS r
                      WHERE r.reads <= p_scan) AS rare
          FROM terms tm
    ),
    lexical AS MATERIALIZED (
        SELECT f.memory_id AS id, f.score
          FROM query q,
               recall_lexical_matches(p_namespace, q.rare, q.lexemes, q.idfs,
                   (SELECT sp.average_length FROM space sp), p_k1, p_b, p_pool,
                   p_created_after, p_created_before, p_metadata, p_priorities, p_sources) AS f
         WHERE cardinality(q.rare) > 0
    ),
    -- What each side already knows is not read again: a dense neighbour
    -- comes with its distance, a lexical match with its BM25. Only the other
    -- half is read, by primary key: the search document of a memory found
    -- by cosine alone, the vector of one found by its words alone.
    candidates AS MATERIALIZED (
        SELECT n.id, 1 - n.distance AS similarity, coalesce(lx.score, bm.score) AS lexical
          FROM unnest(p_nearest, p_distances) AS n(id, distance)
         CROSS JOIN query q
         CROSS JOIN space sp
          LEFT JOIN lexical lx ON lx.id = n.id
          LEFT JOIN LATERAL (
            SELECT coalesce(sum(q.idfs[array_position(q.lexemes, v.lexeme)]
                                * cardinality(v.positions) * (p_k1 + 1)
                                / (cardinality(v.positions)
                                   + p_k1 * (1 - p_b + p_b * d.length / sp.average_length))), 0)
                       AS score
              FROM search_documents d
              LEFT JOIN LATERAL unnest(ts_filter(setweight(d.vector, 'A', q.lexemes), '{a}')) AS v
                   ON true
             WHERE lx.id IS NULL AND d.memory_id = n.id
               AND d.user_id = recall_current_user_id() AND VISIBLE_D
             GROUP BY d.memory_id
          ) AS bm ON true
         WHERE lx.id IS NOT NULL OR bm.score IS NOT NULL
        UNION ALL
        SELECT m.id, 1 - cosine_distance(m.embedding, p_vector), lx.score
          FROM lexical lx
          JOIN memories m ON m.id = lx.id
         WHERE lx.id <> ALL (p_nearest)
           AND m.user_id = recall_current_user_id() AND m.embedding_model = p_model
           AND VISIBLE_M
    ),
    bounds AS MATERIALIZED (
        SELECT min(c.similarity) AS s0, max(c.similarity) AS s1,
               min(c.lexical) AS l0, max(c.lexical) AS l1
          FROM candidates c
    ),
    own AS MATERIALIZED (
        SELECT c.id, c.similarity, c.lexical,
               (1 - p_weight) * coalesce(greatest(c.similarity - b.s0, 0) / nullif(b.s1 - b.s0, 0), 0)
             + p_weight * coalesce(greatest(c.lexical - b.l0, 0) / nullif(b.l1 - b.l0, 0), 0)
                   AS score
          FROM candidates c, bounds b
    ),
    lifts AS MATERIALIZED (
        SELECT n.id, max(p.score) AS lift
          FROM (SELECT o.id, d.created_at, o.score
                  FROM (SELECT o.id, o.score FROM own o
                         WHERE p_lift > 0
                         ORDER BY o.score DESC, o.id LIMIT p_providers) AS o
                  JOIN search_documents d ON d.memory_id = o.id
                 WHERE d.user_id = recall_current_user_id() AND VISIBLE_D) AS p
         CROSS JOIN LATERAL (
            (SELECT m.id FROM memories m
              WHERE m.user_id = recall_current_user_id() AND m.namespace = p_namespace
                AND (m.created_at, m.id) < (p.created_at, p.id) AND VISIBLE_M
              ORDER BY m.created_at DESC, m.id DESC LIMIT p_window)
            UNION ALL
            (SELECT m.id FROM memories m
              WHERE m.user_id = recall_current_user_id() AND m.namespace = p_namespace
                AND (m.created_at, m.id) > (p.created_at, p.id) AND VISIBLE_M
              ORDER BY m.created_at, m.id LIMIT p_window)
         ) AS n
         GROUP BY n.id
    ),
    neighbours AS MATERIALIZED (
        SELECT m.id,
               1 - cosine_distance(m.embedding, p_vector) AS similarity,
               coalesce(sum(q.idfs[array_position(q.lexemes, v.lexeme)]
                            * cardinality(v.positions) * (p_k1 + 1)
                            / (cardinality(v.positions)
                               + p_k1 * (1 - p_b + p_b * d.length / sp.average_length))), 0)
                   AS lexical
          FROM (SELECT l.id FROM lifts l EXCEPT SELECT o.id FROM own o) AS x
          JOIN memories m ON m.id = x.id
         CROSS JOIN query q
         CROSS JOIN space sp
          LEFT JOIN search_documents d
                 ON d.memory_id = x.id AND d.user_id = recall_current_user_id()
          LEFT JOIN LATERAL unnest(ts_filter(setweight(d.vector, 'A', q.lexemes), '{a}')) AS v
               ON true
         WHERE m.user_id = recall_current_user_id() AND m.namespace = p_namespace
           AND m.embedding_model = p_model
           AND (p_created_after IS NULL OR m.created_at >= p_created_after)
           AND (p_created_before IS NULL OR m.created_at < p_created_before)
           AND VISIBLE_M AND ADMITS_M
         GROUP BY m.id
    ),
    pool AS (
        SELECT o.id, o.similarity, o.lexical, o.score FROM own o
        UNION ALL
        SELECT e.id, e.similarity, e.lexical,
               (1 - p_weight) * coalesce(greatest(e.similarity - b.s0, 0) / nullif(b.s1 - b.s0, 0), 0)
             + p_weight * coalesce(greatest(e.lexical - b.l0, 0) / nullif(b.l1 - b.l0, 0), 0)
          FROM neighbours e, bounds b
    )
    SELECT p.id, p.similarity,
           p.lexical / nullif((SELECT q.mass FROM query q), 0),
           p.score + p_lift * greatest(coalesce(l.lift, 0) - p.score, 0)
      FROM pool p LEFT JOIN lifts l ON l.id = p.id;
END
$$;
REVOKE ALL ON FUNCTION recall_rank(SIGNATURE) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION recall_rank(SIGNATURE) TO recall_app, recall_agent;
-- Owned by recall_search, as recall_lexical_matches() is (migration 0006).
GRANT recall_search TO CURRENT_USER;
GRANT CREATE ON SCHEMA public TO recall_search;
ALTER FUNCTION recall_rank(SIGNATURE) OWNER TO recall_search;
REVOKE CREATE ON SCHEMA public FROM recall_search;
REVOKE recall_search FROM CURRENT_USER;
"""

RANK_REVERSE = """
DROP FUNCTION IF EXISTS recall_rank(SIGNATURE);
"""


SIGNATURE = (
    "text, text, vector, uuid[], float8[], text, timestamptz, timestamptz, jsonb, text[], jsonb,"
    " integer, integer, float8, float8, float8, integer, integer, float8"
)
RANK = (
    RANK.replace("VISIBLE_D", _index.visible("d"))
    .replace("VISIBLE_M", _index.visible("m"))
    .replace("ADMITS_M", _index.admits("m"))
    .replace("SIGNATURE", SIGNATURE)
)
RANK_REVERSE = RANK_REVERSE.replace("SIGNATURE", SIGNATURE)


class Migration(migrations.Migration):
    dependencies = [
        ("memories", "0007_fill_search_documents"),
    ]

    operations = [
        migrations.RunSQL(RANK, RANK_REVERSE),
    ]
