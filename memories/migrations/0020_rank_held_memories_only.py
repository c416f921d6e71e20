from importlib import import_module

from django.db import migrations

_absolute = import_module("memories.migrations.0015_absolute_score")

# Guarantee: a memory the search leaves out (replaced, or not yet held at
# as_of) takes no part in ranking the others.
#
# recall_rank() knew nothing of replacement: the dense candidates came in
# already filtered (search.py's nearest scan), but the lexical side's did
# not, and were dropped only after ranking. On the way a hidden memory could
# be one of the five best, and lift its neighbours by creation halfway to
# its own z: asked "When are Finn's swimming lessons?", the replaced
# "Finn's swimming lessons are on Saturday mornings" lifted "Finn is 9 years
# old", stored beside it, above the current "Swimming for Finn is Sunday
# afternoons". Now the lexical candidates and the neighbours' window hold
# only what the search may return: p_current leaves replaced memories out,
# p_as_of (exclusive) keeps those created before it and not yet replaced
# then, as memories/filters.py's Filters.held() does on the dense side.
# Everything else is 0015's, unchanged.


def _held(alias: str) -> str:
    return (
        f"(CASE WHEN p_as_of IS NOT NULL"
        f" THEN {alias}.created_at < p_as_of"
        f" AND ({alias}.superseded_at IS NULL OR {alias}.superseded_at >= p_as_of)"
        f" ELSE NOT p_current OR {alias}.superseded_by IS NULL END)"
    )


SIGNATURE = _absolute.SIGNATURE + ", timestamptz, boolean"
RANK = (
    _absolute.RANK.replace(_absolute.SIGNATURE, SIGNATURE)
    .replace(
        "p_providers integer, p_window integer, p_lift float8\n)",
        "p_providers integer, p_window integer, p_lift float8,\n"
        "    p_as_of timestamptz, p_current boolean\n)",
    )
    .replace("WHERE lx.id <> ALL (p_nearest)", f"WHERE lx.id <> ALL (p_nearest) AND {_held('m')}")
    .replace(
        "AND (m.created_at, m.id) < (p.created_at, p.id)",
        f"AND (m.created_at, m.id) < (p.created_at, p.id) AND {_held('m')}",
    )
    .replace(
        "AND (m.created_at, m.id) > (p.created_at, p.id)",
        # The bound on created_at too, outside the CASE, where the index's
        # scan can stop at it: past as_of no memory was held.
        "AND (m.created_at, m.id) > (p.created_at, p.id)"
        " AND m.created_at < coalesce(p_as_of, 'infinity'::timestamptz)"
        f" AND {_held('m')}",
    )
)
assert RANK.count(_held("m")) == 3, "0015's ranking changed under this migration"
DROP = "DROP FUNCTION IF EXISTS recall_rank(SIGNATURE);"
# The ranking's owner reads the columns it needs of memories, and no more (0006).
GRANT = "GRANT SELECT (superseded_by, superseded_at) ON memories TO recall_search;"
REVOKE = "REVOKE SELECT (superseded_by, superseded_at) ON memories FROM recall_search;"


class Migration(migrations.Migration):
    dependencies = [("memories", "0019_history_names_later_links")]

    operations = [
        migrations.RunSQL(
            GRANT + DROP.replace("SIGNATURE", _absolute.SIGNATURE) + RANK,
            DROP.replace("SIGNATURE", SIGNATURE) + _absolute.RANK + REVOKE,
        ),
    ]
