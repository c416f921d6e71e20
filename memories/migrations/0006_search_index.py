from django.db import migrations

# The lexical index lives beside `memories`, not in it: adding a column there
# and filling it would rewrite every row, and every rewritten row is inserted
# into the HNSW graph again (hours on a large table). These tables are
# derived data, kept in step by the triggers below in the writer's own
# transaction, so no code path can forget them. See memories/search.py.

# Guarantees: the text a memory is matched on is its content plus the string
# values of its metadata, analysed by PostgreSQL's English configuration
# (stop words dropped, words stemmed; numbers, e-mail addresses, hosts, paths
# and version strings kept whole). Queries go through recall_search_text()
# too. A hyphen before a digit separates: PostgreSQL's parser would read
# "CVE-2021-44228" or "2023-05-08" as signed numbers ("-44228", "-05") that
# no query for "44228" or "05" could match.
ANALYSER = """
CREATE FUNCTION recall_search_text(value text) RETURNS text
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$ SELECT regexp_replace(value, '([[:alnum:]])-(?=[[:digit:]])', '\\1 ', 'g') $$;
CREATE FUNCTION recall_search_vector(content text, metadata jsonb) RETURNS tsvector
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$ SELECT to_tsvector('pg_catalog.english', recall_search_text(content))
               || to_tsvector('pg_catalog.english', recall_search_text(
                      coalesce((SELECT string_agg(v, ' ') FROM jsonb_path_query(
                          metadata, 'strict $.**') AS j(x),
                          LATERAL (SELECT x #>> '{}' AS v WHERE jsonb_typeof(x) = 'string') AS s),
                      ''))) $$;
-- The keys a search document is indexed under: each lexeme prefixed with a
-- short hash of its user and namespace. A word's postings are then one
-- namespace's, however many tenants use the word; a hash shared by two
-- namespaces only costs a few extra rows, which the scan's own user and
-- namespace conditions drop.
CREATE FUNCTION recall_search_keys(p_user uuid, p_namespace text, p_lexemes text[]) RETURNS text[]
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$ SELECT coalesce(array_agg(k.prefix || l), '{}')
            FROM (SELECT left(md5(p_user::text || '/' || p_namespace), 8) || ':' AS prefix) AS k,
                 unnest(p_lexemes) AS l $$;
"""

ANALYSER_REVERSE = """
DROP FUNCTION IF EXISTS recall_search_keys(uuid, text, text[]);
DROP FUNCTION IF EXISTS recall_search_vector(text, jsonb);
DROP FUNCTION IF EXISTS recall_search_text(text);
"""

# Guarantees: one search_documents row per memory, with its lexemes and their
# positions (term frequencies) and its length in tokens; per user and
# namespace, how many documents hold each lexeme (search_terms) and how many
# documents there are and how long they are together (search_namespaces).
# These are BM25's statistics. The GIN index holds each document's lexemes
# keyed by user and namespace (recall_search_keys), so looking a word up reads
# one namespace's postings only. (A composite btree_gin index on user,
# namespace and the tsvector did that too, at ten times the cost per search:
# every lookup walked the user's and the namespace's posting trees, each as
# long as the namespace.)
TABLES = """
CREATE TABLE search_documents (
    memory_id uuid PRIMARY KEY,
    user_id uuid NOT NULL,
    namespace varchar(64) NOT NULL,
    created_at timestamptz NOT NULL,
    -- What decides who may read the memory and until when, copied so the
    -- lexical scan can apply it without visiting memories.
    agent_id uuid,
    task_id varchar(200),
    expires_at timestamptz,
    vector tsvector NOT NULL,
    length integer NOT NULL
);
-- A long memory's vector is compressed in its row rather than moved to the
-- TOAST table, so scoring a candidate reads one page, not two.
ALTER TABLE search_documents ALTER COLUMN vector SET STORAGE MAIN;
CREATE INDEX search_documents_match ON search_documents
    USING gin (recall_search_keys(user_id, namespace, tsvector_to_array(vector)));
CREATE TABLE search_terms (
    user_id uuid NOT NULL,
    namespace varchar(64) NOT NULL,
    lexeme text NOT NULL,
    documents integer NOT NULL,
    PRIMARY KEY (user_id, namespace, lexeme)
) WITH (fillfactor = 80);
CREATE TABLE search_namespaces (
    user_id uuid NOT NULL,
    namespace varchar(64) NOT NULL,
    documents bigint NOT NULL,
    length bigint NOT NULL,
    PRIMARY KEY (user_id, namespace)
) WITH (fillfactor = 80);
"""

