from django.db import migrations

# Guarantee: forget(purge=true) leaves nothing of a purged memory's text in
# the history. A link's decision, recorded on the other memory of the pair
# (its `superseded` row, or the `created` row of the memory that replaced
# it), explains itself with both memories' values ("phone 01632 960555 ->
# 07700 900777", a chat model's own words). Purging one memory of a linked
# pair now also withholds the reason of every history row that names it
# (superseded_by, replaces): who decided, the score and the model stay. The
# same rows as the deletion may touch: the caller's user, and an agent's own
# rows only; and only for memories that no longer exist, as the deletion. Two
# partial indexes find the rows that name other memories.
PURGE = """
CREATE INDEX memory_history_superseded_by_idx ON memory_history (user_id, superseded_by)
    WHERE superseded_by IS NOT NULL;
CREATE INDEX memory_history_replaces_idx ON memory_history (user_id)
    WHERE replaces IS NOT NULL;
CREATE OR REPLACE FUNCTION recall_purge_history(ids uuid[]) RETURNS bigint
    LANGUAGE sql VOLATILE SECURITY DEFINER SET search_path = public
    AS $$
        WITH purged AS (
            -- Only memories that no longer exist: a live one's links stay explained.
            SELECT coalesce(array_agg(i), '{}') AS ids FROM unnest(ids) AS i
             WHERE NOT EXISTS (SELECT 1 FROM memories m WHERE m.id = i)
        ), withheld AS (
            UPDATE memory_history h
               SET decision = h.decision || '{"reason": "withheld: a memory it named was purged"}'
              FROM purged
             WHERE h.user_id = recall_current_user_id()
               AND (recall_current_agent_id() IS NULL OR h.agent_id = recall_current_agent_id())
               AND h.decision ? 'reason'
               AND ((h.superseded_by IS NOT NULL AND h.superseded_by = ANY (purged.ids))
                    OR (h.replaces IS NOT NULL AND h.replaces && purged.ids))
               AND NOT h.memory_id = ANY (purged.ids)
            RETURNING 1
        ), gone AS (
            DELETE FROM memory_history h
            WHERE h.user_id = recall_current_user_id()
              AND (recall_current_agent_id() IS NULL OR h.agent_id = recall_current_agent_id())
              AND h.memory_id = ANY (ids)
              AND NOT EXISTS (SELECT 1 FROM memories m WHERE m.id = h.memory_id)
            RETURNING 1
        )
        SELECT count(*) FROM gone
    $$;
"""

PURGE_REVERSE = """
DROP INDEX IF EXISTS memory_history_replaces_idx;
DROP INDEX IF EXISTS memory_history_superseded_by_idx;
CREATE OR REPLACE FUNCTION recall_purge_history(ids uuid[]) RETURNS bigint
    LANGUAGE sql VOLATILE SECURITY DEFINER SET search_path = public
    AS $$
        WITH gone AS (
            DELETE FROM memory_history h
            WHERE h.user_id = recall_current_user_id()
              AND (recall_current_agent_id() IS NULL OR h.agent_id = recall_current_agent_id())
              AND h.memory_id = ANY (ids)
              AND NOT EXISTS (SELECT 1 FROM memories m WHERE m.id = h.memory_id)
            RETURNING 1
        )
        SELECT count(*) FROM gone
    $$;
"""


class Migration(migrations.Migration):
    dependencies = [("memories", "0017_search_generations")]

    operations = [migrations.RunSQL(PURGE, PURGE_REVERSE)]
