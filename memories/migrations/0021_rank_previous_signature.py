from importlib import import_module

from django.db import migrations

_absolute = import_module("memories.migrations.0015_absolute_score")
_held = import_module("memories.migrations.0020_rank_held_memories_only")

# Guarantee: app servers of the release before 0020 keep searching while a
# rolling upgrade replaces them.
#
# Each server migrates as it starts (under an advisory lock), so the first
# server of a new release to start runs 0020 while the others still run the
# old code. 0020 dropped recall_rank()'s 22-argument form for a 24-argument
# one, and every search of a server still calling the old form failed until
# that server was restarted. The old form is back, as a plain wrapper of the
# new one that ranks as 0015 did (no as_of, replaced memories included):
# those servers drop what they must not show after ranking, as they always
# did. It runs with its caller's rights: the new form it calls is the
# security definer, granted to the same roles. A release after the next may
# drop it, once no server of the 0015-0019 releases can remain.
_ARGUMENTS = ", ".join(f"${n}" for n in range(1, 23))
assert _absolute.SIGNATURE.count(",") == 21, "0015's signature changed under this migration"
WRAPPER = f"""
CREATE FUNCTION recall_rank({_absolute.SIGNATURE})
    RETURNS TABLE (id uuid, similarity float8, coverage float8, score float8, rank float8)
    LANGUAGE sql STABLE
    SET search_path = pg_catalog, public
    AS $$ SELECT * FROM recall_rank({_ARGUMENTS}, NULL::timestamptz, false) $$;
REVOKE ALL ON FUNCTION recall_rank({_absolute.SIGNATURE}) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION recall_rank({_absolute.SIGNATURE}) TO recall_app, recall_agent;
"""
DROP = f"DROP FUNCTION IF EXISTS recall_rank({_absolute.SIGNATURE});"
assert _held.SIGNATURE.startswith(_absolute.SIGNATURE), "0020's signature changed"


class Migration(migrations.Migration):
    dependencies = [("memories", "0020_rank_held_memories_only")]

    operations = [migrations.RunSQL(WRAPPER, DROP)]