TABLES_REVERSE = """
DROP TABLE IF EXISTS search_namespaces;
DROP TABLE IF EXISTS search_terms;
DROP TABLE IF EXISTS search_documents;
"""

# Guarantees: the three tables are under forced row-level security: the
# user-wide tenant path (recall_app) reads only its own user's rows and
# writes none (the triggers write, as recall_search); an agent's transaction
# (recall_agent) has no privilege on them at all, since they describe every
# agent's memories: it searches only through recall_lexical_matches() and
# recall_rank(), which apply memories' agent rule themselves. The operator
# path sees every row, and no context nothing, the owner included (FORCE).
RLS = """
DO $$
DECLARE t text;
BEGIN
    FOREACH t IN ARRAY ARRAY['search_documents', 'search_terms', 'search_namespaces'] LOOP
        EXECUTE format('ALTER TABLE %I ENABLE ROW LEVEL SECURITY', t);
        EXECUTE format('ALTER TABLE %I FORCE ROW LEVEL SECURITY', t);
        EXECUTE format('CREATE POLICY tenant_isolation ON %I FOR SELECT TO recall_app'
                       ' USING (user_id = recall_current_user_id())', t);
        EXECUTE format('CREATE POLICY operator_access ON %I FOR ALL TO recall_operator'
                       ' USING (current_user = ''recall_operator'')'
                       ' WITH CHECK (current_user = ''recall_operator'')', t);
        EXECUTE format('GRANT SELECT ON %I TO recall_app', t);
    END LOOP;
END
$$;
"""

RLS_REVERSE = """
DO $$
DECLARE t text;
BEGIN
    FOREACH t IN ARRAY ARRAY['search_documents', 'search_terms', 'search_namespaces'] LOOP
        EXECUTE format('REVOKE ALL ON %I FROM recall_app', t);
        EXECUTE format('DROP POLICY IF EXISTS operator_access ON %I', t);
        EXECUTE format('DROP POLICY IF EXISTS tenant_isolation ON %I', t);
    END LOOP;
END
$$;
"""

def follow_memories(prefix: str, tables: str) -> str:
    """The triggers through which ``{prefix}_follow_memories()`` sees every write of
    memories (statement-level, with the transition tables each event has), and a
    ``{prefix}_truncate()`` that empties ``tables`` when memories is truncated."""
    events = (
        ("insert", "NEW TABLE AS new_memories"),
        ("update", "OLD TABLE AS old_memories NEW TABLE AS new_memories"),
        ("delete", "OLD TABLE AS old_memories"),
    )
    triggers = "".join(
        f"CREATE TRIGGER {prefix}_{event} AFTER {event.upper()} ON memories\n"
        f"    REFERENCING {transitions}\n"
        f"    FOR EACH STATEMENT EXECUTE FUNCTION {prefix}_follow_memories();\n"
        for event, transitions in events
    )
    return f"""{triggers}
CREATE FUNCTION {prefix}_truncate() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path = pg_catalog, public
    AS $$
BEGIN
    TRUNCATE {tables};
    RETURN NULL;
END
$$;
CREATE TRIGGER {prefix}_truncate AFTER TRUNCATE ON memories
    FOR EACH STATEMENT EXECUTE FUNCTION {prefix}_truncate();
"""


def unfollow_memories(prefix: str) -> str:
    """Drop what ``follow_memories(prefix, ...)`` created, and the follower itself."""
    triggers = "".join(
        f"DROP TRIGGER IF EXISTS {prefix}_{event} ON memories;\n"
        for event in ("truncate", "delete", "update", "insert")
    )
    return (
        f"{triggers}DROP FUNCTION IF EXISTS {prefix}_truncate();\n"
        f"DROP FUNCTION IF EXISTS {prefix}_follow_memories();\n"
    )



