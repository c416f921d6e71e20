"""Search results, remembered: a tenant-private cache that the database keeps honest.

Agents repeat their searches, and a namespace changes far less often than it
is searched. A repeated search can skip the ranking statement (about 3 ms of
PostgreSQL's CPU at 10k memories, BENCHMARKS.md) and fetch its results by
primary key instead, provided nothing it depends on changed since.

What is kept, per search: the results' ids in their final order (after
``ordering.newer_first``: the order and its marks are cached, not applied
again) with each one's similarity, score, rank and mark; never their
contents. It is found under a key that holds everything that decides the
answer: the caller (user, agent, task), the namespace, the model, the
query's vector (its bytes' digest) and text, the mode, limit and threshold,
every filter, and the settings that change a ranking. Scopes are the query
cache's (``cache.scope``): a caller finds only entries it stored itself, and
every count is kept per scope. The capacity, ``RESULT_CACHE_SIZE`` entries
and ``RESULT_CACHE_BYTES`` bytes in all, least recently used out first, is
what tenants share. Each server process has its own; nothing is shared
through Redis.

Freshness is the database's word, never the clock's or this process's:

* Every statement that writes ``memories`` (insert, update of any column,
  delete, in any process, a purge or a SQL session included) gives the
  namespace a new *generation* in its own transaction (migration 0017:
  statement triggers, values from one sequence, so none is ever given
  twice). A search stores the generation it read before it ranked, in the
  same transaction; a write that commits between the two leaves the entry
  with an older generation than its rows, so it is merely never used.
* A cached answer is used only when one statement, with one snapshot, reads
  the namespace's generation equal to the stored one and fetches the
  results' rows, under the caller's tenant role and row-level security as
  the ranking would (``tenancy.read_once``: one round trip). Otherwise the
  search ranks afresh and stores the new answer.
* Time: a memory whose ``expires_at`` passes leaves every search without a
  write. It need not be a result to change one (a candidate pool holds the
  50 best of each side, the lift reaches neighbours by creation), so an
  entry lasts only until the earliest expiry still to come in the whole
  namespace, every agent's memories included, read with the generation; the
  database's own clock (``statement_timestamp()``, the one the ranking
  applies) judges whether it has passed. Nothing else in a ranking reads the
  clock: ``created_after``, ``created_before`` and ``as_of`` are instants
  given by the caller, and the lexical statistics and metadata counts change
  only with writes of memories (their triggers run in the same statements).
  The purge job deletes, which is a write.

What can still make a fresh search differ from a cached one without a write
in the namespace is what makes two fresh searches differ: a namespace large
enough to be searched through the shared HNSW graph (over
``RECALL_EXACT_SEARCH_MAX`` memories) is approximate, and other tenants'
writes and the index's statistics (``pg_class.reltuples``, which the cut-off
reads) move it. The cached answer is then the one the ranking gave for the
namespace's present contents. A migration that changes how memories rank
takes effect after the server restarts, which empties this cache.
"""

from __future__ import annotations

import hashlib
import json
import threading
import uuid
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

import numpy as np
from django.conf import settings
from django.core.signals import setting_changed
from django.db import connection

from core import tenancy
from core.counters import Book
from memories import loading
from memories.embeddings.base import Embedder
from memories.filters import COLUMNS, LIVE, Filters
from memories.models import Memory

# Python's own cost of an entry (its key and owner included) and of each
# result it holds, in bytes, as counted against RESULT_CACHE_BYTES: measured
# with tracemalloc over 2,000 entries of 0, 10 and 50 results (677 bytes,
# then 266-272 a result), rounded up. Ten results take about 3.5 KB.
ENTRY_BYTES = 700
HIT_BYTES = 280

# The namespace's generation and the earliest expiry to come, as the caller may read them.
STATE = "SELECT generation, next_expiry FROM recall_search_state(%s)"

_CHECK = """
    WITH state AS MATERIALIZED (
        SELECT generation, next_expiry FROM recall_search_state(%(namespace)s)
    ),
    fresh AS MATERIALIZED (
        SELECT generation = %(generation)s
               AND (%(expiry)s::timestamptz IS NULL
                    OR %(expiry)s::timestamptz > statement_timestamp()) AS yes
        FROM state
    )
    SELECT fresh.yes AS fresh, MEMBERS
    FROM fresh
    LEFT JOIN memories AS m
      ON fresh.yes AND m.user_id = %(user)s AND m.id = ANY(%(ids)s::uuid[]) AND LIVE_M
"""
CHECK = _CHECK.replace("MEMBERS", ", ".join(f"m.{c.strip()}" for c in COLUMNS.split(","))).replace(
    "LIVE_M", LIVE.replace("expires_at", "m.expires_at")
)


class Searching(Protocol):
    """A search's validated arguments and vector, as the key needs them (``search.Search``)."""

    @property
    def text(self) -> str: ...

    @property
    def vector(self) -> np.ndarray: ...

    @property
    def embedder(self) -> Embedder: ...

    @property
    def mode(self) -> str: ...

    @property
    def limit(self) -> int: ...

    @property
    def minimum(self) -> float: ...

    @property
    def filters(self) -> Filters: ...


