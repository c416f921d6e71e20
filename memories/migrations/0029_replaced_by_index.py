"""An index on what replaced a memory, by that memory alone.

The key ``memories_superseded_by_fk`` is ON DELETE SET NULL: deleting a
memory runs ``UPDATE memories SET superseded_by = NULL WHERE superseded_by =
$1``, which names no user, so ``memories_replaces_idx (user_id,
superseded_by)`` could serve it only by being read whole: 7-8 ms a delete at
500,000 memories (review123), paid by every forget and every expired memory
the purge takes. Partial, as that one is: only replaced memories are in it.
Built concurrently, so that servers of the old release keep writing while it
builds.
"""

from django.db import migrations


class Migration(migrations.Migration):
    atomic = False

    dependencies = [("memories", "0028_search_words_in_angle_brackets")]

    operations = [
        migrations.RunSQL(
            "CREATE INDEX CONCURRENTLY IF NOT EXISTS memories_replaced_by_idx"
            " ON memories (superseded_by) WHERE superseded_by IS NOT NULL",
            "DROP INDEX CONCURRENTLY IF EXISTS memories_replaced_by_idx",
        )
    ]
