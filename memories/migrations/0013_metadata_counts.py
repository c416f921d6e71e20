from importlib import import_module

from django.db import migrations

_index = import_module("memories.migrations.0006_search_index")

# Guarantees: per user, namespace and embedding model, search_metadata counts
# the memories without an expiry whose metadata holds each top-level key with
# exactly each value (the pair as a one-key object, as a metadata_filter of
# one key is written), whatever wrote the memories, in the writer's own
# statement. Pairs longer than PAIR_MAX bytes are not counted, so no value can
# outgrow the primary key's b-tree. The pair is kept as jsonb's text of it:
# text equality is leakproof, so behind the tenant policy a lookup is still
# an index condition (jsonb's is not, and would filter the namespace's every
# pair). Two jsonb values equal but written differently (1 and 1.0) have
# different texts; a filter written the other way finds no count, which is
# only a lower bound of zero. Counts that reach zero are deleted: once a
# memory is gone, nothing of its metadata stays here.
#
# What for: every memory a pair's count holds matches the one-key filter
# {key: value} (a value contains itself) and is live whatever the time, so
# the count is a lower bound on what recall_filtered_nearest() (0012) would
# match for that filter on the user-wide path. When it is above the
# function's limit, the function would read limit + 1 matches only to answer
# NULL; the search skips it (memories/search.py, the broad CTE). At a million
# memories a 1% filter matches 10,000 of them, and that attempt read 2,001
# heap pages, 13-28 ms a search (BENCHMARKS.md, "A million memories, quiet").
#
# The same discipline as search_terms (0006): a statement-level trigger
# applies each statement's net change per pair as one upsert in key order,
# so concurrent writers lock rows in the same order and cannot deadlock. An
# update changes the counts only when the user, namespace, model, metadata
# or whether it expires changes. It runs as recall_search; the tenant path
# (recall_app) reads its own user's rows and writes none, an agent's
# transaction has no privilege at all (the pairs describe every agent's
# memories), and the operator path sees every row.
PAIR_MAX = 256

