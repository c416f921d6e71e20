# A delete in the middle of a chain passes the older memory on to the next
# step that stays (A -> B -> C -> D, B deleted: A -> C), not to the chain's
# end: passed to D, A lost its place before C, and D's own delete later freed
# A and C both, two current values for one slot. The next step may be
# replaced itself, which the check refuses for every other link; the delete
# that passes a chain on says so (app.passing_on), and only it may.

from importlib import import_module

from django.db import migrations

_links = import_module("memories.migrations.0016_supersession")

_BODY_START = "CREATE FUNCTION memories_check_supersession()"
_BODY_END = "END $$;"


def _check(text: str) -> str:
    start = text.index(_BODY_START)
    return text[start : text.index(_BODY_END, start) + len(_BODY_END)].replace(
        "CREATE FUNCTION", "CREATE OR REPLACE FUNCTION", 1
    )


_REFUSED = "            IF other.superseded_by IS NOT NULL THEN\n"
_PASSING = (
    "            IF other.superseded_by IS NOT NULL\n"
    "               AND coalesce(current_setting('app.passing_on', true), '') <> 'on' THEN\n"
)

BEFORE = _check(_links.LINKS)
assert _REFUSED in BEFORE
AFTER = BEFORE.replace(_REFUSED, _PASSING, 1)


class Migration(migrations.Migration):
    dependencies = [("memories", "0025_search_address_parts")]

    operations = [migrations.RunSQL(AFTER, BEFORE)]