class Ranked(Protocol):
    """A search result as the cache needs it (``search.Found``)."""

    @property
    def memory(self) -> Memory: ...

    @property
    def similarity(self) -> float: ...

    @property
    def score(self) -> float: ...

    @property
    def rank(self) -> float: ...

    @property
    def may_be_replaced_by(self) -> str | None: ...


@dataclass(frozen=True)
class Hit:
    id: uuid.UUID
    similarity: float
    score: float
    rank: float
    may_be_replaced_by: str | None


@dataclass(frozen=True)
class Entry:
    owner: str
    generation: int
    expiry: datetime | None  # the namespace's earliest expiry to come, when stored
    hits: tuple[Hit, ...]

    @property
    def bytes(self) -> int:
        return ENTRY_BYTES + HIT_BYTES * len(self.hits)


@dataclass
class _Counters:
    size: int = 0
    bytes: int = 0
    hits: int = 0
    misses: int = 0  # no entry
    stale: int = 0  # an entry, outdated by a write or an expiry: dropped
    evictions: int = 0


@dataclass(frozen=True)
class Stats:
    hits: int
    misses: int
    stale: int
    size: int
    bytes: int
    evictions: int
    max_size: int
    max_bytes: int


@dataclass
class ResultCache:
    """An LRU of ``Entry`` by key, bounded in entries and bytes, counted per scope."""

    max_entries: int
    max_bytes: int
    _entries: OrderedDict[str, Entry] = field(default_factory=OrderedDict)
    _book: Book[_Counters] = field(default_factory=lambda: Book(_Counters))
    _bytes: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def enabled(self) -> bool:
        return self.max_entries > 0 and self.max_bytes > 0

    def get(self, key: str, owner: str) -> Entry | None:
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                self._book.of(owner).misses += 1
                return None
            self._entries.move_to_end(key)
            return entry

    def counted(self, owner: str, *, hit: bool) -> None:
        """Count a lookup that found an entry: used (``hit``), or stale and dropped."""
        with self._lock:
            counters = self._book.of(owner)
            if hit:
                counters.hits += 1
            else:
                counters.stale += 1

    def put(self, key: str, entry: Entry) -> None:
        if entry.bytes > self.max_bytes:
            return
        with self._lock:
            if key in self._entries:
                self._drop_locked(key)
            self._entries[key] = entry
            counters = self._book.of(entry.owner)
            counters.size += 1
            counters.bytes += entry.bytes
            self._bytes += entry.bytes
            while len(self._entries) > self.max_entries or self._bytes > self.max_bytes:
                evicted = self._drop_locked(next(iter(self._entries)))
                self._book.of(evicted.owner).evictions += 1

    def drop(self, key: str) -> None:
        with self._lock:
            if key in self._entries:
                self._drop_locked(key)

    def _drop_locked(self, key: str) -> Entry:
        entry = self._entries.pop(key)
        counters = self._book.peek(entry.owner)
        counters.size -= 1
        counters.bytes -= entry.bytes
        self._bytes -= entry.bytes
        return entry

    def clear(self, scope: str | None = None, *, exact: bool = False) -> tuple[int, int]:
        """Drop one scope's entries (``exact``), a user's and its agents', or all (None).

        Returns how many entries and bytes went.
        """
        with self._lock:
            doomed = [
                key
                for key, entry in self._entries.items()
                if scope is None
                or entry.owner == scope
                or (not exact and entry.owner.startswith(scope + "."))
            ]
            freed = sum(self._drop_locked(key).bytes for key in doomed)
        return len(doomed), freed

    def stats(self, scope: str | None = None) -> Stats:
        """``scope``'s share; every scope's together for None (operators)."""
        with self._lock:
            c = self._book.total() if scope is None else self._book.peek(scope)
            return Stats(
                c.hits, c.misses, c.stale, c.size, c.bytes, c.evictions, self.max_entries,
                self.max_bytes,
            )  # fmt: skip

    def __len__(self) -> int:
        return len(self._entries)


_cache: ResultCache | None = None
_cache_lock = threading.Lock()


def get_cache() -> ResultCache:
    global _cache
    with _cache_lock:
        if _cache is None:
            _cache = ResultCache(settings.RESULT_CACHE_SIZE, settings.RESULT_CACHE_BYTES)
        return _cache


def reset_cache() -> None:
    global _cache
    with _cache_lock:
        _cache = None


def _settings_changed(*, setting: str, **kwargs: Any) -> None:
    # override_settings in tests takes effect without a manual reset.
    if setting in {"RESULT_CACHE_SIZE", "RESULT_CACHE_BYTES"}:
        reset_cache()


setting_changed.connect(_settings_changed)


def ranking_settings() -> dict[str, Any]:
    """The settings besides a search's own arguments that change what it returns."""
    names = (
        "RECALL_NEWER_FIRST",
        "RECALL_SUPERSESSION",
        "RECALL_EXACT_SEARCH_MAX",
        "RECALL_EXACT_SEARCH_RATIO",
        "HNSW_EF_SEARCH",
        "HNSW_SESSION_SETTINGS",
    )
    return {name: getattr(settings, name, None) for name in names}