COUNTS = """
CREATE TABLE search_metadata (
    user_id uuid NOT NULL,
    namespace varchar(64) NOT NULL,
    embedding_model varchar(100) NOT NULL,
    pair text NOT NULL,
    memories integer NOT NULL,
    PRIMARY KEY (user_id, namespace, embedding_model, pair)
) WITH (fillfactor = 80);
ALTER TABLE search_metadata ENABLE ROW LEVEL SECURITY;
ALTER TABLE search_metadata FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON search_metadata FOR SELECT TO recall_app
    USING (user_id = recall_current_user_id());
CREATE POLICY operator_access ON search_metadata FOR ALL TO recall_operator
    USING (current_user = 'recall_operator') WITH CHECK (current_user = 'recall_operator');
CREATE POLICY search_access ON search_metadata FOR ALL TO recall_search
    USING (true) WITH CHECK (true);
GRANT SELECT ON search_metadata TO recall_app;
GRANT SELECT, INSERT, UPDATE, DELETE ON search_metadata TO recall_search;

-- A metadata object's top-level pairs, each as a one-key object written as
-- jsonb writes it; nothing for anything but an object.
CREATE FUNCTION recall_metadata_pairs(p_metadata jsonb) RETURNS SETOF text
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
    AS $$
    SELECT jsonb_build_object(e.key, e.value)::text
      FROM jsonb_each(CASE WHEN jsonb_typeof(p_metadata) = 'object' THEN p_metadata END) AS e
     WHERE octet_length(e.key) + octet_length(e.value::text) <= PAIR_MAX
    $$;

CREATE FUNCTION search_metadata_follow_memories() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path = pg_catalog, public
    AS $$
DECLARE
    users uuid[];
    spaces text[];
    models text[];
    metadatas jsonb[];
    signs integer[];
BEGIN
    -- An INSERT trigger has no old table and a DELETE trigger no new one, so
    -- each branch only names the tables it has.
    IF TG_OP = 'INSERT' THEN
        SELECT array_agg(user_id), array_agg(namespace::text), array_agg(embedding_model::text),
               array_agg(metadata), array_agg(1)
          INTO users, spaces, models, metadatas, signs
          FROM new_memories
         WHERE expires_at IS NULL AND metadata <> '{}';
    ELSIF TG_OP = 'DELETE' THEN
        SELECT array_agg(user_id), array_agg(namespace::text), array_agg(embedding_model::text),
               array_agg(metadata), array_agg(-1)
          INTO users, spaces, models, metadatas, signs
          FROM old_memories
         WHERE expires_at IS NULL AND metadata <> '{}';
    ELSE
        SELECT array_agg(c.user_id), array_agg(c.namespace), array_agg(c.model),
               array_agg(c.metadata), array_agg(c.sign)
          INTO users, spaces, models, metadatas, signs
          FROM new_memories n
          JOIN old_memories o ON o.id = n.id
         CROSS JOIN LATERAL (
               VALUES (n.user_id, n.namespace::text, n.embedding_model::text, n.metadata,
                       n.expires_at IS NULL, 1),
                      (o.user_id, o.namespace::text, o.embedding_model::text, o.metadata,
                       o.expires_at IS NULL, -1)
         ) AS c(user_id, namespace, model, metadata, counted, sign)
         WHERE c.counted AND c.metadata <> '{}'
           AND (n.user_id, n.namespace, n.embedding_model, n.metadata, n.expires_at IS NULL)
               IS DISTINCT FROM
               (o.user_id, o.namespace, o.embedding_model, o.metadata, o.expires_at IS NULL);
    END IF;
    IF users IS NULL THEN
        RETURN NULL;
    END IF;

    INSERT INTO search_metadata AS s (user_id, namespace, embedding_model, pair, memories)
    SELECT c.user_id, c.namespace, c.model, p.pair, sum(c.sign)
      FROM unnest(users, spaces, models, metadatas, signs)
           AS c(user_id, namespace, model, metadata, sign)
     CROSS JOIN LATERAL recall_metadata_pairs(c.metadata) AS p(pair)
     GROUP BY c.user_id, c.namespace, c.model, p.pair
    HAVING sum(c.sign) <> 0
     ORDER BY c.user_id, c.namespace, c.model, p.pair
    ON CONFLICT (user_id, namespace, embedding_model, pair)
        DO UPDATE SET memories = s.memories + excluded.memories;

    IF TG_OP <> 'INSERT' THEN
        DELETE FROM search_metadata s
         USING (SELECT DISTINCT c.user_id, c.namespace, c.model, p.pair
                  FROM unnest(users, spaces, models, metadatas, signs)
                       AS c(user_id, namespace, model, metadata, sign)
                 CROSS JOIN LATERAL recall_metadata_pairs(c.metadata) AS p(pair)
                 WHERE c.sign < 0) AS gone
         WHERE s.user_id = gone.user_id AND s.namespace = gone.namespace
           AND s.embedding_model = gone.model AND s.pair = gone.pair AND s.memories <= 0;
    END IF;
    RETURN NULL;
END
$$;
FOLLOW_MEMORIES
-- The hand-over, as for the search triggers (0006).
GRANT recall_search TO CURRENT_USER;
GRANT CREATE ON SCHEMA public TO recall_search;
ALTER FUNCTION search_metadata_follow_memories() OWNER TO recall_search;
REVOKE CREATE ON SCHEMA public FROM recall_search;
REVOKE recall_search FROM CURRENT_USER;

-- The memories already stored. Creating the triggers took a lock that holds
-- off every writer of memories until this migration commits, so each memory
-- is counted here or by the triggers, never both and never neither.
SET LOCAL ROLE recall_operator;
INSERT INTO search_metadata (user_id, namespace, embedding_model, pair, memories)
SELECT m.user_id, m.namespace, m.embedding_model, p.pair, count(*)
  FROM memories m
 CROSS JOIN LATERAL recall_metadata_pairs(m.metadata) AS p(pair)
 WHERE m.expires_at IS NULL
 GROUP BY m.user_id, m.namespace, m.embedding_model, p.pair;
RESET ROLE;
""".replace("PAIR_MAX", str(PAIR_MAX)).replace(
    "FOLLOW_MEMORIES\n", _index.follow_memories("search_metadata", "search_metadata")
)

COUNTS_REVERSE = _index.unfollow_memories("search_metadata") + (
    "DROP FUNCTION IF EXISTS recall_metadata_pairs(jsonb);\nDROP TABLE IF EXISTS search_metadata;\n"
)


class Migration(migrations.Migration):
    dependencies = [("memories", "0012_filtered_nearest")]

    operations = [migrations.RunSQL(COUNTS, COUNTS_REVERSE)]
