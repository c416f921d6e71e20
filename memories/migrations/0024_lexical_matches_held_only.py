from importlib import import_module

from django.db import migrations

_index = import_module("memories.migrations.0006_search_index")
_held = import_module("memories.migrations.0020_rank_held_memories_only")

# Guarantee: a memory the search leaves out (replaced, or not yet held at
# as_of) takes none of the lexical side's places.
#
# 0020 made recall_rank() drop such memories from its lexical candidates,
# but only after recall_lexical_matches() had chosen them: its pool of 50
# best BM25 matches was cut before anyone asked whether a match was still
# held. A fact restated 50 times (a weekly status, a sprint goal) filled the
# pool with its replaced versions, and its current one, or any other memory
# with those words, could be left without its lexical score. The matches
# now hold the same rule (p_as_of, p_current, as Filters.held() and
# recall_rank() do), checked by primary key in the one look-up into
# memories that the filters already made. With no rule to apply (an
# include_superseded search with no filter, or a tenant that has replaced
# nothing) no memory is read per match, as before.
#
# A new form beside the old: the 13-argument one stays for servers of the
# previous release, whose recall_rank() is the one replaced here anyway
# (no server calls recall_lexical_matches() itself).
SIGNATURE = _index.LEXICAL_SIGNATURE + ", timestamptz, boolean"
_START = _index.LEXICAL_MATCHES.index("CREATE FUNCTION recall_lexical_matches(")
_END = _index.LEXICAL_MATCHES.index("REVOKE ALL ON FUNCTION recall_lexical_matches")
_NO_RULE = "(p_metadata IS NULL AND p_priorities IS NULL AND p_sources IS NULL)"
# Whether the current-only rule can leave anything out: the caller has a
# replaced memory at all. Asked once per call (the partial index of 0016
# holds replaced memories only), so a tenant that never replaced one reads
# no memory here, as before.
_REPLACED_ANY = (
    "(p_current AND EXISTS (SELECT 1 FROM memories r"
    " WHERE r.user_id = recall_current_user_id() AND r.superseded_by IS NOT NULL))"
)
_CHECK = f"""
            SELECT 1 FROM memories m
             WHERE m.id = d.memory_id AND m.user_id = recall_current_user_id()
               AND {_index.admits("m")}))"""
MATCHES = (
    _index.LEXICAL_MATCHES[_START:_END]
    .replace(
        "p_priorities text[], p_sources jsonb\n)",
        "p_priorities text[], p_sources jsonb, p_as_of timestamptz, p_current boolean\n)",
    )
    .replace(_NO_RULE, _NO_RULE[:-1] + f" AND p_as_of IS NULL AND NOT {_REPLACED_ANY})")
    .replace(_CHECK, _CHECK[:-2] + f"\n               AND {_held._held('m')}))")
)
assert MATCHES.count("p_current") == 3 and MATCHES.count(_held._held("m")) == 1, (
    "0006's recall_lexical_matches() changed under this migration"
)
# As 0009 and 0011 set on the first form: the GIN index by bitmap scans
# only, and an estimate of the pool's size, not a thousand rows.
MATCHES += f"""
ALTER FUNCTION recall_lexical_matches({SIGNATURE}) SET enable_indexscan = off;
ALTER FUNCTION recall_lexical_matches({SIGNATURE}) SET enable_indexonlyscan = off;
ALTER FUNCTION recall_lexical_matches({SIGNATURE}) ROWS 50;
REVOKE ALL ON FUNCTION recall_lexical_matches({SIGNATURE}) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION recall_lexical_matches({SIGNATURE}) TO recall_app, recall_agent;
GRANT recall_search TO CURRENT_USER;
GRANT CREATE ON SCHEMA public TO recall_search;
ALTER FUNCTION recall_lexical_matches({SIGNATURE}) OWNER TO recall_search;
REVOKE CREATE ON SCHEMA public FROM recall_search;
REVOKE recall_search FROM CURRENT_USER;
"""
_CALL = "p_created_after, p_created_before, p_metadata, p_priorities, p_sources) AS f"
assert _held.RANK.count(_CALL) == 1, "0020's recall_rank() changed under this migration"
RANK = _held.RANK.replace(_CALL, _CALL[: -len(") AS f")] + ",\n                   p_as_of, p_current) AS f")
DROP_RANK = f"DROP FUNCTION IF EXISTS recall_rank({_held.SIGNATURE});"
DROP_MATCHES = f"DROP FUNCTION IF EXISTS recall_lexical_matches({SIGNATURE});"


class Migration(migrations.Migration):
    dependencies = [("memories", "0023_job_failures")]

    operations = [
        migrations.RunSQL(
            MATCHES + DROP_RANK + RANK,
            DROP_RANK + _held.RANK + DROP_MATCHES,
        ),
    ]