# Guarantees: whoever writes `memories` (a tenant, an agent, the operator, a
# bulk load) writes its search document in the same statement: inserted with
# the memory, rewritten when its content, metadata, namespace or creation
# time changes (not when only its vector does), its agent, task and expiry
# kept equal to the memory's, deleted with it (a purge included: nothing of
# the content stays in the search tables). Statement-level, so a bulk write
# analyses its rows in one pass. TRUNCATE empties the derived tables too.
# The trigger function runs as recall_search (see below), so neither tenant
# role needs any privilege on the search tables.
DOCUMENT_TRIGGERS = """
CREATE FUNCTION search_documents_follow_memories() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path = pg_catalog, public
    AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO search_documents (memory_id, user_id, namespace, created_at, agent_id, task_id,
                                      expires_at, vector, length)
        SELECT n.id, n.user_id, n.namespace, n.created_at, n.agent_id, n.task_id, n.expires_at,
               a.vector,
               (SELECT coalesce(sum(cardinality(positions)), 0) FROM unnest(a.vector))
          FROM new_memories n
         CROSS JOIN LATERAL recall_search_vector(n.content, n.metadata) AS a(vector)
         ORDER BY n.id;
    ELSIF TG_OP = 'UPDATE' THEN
        UPDATE search_documents d
           SET user_id = c.user_id, namespace = c.namespace, created_at = c.created_at,
               vector = c.vector,
               length = (SELECT coalesce(sum(cardinality(positions)), 0) FROM unnest(c.vector))
          FROM (
            SELECT n.id, n.user_id, n.namespace, n.created_at,
                   recall_search_vector(n.content, n.metadata) AS vector
              FROM new_memories n JOIN old_memories o ON o.id = n.id
             WHERE (n.content, n.metadata, n.namespace, n.user_id, n.created_at)
                   IS DISTINCT FROM (o.content, o.metadata, o.namespace, o.user_id, o.created_at)
          ) AS c
         WHERE d.memory_id = c.id;
        -- Who may read it and until when: no new analysis, and the
        -- statistics trigger sees no change of words.
        UPDATE search_documents d
           SET agent_id = n.agent_id, task_id = n.task_id, expires_at = n.expires_at
          FROM new_memories n
         WHERE d.memory_id = n.id
           AND (d.agent_id, d.task_id, d.expires_at)
               IS DISTINCT FROM (n.agent_id, n.task_id, n.expires_at);
    ELSE
        DELETE FROM search_documents d USING old_memories o WHERE d.memory_id = o.id;
    END IF;
    RETURN NULL;
END
$$;
FOLLOW_MEMORIES
"""

DOCUMENT_TRIGGERS = DOCUMENT_TRIGGERS.replace(
    "FOLLOW_MEMORIES\n",
    follow_memories("search_documents", "search_documents, search_terms, search_namespaces"),
)
DOCUMENT_TRIGGERS_REVERSE = unfollow_memories("search_documents")

