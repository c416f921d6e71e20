from importlib import import_module

from django.db import migrations

_index = import_module("memories.migrations.0006_search_index")

# Guarantees: recall_lexical_matches() reads search_documents through its GIN
# index whatever the table's statistics say. enable_seqscan = off (0006) was
# not enough: a full scan of the primary key, in memory_id order, also avoids
# the sequential scan and saves the GROUP BY a sort, and on a table whose
# index has grown (rows written and rolled back, or deleted and not yet
# vacuumed) the planner found it the cheaper of the two. The GIN index is
# read by bitmap scans only, so turning plain and index-only scans off inside
# the function leaves it one plan; the memories a filter checks are still
# found by primary key, through a bitmap scan.
SCANS = """
GRANT recall_search TO CURRENT_USER;
ALTER FUNCTION recall_lexical_matches(SIGNATURE)
    SET enable_indexscan = off;
ALTER FUNCTION recall_lexical_matches(SIGNATURE)
    SET enable_indexonlyscan = off;
REVOKE recall_search FROM CURRENT_USER;
"""

SCANS_REVERSE = """
GRANT recall_search TO CURRENT_USER;
ALTER FUNCTION recall_lexical_matches(SIGNATURE) RESET enable_indexscan;
ALTER FUNCTION recall_lexical_matches(SIGNATURE) RESET enable_indexonlyscan;
REVOKE recall_search FROM CURRENT_USER;
"""

SCANS = SCANS.replace("SIGNATURE", _index.LEXICAL_SIGNATURE)
SCANS_REVERSE = SCANS_REVERSE.replace("SIGNATURE", _index.LEXICAL_SIGNATURE)


class Migration(migrations.Migration):
    dependencies = [
        ("memories", "0008_search_ranking"),
    ]

    operations = [
        migrations.RunSQL(SCANS, SCANS_REVERSE),
    ]
