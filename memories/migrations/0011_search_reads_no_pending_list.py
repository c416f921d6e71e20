from importlib import import_module

from django.contrib.postgres.indexes import GinIndex
from django.db import migrations

_index = import_module("memories.migrations.0006_search_index")

# Guarantees: no search reads a GIN index's pending list, and recall_rank()'s
# plan knows how many lexical matches it gets.
#
# With fastupdate, PostgreSQL's default, a GIN index keeps new entries in an
# unsorted pending list until a vacuum merges them, or until the list outgrows
# gin_pending_list_limit (4 MB), and every search reads the whole list. A
# memory server is written to in small steps and searched far more often: on
# a tenant of 3,000 memories stored a moment before, 179 pending pages of the
# lexical index (search_documents_match) turned the lexical side's 0.4 ms
# index scan into 6.5 ms, half of recall_rank(). Entries now go straight into
# the index: each write pays for its own, a few dozen keys. The same for the
# metadata index (memories_metadata_gin) that filtered searches read through
# recall_filtered_ids(). The lists left over are merged here.
#
# recall_lexical_matches() returns at most its limit, the pool of 50 that
# recall_rank() asks for; estimated at a function's default 1,000 rows,
# recall_rank()'s generic plan joined them to memories by hashing every
# memory of the tenant (13.7 ms for 3,000 memories) instead of reading 50 by
# primary key.
NO_PENDING = """
ALTER INDEX search_documents_match SET (fastupdate = off);
SELECT gin_clean_pending_list('search_documents_match'::regclass);
ALTER INDEX memories_metadata_gin SET (fastupdate = off);
SELECT gin_clean_pending_list('memories_metadata_gin'::regclass);
GRANT recall_search TO CURRENT_USER;
ALTER FUNCTION recall_lexical_matches(SIGNATURE) ROWS 50;
REVOKE recall_search FROM CURRENT_USER;
"""

NO_PENDING_REVERSE = """
ALTER INDEX search_documents_match RESET (fastupdate);
ALTER INDEX memories_metadata_gin RESET (fastupdate);
GRANT recall_search TO CURRENT_USER;
ALTER FUNCTION recall_lexical_matches(SIGNATURE) ROWS 1000;
REVOKE recall_search FROM CURRENT_USER;
"""

NO_PENDING = NO_PENDING.replace("SIGNATURE", _index.LEXICAL_SIGNATURE)
NO_PENDING_REVERSE = NO_PENDING_REVERSE.replace("SIGNATURE", _index.LEXICAL_SIGNATURE)


class Migration(migrations.Migration):
    dependencies = [("memories", "0010_filtered_search")]

    operations = [
        migrations.RunSQL(
            NO_PENDING,
            NO_PENDING_REVERSE,
            # The model's index gains fastupdate=False; altered above, not rebuilt.
            state_operations=[
                migrations.RemoveIndex(model_name="memory", name="memories_metadata_gin"),
                migrations.AddIndex(
                    model_name="memory",
                    index=GinIndex(
                        fields=["metadata"],
                        opclasses=["jsonb_path_ops"],
                        name="memories_metadata_gin",
                        fastupdate=False,
                    ),
                ),
            ],
        )
    ]
