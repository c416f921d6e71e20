from importlib import import_module

from django.db import migrations

_index = import_module("memories.migrations.0006_search_index")
_ranking = import_module("memories.migrations.0008_search_ranking")

# Guarantees: recall_rank() returns an absolute score, a memory's own: the
# same similarity and coverage give the same score in any query, namespace
# and candidate pool, and a lone memory scores what it would among others.
#
# 0008 min-max normalised cosine and BM25 over the candidates and averaged
# them, so the best candidate of any pool scored near 1 and the worst 0: a
# lone match scored 0.0 and no two queries' scores compared. Now each
# candidate's z = p_similarity * similarity + p_coverage * coverage +
# p_offset (coverage: BM25 over the query's total IDF, as before), the
# neighbours' lift works on z (each of the p_providers best raises the
# memories within p_window places p_lift of the way to its own z), and the
# score is 1 / (1 + exp(-z)), the memory's own: the lift changes its rank
# (1 / (1 + exp(-lifted z))), not its score. A neighbour is lifted for being
# beside a match, which says little of its own relevance: on the development
# data 2% of the unrelated candidates the lift raised past 0.5 were relevant.
# IDF counts p_prior documents more than the
# namespace holds, none with the query's words: in a namespace of one memory
# every word it holds was in every document, so its IDF was a fifth of a
# missing word's and a lone memory lacking one of the query's words covered
# little of it; from a few hundred memories up the prior changes nothing
# measurable. The constants come from memories/scoring.py,
# fitted by bench/calibration.py (what a value means is there). Everything
# else (candidates, filters, the agent rule, the security definer, the
# generic plan) is 0008's, unchanged.
RANK = """
CREATE FUNCTION recall_rank(
    p_namespace text, p_query text, p_vector vector, p_nearest uuid[], p_distances float8[],
    p_model text, p_created_after timestamptz, p_created_before timestamptz, p_metadata jsonb,
    p_priorities text[], p_sources jsonb, p_pool integer, p_scan integer, p_k1 float8, p_b float8,
    p_prior float8, p_similarity float8, p_coverage float8, p_offset float8,
    p_providers integer, p_window integer, p_lift float8
) RETURNS TABLE (id uuid, similarity float8, coverage float8, score float8, rank float8)
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
               -- p_prior more documents, holding none of the words: a small
               -- namespace's words are not all common just because it is small.
               ln(1 + (sp.documents + p_prior - coalesce(t.documents, 0) + 0.5)
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
    -- Each candidate's own z: the score's linear part, from its similarity
    -- and its coverage alone, never from the other candidates.
    own AS MATERIALIZED (
        SELECT c.id, c.similarity, c.lexical,
               p_similarity * c.similarity
             + p_coverage * coalesce(c.lexical / nullif((SELECT q.mass FROM query q), 0), 0)
             + p_offset AS score
          FROM candidates c
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
               p_similarity * e.similarity
             + p_coverage * coalesce(e.lexical / nullif((SELECT q.mass FROM query q), 0), 0)
             + p_offset
          FROM neighbours e
    )
    SELECT p.id, p.similarity,
           p.lexical / nullif((SELECT q.mass FROM query q), 0),
           1 / (1 + exp(-p.score)),
           1 / (1 + exp(-(p.score + p_lift * coalesce(greatest(l.lift - p.score, 0), 0))))
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

SIGNATURE = (
    "text, text, vector, uuid[], float8[], text, timestamptz, timestamptz, jsonb, text[], jsonb,"
    " integer, integer, float8, float8, float8, float8, float8, float8, integer, integer, float8"
)
RANK = (
    RANK.replace("VISIBLE_D", _index.visible("d"))
    .replace("VISIBLE_M", _index.visible("m"))
    .replace("ADMITS_M", _index.admits("m"))
    .replace("SIGNATURE", SIGNATURE)
)
DROP = "DROP FUNCTION IF EXISTS recall_rank(SIGNATURE);"


class Migration(migrations.Migration):
    dependencies = [("memories", "0014_import_chunks")]

    operations = [
        migrations.RunSQL(
            DROP.replace("SIGNATURE", _ranking.SIGNATURE) + RANK,
            DROP.replace("SIGNATURE", SIGNATURE) + _ranking.RANK,
        ),
    ]