def key(
    *,
    scope: str,
    task_id: str | None,
    model_id: str,
    default_threshold: float,
    vector: np.ndarray,
    text: str,
    mode: str,
    limit: int,
    minimum: float,
    filters: Filters,
) -> str:
    """The key of one search's answer: a digest of everything that decides it."""
    parts = {
        "scope": scope,
        "task": task_id,
        "model": model_id,
        "model_threshold": default_threshold,
        "vector": hashlib.sha256(np.asarray(vector, dtype=np.float32).tobytes()).hexdigest(),
        "text": text,
        "mode": mode,
        "limit": limit,
        "minimum": minimum,
        "namespace": filters.namespace,
        "metadata": filters.metadata,
        "created_after": filters.created_after,
        "created_before": filters.created_before,
        "priorities": list(filters.priorities),
        "sources": filters.sources,
        "include_superseded": filters.include_superseded,
        "as_of": filters.as_of,
        "settings": ranking_settings(),
    }
    data = json.dumps(parts, sort_keys=True, default=str, ensure_ascii=False)
    return hashlib.sha256(data.encode("utf-8", "surrogatepass")).hexdigest()


@dataclass(frozen=True)
class Lookup:
    """One search's use of the cache: answer from it, or say how to store what is ranked.

    ``key`` None: the cache is off for this search (disabled, or a preview).
    ``reuse`` False: never answer from the cache, but keep what is ranked.
    """

    user_id: str
    namespace: str
    owner: str
    key: str | None
    agent_id: uuid.UUID | str | None = None
    task_id: str | None = None
    reuse: bool = True

    @property
    def state(self) -> list[tuple[str, list[Any]]]:
        """The statement to run before the ranking, in its transaction, when it will be kept."""
        return [(STATE, [self.namespace])] if self.key is not None else []

    def answer(self) -> list[tuple[Memory, float, float, float, str | None]] | None:
        """The cached answer, when the database confirms it is current; else None."""
        if self.key is None or not self.reuse:
            return None
        cache = get_cache()
        entry = cache.get(self.key, self.owner)
        if entry is None:
            return None
        params: dict[str, Any] = {
            "namespace": self.namespace,
            "generation": entry.generation,
            "expiry": entry.expiry,
            "user": self.user_id,
            "ids": [hit.id for hit in entry.hits],
        }
        read = tenancy.read(
            self.user_id, CHECK, params, agent_id=self.agent_id, task_id=self.task_id
        )
        rows = read.rows
        fresh = bool(rows and rows[0][0])
        load = loading.Loader(read.columns)
        memories = {m.id: m for m in (load(row) for row in rows if row[1] is not None)}
        if not fresh or set(memories) != {hit.id for hit in entry.hits}:
            cache.drop(self.key)
            cache.counted(self.owner, hit=False)
            return None
        cache.counted(self.owner, hit=True)
        return [
            (memories[h.id], h.similarity, h.score, h.rank, h.may_be_replaced_by)
            for h in entry.hits
        ]

    def read_state(self) -> tenancy.Rows | None:
        """Read ``state`` in the caller's open tenant transaction (the ``tenant()`` path)."""
        if self.key is None:
            return None
        with connection.cursor() as cursor:
            cursor.execute(STATE, [self.namespace])
            return tenancy.Rows(["generation", "next_expiry"], cursor.fetchall())

    def keep(self, state: tenancy.Rows | None, found: Sequence[Ranked]) -> None:
        """Store what was ranked after ``state`` was read, in the same transaction."""
        if self.key is None or state is None or not state.rows:
            return
        generation, expiry = state.rows[0]
        hits = tuple(
            Hit(f.memory.id, f.similarity, f.score, f.rank, f.may_be_replaced_by) for f in found
        )
        get_cache().put(self.key, Entry(self.owner, int(generation), expiry, hits))


def lookup(
    user_id: uuid.UUID | str,
    search: Searching,
    scope: str,
    agent_id: uuid.UUID | str | None,
    task_id: str | None,
    *,
    on: bool,
    reuse: bool,
) -> Lookup:
    """The search's place in the cache: none when ``on`` is false or the cache is off.

    ``reuse`` false ranks afresh whatever is cached (``use_cache=False``), and keeps the answer.
    """
    found = None
    if on and get_cache().enabled:
        found = key(
            scope=scope,
            task_id=task_id,
            model_id=search.embedder.model_id,
            default_threshold=search.embedder.default_threshold,
            vector=search.vector,
            text=search.text,
            mode=search.mode,
            limit=search.limit,
            minimum=search.minimum,
            filters=search.filters,
        )
    return Lookup(
        str(user_id), search.filters.namespace, scope, found, agent_id, task_id, reuse=reuse
    )


def clear(scope: str | None = None, *, exact: bool = False) -> tuple[int, int]:
    """Drop cached answers of a scope (``exact``), a user and its agents, or everyone."""
    return get_cache().clear(scope, exact=exact)


def stats(scope: str | None = None) -> Stats:
    return get_cache().stats(scope)
