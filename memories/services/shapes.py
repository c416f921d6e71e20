"""What the memory services return: typed, so mypy checks the adapters that shape them.

Each is the plain data a tool specification describes (JSON-ready: strings,
numbers, lists), as a ``TypedDict`` the adapters index by name.
"""

from __future__ import annotations

from typing import NotRequired, TypedDict

# A memory's metadata: any JSON object, as stored.
Metadata = dict[str, object]


class Hinted(TypedDict):
    """A current memory that may hold an earlier value of the stored one's fact."""

    id: str
    content: str


class Remembered(TypedDict, total=False):
    """What ``remember`` answers: one memory's id, a conversation's, or a queued job's."""

    id: str
    deduped: bool
    thread_id: str | None
    memories: list[Stored]
    count: int
    job_id: str
    status: str
    memory_ids: list[str]
    replaces: list[str]
    may_replace: list[Hinted]


class NotReplaced(TypedDict):
    id: str
    code: str
    message: str


class Stored(TypedDict):
    id: str
    deduped: bool
    # The older memories this one replaced (issue 22), when any.
    replaces: NotRequired[list[str]]
    # Kept memories that may state an earlier value of the same fact, which
    # the detector was not sure enough to replace, when any: the caller judges.
    may_replace: NotRequired[list[Hinted]]
    # A background add's: the memory its ``replaces`` named was deleted or
    # replaced before the job ran, so the note was stored unlinked.
    not_replaced: NotRequired[NotReplaced]


class Thread(TypedDict):
    thread_id: str | None
    memories: list[Stored]
    count: int


class Queued(TypedDict):
    job_id: str
    status: str
    memory_ids: list[str]


class Recalled(TypedDict):
    id: str
    content: str
    similarity: float
    score: float
    metadata: Metadata
    namespace: str
    priority: str
    created_at: str
    expires_at: str | None
    # Only on a replaced memory, which a search returns only when asked
    # (include_superseded, as_of).
    superseded_by: NotRequired[str]
    superseded_at: NotRequired[str]
    # Only on a current memory a newer result likely restates, which the
    # write did not link (memories/ordering.py); never with as_of.
    may_be_replaced_by: NotRequired[str]
    # Only with as_of: the version shown (memory_history's), the latest at
    # that moment; content, metadata and priority are that version's.
    version: NotRequired[int]


class Listed(TypedDict):
    id: str
    content: str
    namespace: str
    thread_id: str | None
    position: int | None
    metadata: Metadata
    priority: str
    hash: str
    version: int
    created_at: str
    updated_at: str
    expires_at: str | None
    superseded_by: str | None
    superseded_at: str | None


class Version(TypedDict):
    version: int
    action: str
    content: str
    metadata: Metadata
    namespace: str
    priority: str
    expires_at: str | None
    timestamp: str
    client: str
    api_key_id: str | None
    # Issue 22: what replaced the memory at this version; what a created
    # memory replaced; who decided a link and why.
    superseded_by: str | None
    replaces: list[str] | None
    decision: Metadata | None


class Change(Version):
    memory_id: str


class ChangesPage(TypedDict):
    changes: list[Change]
    # Cursors of the pages beside this one (``recent_changes``' before and
    # after); None where there is none.
    newer: str | None
    older: str | None


class Sourced(TypedDict):
    id: str
    content: str
    similarity: float
    score: float
    source_kind: str
    author: str
    path: str
    thread_id: str | None
    task_id: str | None
    metadata: Metadata
    created_at: str
    superseded_by: NotRequired[str]
    superseded_at: NotRequired[str]
    may_be_replaced_by: NotRequired[str]


class Match(TypedDict):
    id: str
    content: str
    similarity: float
    score: float
    superseded_by: NotRequired[str]
    superseded_at: NotRequired[str]
    may_be_replaced_by: NotRequired[str]


class Forgotten(TypedDict, total=False):
    """What ``forget`` answers: a deletion, or a preview with its confirmation token."""

    success: bool
    deleted_count: int
    purged: bool
    preview: bool
    namespace: str
    matches: list[Match]
    total_matches: int
    confirmation_token: str | None
    expires_at: str | None


class Answer(TypedDict, total=False):
    answer: str
    memory_ids: list[str]
    mode: str
    model: str
    note: str


class Deleted(TypedDict):
    deleted_count: int
    namespace: str
    purged: bool


class CacheStats(TypedDict):
    hits: int
    shared_hits: int
    misses: int
    hit_rate: float | None
    size: int
    max_size: int
    ttl_seconds: float
    bytes: int
    evictions: int
    expirations: int
    avg_hit_ms: float | None
    avg_miss_ms: float | None
    avg_ms: float | None
    shared: bool
    shared_available: bool


class Optimized(TypedDict):
    expired: int
    demoted: int
    promoted: int
    refreshed: int
    kept: int
    bytes_freed: int
    seconds: float


class QueueDepth(TypedDict):
    depth: int
    oldest_seconds: float


class DatabaseHealth(TypedDict, total=False):
    ok: bool
    latency_ms: float
    error: str


class EmbedderHealth(TypedDict):
    ok: bool
    model: str
    error: NotRequired[str]  # why not ok: not loaded, or the latest call failed


class CacheHealth(TypedDict):
    size: int
    shared_size: int | None
    hit_rate: float | None
    bytes: int


class Health(TypedDict):
    status: str
    database: DatabaseHealth
    embedder: EmbedderHealth
    queue: QueueDepth | None
    redis: bool | None
    cache: CacheHealth
    version: str
    uptime_seconds: float
    rss_bytes: int


class NamespaceCount(TypedDict):
    namespace: str
    count: int  # current memories
    replaced: int  # replaced ones, shown only when asked