# Guarantees: search_terms and search_namespaces always count exactly the
# search documents committed with them, whatever wrote the documents (the
# triggers above or the backfill). Each statement applies its net change per
# (user, namespace, lexeme) as one upsert in key order, then the namespace
# total, so concurrent writers lock rows in the same order and cannot
# deadlock; counts that reach zero are deleted.
STATISTICS_TRIGGERS = """
CREATE FUNCTION search_statistics_follow_documents() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path = pg_catalog, public
    AS $$
DECLARE
    users uuid[] := '{}';
    spaces text[] := '{}';
    vectors tsvector[] := '{}';
    lengths integer[] := '{}';
    signs integer[] := '{}';
BEGIN
    -- An INSERT trigger has no old table and a DELETE trigger no new one, so
    -- each branch only names the table it has.
    IF TG_OP IN ('INSERT', 'UPDATE') THEN
        SELECT users || array_agg(user_id), spaces || array_agg(namespace::text),
               vectors || array_agg(vector), lengths || array_agg(length),
               signs || array_agg(1)
          INTO users, spaces, vectors, lengths, signs
          FROM new_documents;
    END IF;
    IF TG_OP IN ('DELETE', 'UPDATE') THEN
        SELECT users || array_agg(user_id), spaces || array_agg(namespace::text),
               vectors || array_agg(vector), lengths || array_agg(length),
               signs || array_agg(-1)
          INTO users, spaces, vectors, lengths, signs
          FROM old_documents;
    END IF;
    IF cardinality(users) = 0 THEN
        RETURN NULL;
    END IF;

    INSERT INTO search_terms AS t (user_id, namespace, lexeme, documents)
    SELECT c.user_id, c.namespace, v.lexeme, sum(c.sign)
      FROM unnest(users, spaces, vectors, signs) AS c(user_id, namespace, vector, sign)
     CROSS JOIN LATERAL unnest(c.vector) AS v
     GROUP BY c.user_id, c.namespace, v.lexeme
    HAVING sum(c.sign) <> 0
     ORDER BY c.user_id, c.namespace, v.lexeme
    ON CONFLICT (user_id, namespace, lexeme)
        DO UPDATE SET documents = t.documents + excluded.documents;

    INSERT INTO search_namespaces AS s (user_id, namespace, documents, length)
    SELECT c.user_id, c.namespace, sum(c.sign), sum(c.sign * c.length)
      FROM unnest(users, spaces, lengths, signs) AS c(user_id, namespace, length, sign)
     GROUP BY c.user_id, c.namespace
    HAVING sum(c.sign) <> 0 OR sum(c.sign * c.length) <> 0
     ORDER BY c.user_id, c.namespace
    ON CONFLICT (user_id, namespace)
        DO UPDATE SET documents = s.documents + excluded.documents,
                      length = s.length + excluded.length;

    IF TG_OP IN ('DELETE', 'UPDATE') THEN
        DELETE FROM search_terms t
         USING (SELECT DISTINCT c.user_id, c.namespace, v.lexeme
                  FROM unnest(users, spaces, vectors, signs) AS c(user_id, namespace, vector, sign)
                 CROSS JOIN LATERAL unnest(c.vector) AS v
                 WHERE c.sign < 0) AS gone
         WHERE t.user_id = gone.user_id AND t.namespace = gone.namespace
           AND t.lexeme = gone.lexeme AND t.documents <= 0;
        DELETE FROM search_namespaces s
         USING (SELECT DISTINCT c.user_id, c.namespace
                  FROM unnest(users, spaces, signs) AS c(user_id, namespace, sign)
                 WHERE c.sign < 0) AS gone
         WHERE s.user_id = gone.user_id AND s.namespace = gone.namespace AND s.documents <= 0;
    END IF;
    RETURN NULL;
END
$$;
CREATE TRIGGER search_statistics_insert AFTER INSERT ON search_documents
    REFERENCING NEW TABLE AS new_documents
    FOR EACH STATEMENT EXECUTE FUNCTION search_statistics_follow_documents();
CREATE TRIGGER search_statistics_update AFTER UPDATE ON search_documents
    REFERENCING OLD TABLE AS old_documents NEW TABLE AS new_documents
    FOR EACH STATEMENT EXECUTE FUNCTION search_statistics_follow_documents();
CREATE TRIGGER search_statistics_delete AFTER DELETE ON search_documents
    REFERENCING OLD TABLE AS old_documents
    FOR EACH STATEMENT EXECUTE FUNCTION search_statistics_follow_documents();
"""

STATISTICS_TRIGGERS_REVERSE = """
DROP TRIGGER IF EXISTS search_statistics_delete ON search_documents;
DROP TRIGGER IF EXISTS search_statistics_update ON search_documents;
DROP TRIGGER IF EXISTS search_statistics_insert ON search_documents;
DROP FUNCTION IF EXISTS search_statistics_follow_documents();
"""

