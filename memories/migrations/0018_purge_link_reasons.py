from django.db import migrations

# Guarantee: forget(purge=true) leaves nothing of a purged memory's text in
# the history. A link's decision, recorded on the other memory of the pair
# (its `superseded` row, or the `created` row of the memory that replaced
# it), explains itself with both memories' values ("phone 01632 960555 ->
# 07700 900777", a chat model's own words). Purging one memory of a linked
# pair now also withholds the reason of every history row that names it
# (superseded_by, replaces): who decided, the score and the model stay. The
# same rows as the deletion may touch: the caller's user, and an agent's own
# rows only.
PURGE = """
CREATE OR REPLACE FUNCTION recall_purge_history(ids uuid[]) RETURNS bigint
    LANGUAGE sql VOLATILE SECURITY DEFINER SET search_path = public
    AS $$
        WITH withheld AS (
            UPDATE memory_history h
               SET decision = h.decision || '{"reason": "withheld: a memory it named was purged"}'
             WHERE h.user_id = recall_current_user_id()
               AND (recall_current_agent_id() IS NULL OR h.agent_id = recall_current_agent_id())
               AND h.decision ? 'reason'
               AND (h.superseded_by = ANY (ids) OR h.replaces && ids)
               AND NOT h.memory_id = ANY (ids)
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
