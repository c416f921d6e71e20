from importlib import import_module

from django.db import migrations

_index = import_module("memories.migrations.0006_search_index")

# Guarantees (the search result cache, memories/results.py): per user and
# namespace, search_generations holds a generation that changes, in the
# writer's own transaction, with every statement that inserts, updates (any
# column) or deletes a memory of that namespace; a memory that moves between
# namespaces changes both. Its values come from one sequence, so no value is
# ever given twice, even by a transaction that rolled back or a row deleted
# and made again: a generation read equal to one read before means no write
# of the namespace committed in between. A namespace that holds memories
# always has a row (the triggers make it, the fill below made the rows of
# the memories already stored); one without reads as 0. Deleting a user
# deletes its rows (a trigger on users: a key to users would stop the test
# suite's flush from truncating users); a statement that deletes memories
# only changes rows that exist, so it never makes one again.
#
# The lock order: a write takes its memory rows (the statement, or an
# explicit lock first, services/superseding.py), then this row, then the
# search statistics (0006, 0013). Statement triggers of one event fire in
# the order of their names: "search_bump_*" comes before "search_documents_*"
# and "search_metadata_*" on purpose. The statistics rows of a namespace are
# then only ever taken by a transaction that already holds its generation,
# so they add no lock cycle of their own; the other way round, an update of
# a memory's priority (generation alone) followed by a store (statistics,
# then generation) would deadlock with a concurrent store. Each statement
# takes its rows in (user, namespace) order.
#
# Row-level security as the other search tables: forced; the tenant path
# (recall_app) reads its own user's rows and writes none, an agent's
# transaction has no privilege (it reads its namespace's generation through
# recall_search_state(), like the statistics), the operator path sees every
# row. The trigger runs as recall_search.
#
# recall_search_state(namespace) returns the caller's generation of the
# namespace and the earliest expiry still to come among its memories (every
# agent's: what the caller may not see can still shape its ranking), read
# from search_documents through a partial index on the memories that expire.
# Being STABLE, it reads with the snapshot of the statement that calls it.
GENERATIONS = """
CREATE SEQUENCE search_generation_seq;
CREATE TABLE search_generations (
    user_id uuid NOT NULL,
    namespace varchar(64) NOT NULL,
    generation bigint NOT NULL,
    PRIMARY KEY (user_id, namespace)
) WITH (fillfactor = 70);
ALTER TABLE search_generations ENABLE ROW LEVEL SECURITY;
ALTER TABLE search_generations FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON search_generations FOR SELECT TO recall_app
    USING (user_id = recall_current_user_id());
CREATE POLICY operator_access ON search_generations FOR ALL TO recall_operator
    USING (current_user = 'recall_operator') WITH CHECK (current_user = 'recall_operator');
CREATE POLICY search_access ON search_generations FOR ALL TO recall_search
    USING (true) WITH CHECK (true);
GRANT SELECT ON search_generations TO recall_app;
GRANT SELECT, INSERT, UPDATE, DELETE ON search_generations TO recall_search;
GRANT USAGE ON SEQUENCE search_generation_seq TO recall_search;
CREATE INDEX search_documents_expiry ON search_documents (user_id, namespace, expires_at)
    WHERE expires_at IS NOT NULL;

CREATE FUNCTION search_bump_follow_memories() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path = pg_catalog, public
    AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO search_generations AS g (user_id, namespace, generation)
        SELECT c.user_id, c.namespace, nextval('search_generation_seq')
          FROM (SELECT DISTINCT user_id, namespace FROM new_memories) AS c
         ORDER BY c.user_id, c.namespace
        ON CONFLICT (user_id, namespace) DO UPDATE SET generation = excluded.generation;
    ELSIF TG_OP = 'UPDATE' THEN
        INSERT INTO search_generations AS g (user_id, namespace, generation)
        SELECT c.user_id, c.namespace, nextval('search_generation_seq')
          FROM (SELECT user_id, namespace FROM new_memories
                UNION SELECT user_id, namespace FROM old_memories) AS c
         ORDER BY c.user_id, c.namespace
        ON CONFLICT (user_id, namespace) DO UPDATE SET generation = excluded.generation;
    ELSE
        -- Only rows that exist: a deleted user's cascade must not make one again.
        INSERT INTO search_generations AS g (user_id, namespace, generation)
        SELECT c.user_id, c.namespace, nextval('search_generation_seq')
          FROM (SELECT DISTINCT user_id, namespace FROM old_memories) AS c
         WHERE EXISTS (SELECT 1 FROM search_generations e
                        WHERE e.user_id = c.user_id AND e.namespace = c.namespace)
         ORDER BY c.user_id, c.namespace
        ON CONFLICT (user_id, namespace) DO UPDATE SET generation = excluded.generation;
    END IF;
    RETURN NULL;
END
$$;
FOLLOW_MEMORIES
CREATE FUNCTION search_bump_forget_users() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path = pg_catalog, public
    AS $$
BEGIN
    DELETE FROM search_generations g USING old_users o WHERE g.user_id = o.id;
    RETURN NULL;
END
$$;
CREATE TRIGGER search_bump_forget_users AFTER DELETE ON users
    REFERENCING OLD TABLE AS old_users
    FOR EACH STATEMENT EXECUTE FUNCTION search_bump_forget_users();
CREATE FUNCTION recall_search_state(p_namespace text)
    RETURNS TABLE (generation bigint, next_expiry timestamptz)
    LANGUAGE sql STABLE SECURITY DEFINER
    SET search_path = pg_catalog, public
    AS $$
    SELECT coalesce((SELECT g.generation FROM search_generations g
                      WHERE g.user_id = recall_current_user_id()
                        AND g.namespace = p_namespace), 0),
           (SELECT min(d.expires_at) FROM search_documents d
             WHERE d.user_id = recall_current_user_id() AND d.namespace = p_namespace
               AND d.expires_at IS NOT NULL AND d.expires_at > statement_timestamp())
    $$;
REVOKE ALL ON FUNCTION recall_search_state(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION recall_search_state(text) TO recall_app, recall_agent;
-- The hand-over, as for the search triggers (0006).
GRANT recall_search TO CURRENT_USER;
GRANT CREATE ON SCHEMA public TO recall_search;
ALTER FUNCTION search_bump_follow_memories() OWNER TO recall_search;
ALTER FUNCTION search_bump_forget_users() OWNER TO recall_search;
ALTER FUNCTION recall_search_state(text) OWNER TO recall_search;
REVOKE CREATE ON SCHEMA public FROM recall_search;
REVOKE recall_search FROM CURRENT_USER;

-- The namespaces already written. Creating the triggers took a lock that
-- holds off every writer of memories until this migration commits.
SET LOCAL ROLE recall_operator;
INSERT INTO search_generations (user_id, namespace, generation)
SELECT user_id, namespace, nextval('search_generation_seq')
  FROM (SELECT DISTINCT user_id, namespace FROM memories) AS m;
RESET ROLE;
""".replace(
    "FOLLOW_MEMORIES\n", _index.follow_memories("search_bump", "search_generations")
)

GENERATIONS_REVERSE = _index.unfollow_memories("search_bump") + (
    "DROP TRIGGER IF EXISTS search_bump_forget_users ON users;\n"
    "DROP FUNCTION IF EXISTS search_bump_forget_users();\n"
    "DROP FUNCTION IF EXISTS recall_search_state(text);\n"
    "DROP INDEX IF EXISTS search_documents_expiry;\n"
    "DROP TABLE IF EXISTS search_generations;\n"
    "DROP SEQUENCE IF EXISTS search_generation_seq;\n"
)


class Migration(migrations.Migration):
    dependencies = [("memories", "0016_supersession")]

    operations = [migrations.RunSQL(GENERATIONS, GENERATIONS_REVERSE)]