# Guarantees: the lexical index can be searched through its GIN index while
# row-level security stays forced, and no tenant can read another's rows.
#
# `&&` on the keys (like `@@` on a tsvector) is not leakproof, so behind a
# policy qual the planner will not use it as an index condition.
# recall_lexical_matches() runs as recall_search, a NOLOGIN role whose own
# policy is `USING (true)`, so nothing stands between the scan and the index. Isolation stays
# in the database: the function reads the tenant only from
# recall_current_user_id() (the transaction's setting, never an argument),
# applies memories' agent rule and expiry itself (visible() below), pins
# search_path, returns ids and scores only, and only the tenant roles may
# call it; callers join those ids back to `memories` under their own policy,
# so even a wrong id could never surface a row. The same
# pattern (a definer function owned by recall_search) serves any index that
# a policy would otherwise hide, such as the metadata GIN index.
# What memories' agent rule and expiry say a search document's memory is to
# the transaction: on the user-wide path (no agent set) every one of the
# user's; acting as an agent, its own and those filed under the task it
# names; never an expired one. The same rule as the policies on memories
# (migration 0004), applied here because definer functions stand outside them.
def visible(alias: str) -> str:
    return (
        f"coalesce((recall_current_agent_id() IS NULL"
        f" OR {alias}.agent_id = recall_current_agent_id()"
        f" OR {alias}.task_id = recall_current_task_id())"
        f" AND ({alias}.expires_at IS NULL OR {alias}.expires_at > statement_timestamp()), false)"
    )


# The filters a search may add on a memory's own columns (metadata_filter,
# priority, memory_search's source filters), each absent when NULL.
def admits(alias: str) -> str:
    sources = " AND ".join(
        f"(p_sources->>'{column}' IS NULL OR {alias}.{column} = p_sources->>'{column}')"
        for column in ("source_kind", "author", "path", "thread_id", "task_id")
    )
    return (
        f"(p_metadata IS NULL OR {alias}.metadata @> p_metadata)"
        f" AND (p_priorities IS NULL OR {alias}.priority = ANY(p_priorities))"
        f" AND (p_sources IS NULL OR ({sources}))"
    )


LEXICAL_SIGNATURE = (
    "text, text[], text[], float8[], float8, float8, float8, integer,"
    " timestamptz, timestamptz, jsonb, text[], jsonb"
)

