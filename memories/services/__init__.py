"""Memories: every operation on them, and everything else other code needs of their tables.

Every interface calls these and only these: the MCP tools, the dashboard,
the admin, management commands, and other apps (the admin's counts, the
usage page's quota). ``recall/tests/test_architecture.py`` keeps it so.
One module per concept, layered so that none imports one above it:

* ``quota``: counts, and the tier's memory limit checked before a write;
* ``storing``: a validated call's memories, written in one transaction;
* ``queue``: background adds: enqueue, report, take and settle a job;
* ``remembering``: ``remember``, which stores at once or queues;
* ``reading``: ``recall`` (the one search of memories/search.py, shaped),
  listing, namespaces;
* ``changes``: update, forget (and its confirmations), history;
* ``sources``: seed 003's add, search, filters and recall;
* ``superseding``: knowledge updates: which memory a write replaces, and undo;
* ``naming``: a write's ``replaces``: the id read and checked;
* ``transfer``: export and import;
* ``importing``: imports from other memory servers (memories/importers);
* ``maintenance``: the periodic clean-up and re-embedding (operator path);
* ``health``: stats, the query cache, health.

The operations return plain data shaped as the tool specifications describe,
and raise only ``core.errors.RecallError`` subclasses for anything a caller
did or could fix. Input is validated in full before anything is written, so
bad input writes nothing.

Functions that act for a user run inside ``tenancy.tenant(user_id,
agent_id=...)``: one transaction with row-level security bound to the
caller, and to its agent when it acts as one (an OAuth connection or an
agent-scoped key; ``agent_id=None`` is the user-wide view, as ``recall_app``).
The explicit ``user_id`` filters are for the planner's benefit; isolation
does not depend on them, nor on any agent filter. The few that act for an
operator (re-embedding, counts across users, workers and maintenance) say
"operator path" and run in ``tenancy.operator()``. Embedding happens outside
transactions so that a slow embedding provider never holds a database
connection.
"""

from __future__ import annotations

# The tier's memory limit is accounts' rule; memories' callers find it here too.
from accounts.tiers import memory_limit
from memories.services.changes import (
    delete_as_operator,
    erase_history,
    forget,
    forget_all_preview,
    forget_by_id,
    forget_confirm,
    forget_namespace,
    forget_preview,
    hold_agents_memories,
    hold_users_memories,
    memory_history,
    recent_changes,
    update_memory,
)
from memories.services.health import (
    CACHE_CHANNEL,
    broadcast_cache_clear,
    cache_stats,
    clear_broadcast,
    clear_query_cache,
    health,
    memory_stats,
    optimize_cache,
    worker_pool,
)
from memories.services.importing import (
    IMPORT_CHUNK_BYTES,
    Cleared,
    ImportItem,
    ImportJob,
    clear_imports,
    cleared_namespaces,
    enqueue_import,
    finish_import,
    import_file,
    import_jobs,
    new_imports,
    requeue_job,
    save_import_progress,
    store_imports,
)
from memories.services.maintenance import (
    _MAINTENANCE_LOCK,
    CLEAN_UP_BATCH,
    CleanUp,
    Reembedding,
    clean_up,
    has_stale_embeddings,
    reembed,
)
from memories.services.queue import (
    CHANNEL,
    PENDING,
    JobLost,
    Stopping,
    enqueue_remember,
    hand_back,
    job_status,
    queue_depth,
    run_next_job,
    runs,
    waiting,
    wake,
)
from memories.services.quota import (
    Quota,
    check_quota,
    count_memories,
    memories_per_user,
    memory_quota,
)
from memories.services.reading import (
    SOURCE_FILTERS,
    count_namespace,
    default_threshold,
    list_memories,
    list_namespaces,
    memory_agents,
    recall,
    search_memories,
)
from memories.services.remembering import (
    RememberArguments,
    remember,
    remembering,
)
from memories.services.replaced import replaced_by_each, still_replaced, with_history
from memories.services.shapes import (
    Answer,
    CacheStats,
    Forgotten,
    Health,
    Listed,
    Recalled,
    Remembered,
    Sourced,
    Stored,
    Version,
)
from memories.services.sources import (
    DOCUMENT_MAX,
    FILTER_VALUES_MAX,
    LABEL_MAX,
    PATH_MAX,
    SOURCES_NAMESPACE,
    add,
    add_document,
    add_note,
    add_turns,
    list_source_filters,
    recall_answer,
    search_sources,
    source_filters,
)
from memories.services.storing import (
    Item,
    Remembering,
    store,
)
from memories.services.superseding import link, restore
from memories.services.transfer import (
    EXPORT_BATCH,
    IMPORT_BATCH,
    Imported,
    export_memories,
    import_memories,
)

__all__ = [
    "CACHE_CHANNEL",
    "CHANNEL",
    "CLEAN_UP_BATCH",
    "DOCUMENT_MAX",
    "EXPORT_BATCH",
    "FILTER_VALUES_MAX",
    "IMPORT_BATCH",
    "IMPORT_CHUNK_BYTES",
    "LABEL_MAX",
    "PATH_MAX",
    "PENDING",
    "SOURCES_NAMESPACE",
    "SOURCE_FILTERS",
    "_MAINTENANCE_LOCK",
    "Answer",
    "CacheStats",
    "CleanUp",
    "Cleared",
    "Forgotten",
    "Health",
    "ImportItem",
    "ImportJob",
    "Imported",
    "Item",
    "JobLost",
    "Listed",
    "Quota",
    "Recalled",
    "Reembedding",
    "RememberArguments",
    "Remembered",
    "Remembering",
    "Sourced",
    "Stopping",
    "Stored",
    "Version",
    "add",
    "add_document",
    "add_note",
    "add_turns",
    "broadcast_cache_clear",
    "cache_stats",
    "check_quota",
    "clean_up",
    "clear_broadcast",
    "clear_imports",
    "clear_query_cache",
    "cleared_namespaces",
    "count_memories",
    "count_namespace",
    "default_threshold",
    "delete_as_operator",
    "enqueue_import",
    "enqueue_remember",
    "erase_history",
    "export_memories",
    "finish_import",
    "forget",
    "forget_all_preview",
    "forget_by_id",
    "forget_confirm",
    "forget_namespace",
    "forget_preview",
    "hand_back",
    "has_stale_embeddings",
    "health",
    "hold_agents_memories",
    "hold_users_memories",
    "import_file",
    "import_jobs",
    "import_memories",
    "job_status",
    "link",
    "list_memories",
    "list_namespaces",
    "list_source_filters",
    "memories_per_user",
    "memory_agents",
    "memory_history",
    "memory_limit",
    "memory_quota",
    "memory_stats",
    "new_imports",
    "optimize_cache",
    "queue_depth",
    "recall",
    "recall_answer",
    "recent_changes",
    "reembed",
    "remember",
    "remembering",
    "replaced_by_each",
    "requeue_job",
    "restore",
    "run_next_job",
    "runs",
    "save_import_progress",
    "search_memories",
    "search_sources",
    "source_filters",
    "still_replaced",
    "store",
    "store_imports",
    "update_memory",
    "waiting",
    "wake",
    "with_history",
    "worker_pool",
]