LEXICAL_MATCHES = """
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'recall_search') THEN
        CREATE ROLE recall_search NOLOGIN NOBYPASSRLS NOINHERIT;
    END IF;
END
$$;
GRANT USAGE ON SCHEMA public TO recall_search;
DO $$
DECLARE t text;
BEGIN
    FOREACH t IN ARRAY ARRAY['search_documents', 'search_terms', 'search_namespaces'] LOOP
        EXECUTE format('GRANT SELECT, INSERT, UPDATE, DELETE ON %I TO recall_search', t);
        EXECUTE format('CREATE POLICY search_access ON %I FOR ALL TO recall_search'
                       ' USING (true) WITH CHECK (true)', t);
    END LOOP;
END
$$;
GRANT SELECT (id, user_id, agent_id, namespace, source_kind, author, path, thread_id, task_id,
              embedding, embedding_model, metadata, priority, expires_at, created_at)
    ON memories TO recall_search;
CREATE POLICY search_access ON memories FOR SELECT TO recall_search USING (true);

-- The documents of the caller's namespace that hold any lexeme of p_rare and
-- that the caller may read, filtered, with their BM25 score over p_lexemes
-- (weights p_idf), best first.
CREATE FUNCTION recall_lexical_matches(
    p_namespace text, p_rare text[], p_lexemes text[], p_idf float8[],
    p_average_length float8, p_k1 float8, p_b float8, p_limit integer,
    p_created_after timestamptz, p_created_before timestamptz, p_metadata jsonb,
    p_priorities text[], p_sources jsonb
) RETURNS TABLE (memory_id uuid, score float8)
    LANGUAGE sql STABLE SECURITY DEFINER
    SET search_path = pg_catalog, public
    -- Whoever calls it, and whatever its plan was first made for (a table of
    -- a few rows, say), the lookup goes through the index.
    SET enable_seqscan = off
    AS $$
    SELECT d.memory_id,
           sum(p_idf[array_position(p_lexemes, v.lexeme)] * cardinality(v.positions) * (p_k1 + 1)
               / (cardinality(v.positions)
                  + p_k1 * (1 - p_b + p_b * d.length / p_average_length))) AS score
      FROM search_documents d
     CROSS JOIN LATERAL unnest(ts_filter(setweight(d.vector, 'A', p_lexemes), '{a}')) AS v
     WHERE recall_search_keys(d.user_id, d.namespace, tsvector_to_array(d.vector))
           && recall_search_keys(recall_current_user_id(), p_namespace, p_rare)
       AND d.user_id = recall_current_user_id()
       AND d.namespace = p_namespace
       AND VISIBLE_D
       AND (p_created_after IS NULL OR d.created_at >= p_created_after)
       AND (p_created_before IS NULL OR d.created_at < p_created_before)
       AND ((p_metadata IS NULL AND p_priorities IS NULL AND p_sources IS NULL) OR EXISTS (
            SELECT 1 FROM memories m
             WHERE m.id = d.memory_id AND m.user_id = recall_current_user_id()
               AND ADMITS_M))
     GROUP BY d.memory_id
     ORDER BY score DESC, d.memory_id
     LIMIT p_limit
    $$;
REVOKE ALL ON FUNCTION recall_lexical_matches(SIGNATURE) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION recall_lexical_matches(SIGNATURE) TO recall_app, recall_agent;
-- Handing the function over needs membership of recall_search and its CREATE
-- on the schema, both only for the hand-over: a member that kept inheriting
-- recall_search would fall under its USING (true) policies, and the owner
-- role must stay bound by row-level security like everyone else.
GRANT recall_search TO CURRENT_USER;
GRANT CREATE ON SCHEMA public TO recall_search;
ALTER FUNCTION recall_lexical_matches(SIGNATURE) OWNER TO recall_search;
ALTER FUNCTION search_documents_follow_memories() OWNER TO recall_search;
REVOKE CREATE ON SCHEMA public FROM recall_search;
REVOKE recall_search FROM CURRENT_USER;
"""

# The role is cluster-wide and another database may still use it.
LEXICAL_MATCHES_REVERSE = """
DROP FUNCTION IF EXISTS recall_lexical_matches(SIGNATURE);
DROP POLICY IF EXISTS search_access ON memories;
REVOKE ALL ON memories FROM recall_search;
DROP POLICY IF EXISTS search_access ON search_documents;
DROP POLICY IF EXISTS search_access ON search_terms;
DROP POLICY IF EXISTS search_access ON search_namespaces;
REVOKE ALL ON search_documents, search_terms, search_namespaces FROM recall_search;
REVOKE USAGE ON SCHEMA public FROM recall_search;
DO $$
BEGIN
    DROP ROLE IF EXISTS recall_search;
EXCEPTION WHEN dependent_objects_still_exist THEN
    RAISE NOTICE 'recall_search is still used by another database; kept';
END
$$;
"""


LEXICAL_MATCHES = (
    LEXICAL_MATCHES.replace("VISIBLE_D", visible("d"))
    .replace("ADMITS_M", admits("m"))
    .replace("SIGNATURE", LEXICAL_SIGNATURE)
)
LEXICAL_MATCHES_REVERSE = LEXICAL_MATCHES_REVERSE.replace("SIGNATURE", LEXICAL_SIGNATURE)


class Migration(migrations.Migration):
    dependencies = [
        ("memories", "0005_lifecycle"),
        ("accounts", "0005_agents"),
    ]

    operations = [
        migrations.RunSQL(ANALYSER, ANALYSER_REVERSE),
        migrations.RunSQL(TABLES, TABLES_REVERSE),
        migrations.RunSQL(RLS, RLS_REVERSE),
        migrations.RunSQL(DOCUMENT_TRIGGERS, DOCUMENT_TRIGGERS_REVERSE),
        migrations.RunSQL(STATISTICS_TRIGGERS, STATISTICS_TRIGGERS_REVERSE),
        migrations.RunSQL(LEXICAL_MATCHES, LEXICAL_MATCHES_REVERSE),
    ]
