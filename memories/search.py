"""Search: the one ranking behind recall, forget's preview, the dashboard and every retrieval tool.

A caller builds ``SearchArgs`` once, where its call comes in (``parse()``
validates what it was given), and hands it to ``search()``, the one search
every service runs: it embeds the query (outside any transaction: a slow
embedding provider never holds a connection), then ranks in the caller's
tenant transaction. Every result carries its cosine ``similarity`` and its
``score``, an absolute relevance in [0, 1] that means the same in every query,
namespace and mode (``memories/scoring.py``). Three modes:

* ``semantic``: cosine similarity alone, exactly as the specification first
  described recall (``score`` is a logistic of the similarity, so the order
  is the similarity's). A namespace no larger than
  a cut-off (``RECALL_EXACT_SEARCH_MAX``, or more in a big shared table, see
  ``_nearest``) is ranked by an exact scan, a larger one through the model's
  HNSW index.
* ``lexical``: BM25 alone, over the memory's content and the string values of
  its metadata, with PostgreSQL's English analysis (stemmed words, whole
  numbers, names, identifiers, e-mail addresses, versions). IDF, document
  lengths and the average length are kept per user and namespace, so a word
  is rare or common relative to the namespace it is searched in.
* ``hybrid`` (the default, ``RECALL_SEARCH_MODE``): both, fused in one
  statement. The candidates are the 50 nearest by cosine and the 50 best by
  BM25 among the memories holding the query's rarest words. Each candidate's
  z is a weighted sum of its own cosine and its coverage (below), the
  weights fitted on development data (``scoring.HYBRID``), and its score is
  the logistic of z. The order then lets each of the five best lift the
  memories up to two places before and after it in the namespace (by
  creation) halfway to its own z, when theirs is lower (only memories the
  search may return take part: migration 0020). Stored conversation
  turns answer each other ("what did she say about it?"), and this finds the
  answer beside the turn that names the subject, without lowering anything.
  The lift moves a memory up the list, not its score: being beside a match
  says little about a memory's own relevance (2% of the unrelated ones it
  raised past 0.5 on the development data were relevant), so a lifted
  memory can follow one that scores less.

Filters (namespace, ``metadata_filter``, ``created_after`` / ``created_before``,
``priority``, memory_search's source filters) are applied before ranking, in
every candidate source, never to a finished top-k; so are expiry (no search
returns an expired memory) and the agent rule (acting as an agent, a search
ranks only that agent's memories and those filed under the task it names:
row-level security on the dense side, the same rule inside the definer
functions on the lexical side). Priority breaks ties and only ties: among
the k best, results equal to two decimals (score; similarity in semantic
mode) come highest priority first. A later filter joins ``Filters``: one field, one clause in
``Filters.clauses()``, one argument to ``recall_rank`` and
``recall_lexical_matches`` (see the migrations).

The threshold: a memory is returned when its score reaches it, in every mode
(``scoring.THRESHOLD`` unless ``RECALL_DEFAULT_THRESHOLD`` says otherwise);
a lifted neighbour too must score that much on its own. Coverage is a
memory's BM25 over the sum of the IDFs of the query's words (words no memory
holds included): the share of what was asked that it matches. A memory that
holds the rare name or number a query is mostly about scores high even when
the embedding misses it; memories that share only common words do not.

K1, B, LIFT and WINDOW were chosen on the LoCoMo dev conversations by
leave-one-conversation-out and checked on SciFact, the score's weights by
``bench/calibration.py``; POOL, SCAN and PROVIDERS bound the work per search,
set where larger values stopped changing the rankings. BENCHMARKS.md ("Hybrid
search", "An absolute score") has the figures and the commands.

A search repeated with the same arguments is answered from the result cache
(``memories/results.py``) when the database confirms that nothing it
depends on changed: the namespace's generation, read with the rows.

For a new retrieval tool: ``SearchArgs.parse()`` takes the tool's arguments
(a new pre-ranking filter joins ``Filters``), ``search()`` returns ``Found``
rows, best first; shape them in the service.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, TypedDict, Unpack

import numpy as np
from django.conf import settings
from django.db import connection

from core import pooling, tenancy
from core.errors import ValidationFailed
from memories import embeddings, loading, ordering, results, scoring, validation
from memories.embeddings import cache, failures
from memories.filters import COLUMNS, LIVE, PRIORITY_ORDER, Filters
from memories.filters import SOURCE_FILTERS as SOURCE_FILTERS
from memories.indexes import index_name, vector_literal, vector_type
from memories.models import Memory

logger = logging.getLogger(__name__)

# BM25's term-frequency saturation and length normalisation (Anserini's defaults).
K1 = 0.9
B = 0.4
# Documents IDF counts beyond the namespace's own, none holding the query's
# words, so that a small namespace's words are not all common (recall_rank).
PRIOR = 10
# Candidates from each side.
POOL = 50
# Documents the lexical side reads at most: those of the query's rarest words.
SCAN = 150
# How many of the best candidates lift their neighbours, how far, and how much.
PROVIDERS = 5
WINDOW = 2
LIFT = 0.5

# A search transaction's planner settings. The nearest-neighbour statement
# counts the namespace through its b-tree; at some table shapes the planner
# would rather read the whole table (and sort it) to count a few thousand
# rows. Every path a search needs has an index, so table scans are off.
# Behind a transaction pooler also the HNSW settings, which a connection of
# its own gets at connect (settings.HNSW_SESSION_SETTINGS).
SEARCH_SETTINGS = {"enable_seqscan": "off", **pooling.search_settings()}

# HNSW search breadth grows with the namespace: hnsw.ef_search is
# HNSW_EF_SEARCH (100) up to EF_KNEE memories, then grows with the size,
# HNSW_EF_SEARCH * (n / EF_KNEE) ** EF_EXPONENT, at most EF_MAX: 264 at 400k,
# 502 at 1M. Fixed at 100, recall@10 was 0.87-0.90 at 1M memories in one
# namespace. How much breadth 0.95 needs depends on the graph build: five
# builds of the same 1M vectors gave 0.937-0.953 at 316-317 (the square
# root, this rule's first exponent), three of them under 0.95; two of those
# gave 0.962 at 500 and 0.973 at 502. 100k keeps 100 and its latency
# (BENCHMARKS.md, "HNSW accuracy at scale" and "The breadth at 1M, over four
# builds"; bench/scale.py --ef-search-sweep).
EF_KNEE = 100_000
EF_EXPONENT = 0.7
EF_MAX = 1000


# The exact-scan cut-off, in memories (see _nearest): RECALL_EXACT_SEARCH_MAX,
# or sqrt(ratio x neighbours sought x the rows of the model's HNSW index) when
# more, from the index's statistics. Parameters: cutoff_params().
CUTOFF = (
    "SELECT greatest(%(exact_max)s, floor(sqrt(%(exact_ratio)s * greatest(coalesce("
    "(SELECT reltuples FROM pg_class WHERE oid = to_regclass(%(index)s)), 0), 0))))::int"
    " AS rows"
)


def cutoff_params(model_id: str, neighbours: int) -> dict[str, Any]:
    return {
        "exact_max": settings.RECALL_EXACT_SEARCH_MAX,
        "exact_ratio": settings.RECALL_EXACT_SEARCH_RATIO * neighbours,
        "index": index_name(model_id),
    }


# The columns memory_search may filter on, all indexed (see Memory.Meta).
@dataclass(frozen=True)
class Search:
    """One search's validated arguments and the query's vector."""

    text: str
    vector: np.ndarray
    embedder: embeddings.Embedder
    mode: str
    limit: int
    minimum: float
    filters: Filters
    # Where the query's vector came from: "cache", "shared-cache" or "model".
    vector_source: str = "model"


@dataclass(frozen=True)
class Found:
    memory: Memory
    similarity: float  # cosine, 0-1
    score: float  # absolute relevance, 0-1 (memories/scoring.py), the memory's own
    rank: float  # the list's order: the score, lifted beside a strong match (hybrid)
    # The id of a newer result that likely restates this one's slot, which
    # the write did not link (``ordering.newer_first``); None when none.
    may_be_replaced_by: str | None = None


def default_threshold() -> float:
    """The threshold on ``score`` when a search names none, whatever the model."""
    if settings.RECALL_DEFAULT_THRESHOLD is not None:
        return settings.RECALL_DEFAULT_THRESHOLD
    return scoring.THRESHOLD


class QueryArguments(TypedDict, total=False):
    """A search's arguments as a caller gives them, but the mode (the server's).

    ``SearchArgs.parse`` validates them.
    """

    query: str | None
    namespace: str | None
    limit: int
    threshold: float | None
    metadata_filter: Mapping[str, object] | None
    priority: str | Sequence[str] | None
    created_after: str | datetime | None
    created_before: str | datetime | None
    use_cache: bool
    include_superseded: bool
    as_of: str | datetime | None


class SearchArguments(QueryArguments, total=False):
    """A search's arguments as a caller gives them, the mode too."""

    mode: str | None


@dataclass(frozen=True)
class SearchArgs:
    """One search's arguments, validated: built once, where a call comes in.

    ``threshold`` None is the embedder's default (``default_threshold``),
    ``mode`` None the server's (``RECALL_SEARCH_MODE``). ``use_cache=False``
    embeds the query afresh whatever the query cache holds.
    """

    query: str
    filters: Filters
    limit: int = 10
    threshold: float | None = None
    mode: str | None = None
    use_cache: bool = True

    @classmethod
    def parse(
        cls, *, sources: Mapping[str, str] | None = None, **given: Unpack[SearchArguments]
    ) -> SearchArgs:
        """Validate a search's arguments, raising ``ValidationFailed`` on the first bad one.

        ``sources`` are memory_search's filters, validated by its service.
        """
        text = validation.query(given.get("query"))
        namespace = validation.namespace(given.get("namespace", "default"))
        limit = validation.integer(
            given.get("limit", 10),
            field="limit",
            low=1,
            high=validation.RECALL_LIMIT_MAX,
            default=10,
        )
        mode = given.get("mode")
        if mode is not None:
            mode = validation.search_mode(mode, settings.RECALL_SEARCH_MODE)
        threshold = given.get("threshold")
        if threshold is not None:
            threshold = validation.threshold(threshold, 0.0)
        where = validation.metadata_filter(given.get("metadata_filter"))
        after, before = validation.created_range(
            given.get("created_after"), given.get("created_before")
        )
        levels = tuple(validation.priorities(given.get("priority")))
        replaced = validation.flag(
            given.get("include_superseded", False), field="include_superseded"
        )
        as_of = validation.moment(given.get("as_of"), field="as_of")
        if replaced and as_of is not None:
            # Left out silently before: what was replaced by T was not held then.
            raise ValidationFailed(
                "Pass as_of or include_superseded, not both: as_of shows what was held "
                "true at that moment, and a memory replaced by then was not."
            )
        filters = Filters(
            namespace, where, after, before, levels, dict(sources or {}), replaced, as_of
        )
        return cls(text, filters, limit, threshold, mode, bool(given.get("use_cache", True)))


@dataclass(frozen=True)
class Searched:
    """What a search found, best first, and where the query's vector came from."""

    found: list[Found]
    # "cache", "shared-cache" or "model".
    vector_source: str
    # Whether the result cache answered (memories/results.py).
    cached: bool = False


def search(
    *,
    user_id: uuid.UUID | str,
    args: SearchArgs,
    agent_id: uuid.UUID | str | None = None,
    task_id: str | None = None,
    within: Callable[[list[Found]], None] | None = None,
) -> Searched:
    """Search the caller's memories: every search of every interface is this one.

    Embeds the query first (through the query cache, outside any
    transaction: a slow provider never holds a connection), then answers
    from the result cache when the database confirms the answer is current
    (``memories/results.py``), else ranks in the caller's tenant
    transaction, opened with the search's settings, and keeps the answer.
    ``task_id`` lets an agent read the task's memories its search names.
    ``within`` runs in the same transaction with the results (forget's
    preview stores its confirmation there; it is never cached). Its few best
    results put a newer restatement above an older one
    (``ordering.newer_first``), before the answer is kept.
    """
    scope = cache.scope(user_id, agent_id)
    prepared = prepare(args, cache_scope=scope)
    opening = transaction_settings(prepared, agent=agent_id is not None)
    kept = results.lookup(
        user_id, prepared, scope, agent_id, task_id, on=within is None, reuse=args.use_cache
    )
    if (answer := kept.answer()) is not None:
        return Searched([Found(*hit) for hit in answer], prepared.vector_source, cached=True)
    if within is None:
        # Nothing else to do in the transaction: open it, rank and commit in one round trip.
        sql, params = statement(user_id, prepared, agent=agent_id is not None)
        reads = tenancy.read_many(
            user_id,
            [*kept.state, (sql, params)],
            agent_id=agent_id,
            task_id=task_id,
            local_settings=opening,
        )
        if reads is not None:
            found = found_rows(reads[-1])
            if ordering.enabled():
                # The transaction is over: the rare pair to compare opens its own.
                found = arrange(found, pair_cosines(user_id, agent_id=agent_id, task_id=task_id))
            kept.keep(reads[0] if kept.state else None, found)
            return Searched(found, prepared.vector_source)
    with tenancy.tenant(user_id, agent_id=agent_id, task_id=task_id, local_settings=opening):
        state = kept.read_state()
        found = run(user_id, prepared, agent_id=agent_id)
        if ordering.enabled():
            found = arrange(found, pair_cosines(user_id))
        if within is not None:
            within(found)
        kept.keep(state, found)
    return Searched(found, prepared.vector_source)


def arrange(found: list[Found], cosines: ordering.Cosines) -> list[Found]:
    """``found`` newer first, each older result restated by a newer one marked with its id."""
    arranged = ordering.newer_first(found, cosines)
    if not arranged.restated:
        return arranged.found
    return [
        replace(hit, may_be_replaced_by=arranged.restated.get(str(hit.memory.id)))
        for hit in arranged.found
    ]


def pair_cosines(
    user_id: uuid.UUID | str,
    *,
    agent_id: uuid.UUID | str | None = None,
    task_id: str | None = None,
) -> ordering.Cosines:
    """Return what reads the cosine of pairs of the user's memories, for ``ordering``: under
    row-level security, in the caller's transaction or one of its own (one round trip where
    it can). A pair of two models has none."""
    sql = (
        "SELECT a.id, b.id, 1 - (a.embedding <=> b.embedding)"
        " FROM unnest(%s::uuid[], %s::uuid[]) AS p(older, newer)"
        " JOIN memories AS a ON a.id = p.older AND a.user_id = %s"
        " JOIN memories AS b ON b.id = p.newer AND b.user_id = %s"
        " WHERE a.embedding_model = b.embedding_model"
    )

    def here(params: list[Any]) -> list[tuple[Any, ...]]:
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            return cursor.fetchall()

    def read(pairs: Sequence[tuple[str, str]]) -> dict[tuple[str, str], float]:
        params = [[a for a, _ in pairs], [b for _, b in pairs], str(user_id), str(user_id)]
        if connection.in_atomic_block:
            rows = here(params)  # the caller's transaction
        else:
            rows = tenancy.read(user_id, sql, params, agent_id=agent_id, task_id=task_id).rows
        return {(str(a), str(b)): float(cos) for a, b, cos in rows}

    return read


def prepare(args: SearchArgs, *, cache_scope: str) -> Search:
    """Embed a search's query (through the query cache) and resolve its defaults.

    ``cache_scope`` is the caller's (``embeddings.cache.scope()``): the query
    cache shows a caller only the vectors it computed.
    """
    embedder = embeddings.get_embedder()
    minimum = args.threshold if args.threshold is not None else default_threshold()
    mode = args.mode or settings.RECALL_SEARCH_MODE
    vector, source = failures.embed_query(
        embeddings.get_query_cache(),
        embedder,
        args.query,
        scope=cache_scope,
        use_cache=args.use_cache,
    )
    return Search(args.query, vector, embedder, mode, args.limit, minimum, args.filters, source)


def run(
    user_id: uuid.UUID | str,
    search: Search,
    *,
    agent_id: uuid.UUID | str | None = None,
    limit: int | None = None,
) -> list[Found]:
    """Rank inside the caller's tenant transaction; return at most ``search.limit``.

    ``agent_id`` says the transaction acts as that agent (what it may read is
    the database's business; here it only chooses how the namespace is
    sized). ``limit`` overrides the search's own, unchecked (benchmarks read
    100 deep).
    """
    sql, params = statement(user_id, search, agent=agent_id is not None, limit=limit)
    rows = Memory.objects.raw(sql, params)
    # A raw query sets its extra columns on each row; the stub's RawQuerySet
    # knows only the model's fields.
    return [
        Found(
            row,
            round(float(row.similarity), 4),  # type: ignore[attr-defined]
            round(float(row.score), 4),  # type: ignore[attr-defined]
            float(row.rank),  # type: ignore[attr-defined]
        )
        for row in rows
    ]


def found_rows(read: tenancy.Rows) -> list[Found]:
    """The ranking statement's rows as ``run()`` returns them: memories, as the ORM loads them."""
    names = read.columns
    at = {name: names.index(name) for name in ("similarity", "score", "rank")}
    load = loading.Loader(names)
    return [
        Found(
            load(row),
            round(float(row[at["similarity"]]), 4),
            round(float(row[at["score"]]), 4),
            float(row[at["rank"]]),
        )
        for row in read.rows
    ]


def transaction_settings(
    search: Search, *, agent: bool = False
) -> dict[str, str | tenancy.Computed]:
    """Return the settings a search's tenant transaction opens with.

    ``SEARCH_SETTINGS``, and the HNSW search breadth for the namespace's size,
    read from its search statistics in the transaction's first round trip. An
    agent's transaction may not read those statistics (they describe every
    agent's memories) and searches at the base breadth.

    An unfiltered search also turns sorting off, so that the statement's
    index branch reads the HNSW index. Left to itself, the planner ranks a
    namespace of a few thousand memories that is most of its table (one
    user's own server) by reading and sorting all of them: 3,000 alone took
    17.2 ms in semantic mode and 25.1 ms in hybrid mode that way, 9.5 and
    19.6 ms through the index (BENCHMARKS.md, "The index branch reads the
    index"). The cut-off has already judged the index the faster way; this
    lets the plan follow it. The exact branch orders by a function no index
    serves, so it sorts either way, and the top-level ordering has no other
    way either. A constant, not worked out from the cut-off in the opening
    round trip: that evaluation alone cost 0.3-1 ms a search. Filtered
    searches are left to the planner, which weighs their filters' indexes
    too; lexical ones have no vector side.
    """
    if agent:
        return dict(SEARCH_SETTINGS)
    base = settings.HNSW_EF_SEARCH
    breadth = tenancy.Computed(
        "SELECT greatest(%s, least(%s, ceil(%s * power("
        "greatest(coalesce(max(documents), 0), 1)::float8 / %s, %s))))::int"
        " FROM search_namespaces WHERE user_id = recall_current_user_id() AND namespace = %s",
        [base, EF_MAX, base, EF_KNEE, EF_EXPONENT, search.filters.namespace],
    )
    opening: dict[str, str | tenancy.Computed] = {**SEARCH_SETTINGS, "hnsw.ef_search": breadth}
    if search.mode != "lexical" and not search.filters.narrowing:
        opening["enable_sort"] = "off"
    return opening


def statement(
    user_id: Any, search: Search, *, agent: bool = False, limit: int | None = None
) -> tuple[str, dict[str, Any]]:
    """Return the search's one SQL statement and its parameters.

    ``limit`` overrides the search's own (benchmarks read 100 deep).
    """
    if search.mode == "semantic":
        return semantic_sql(user_id, search, agent=agent, limit=limit)
    return ranked_sql(user_id, search, agent=agent, limit=limit)


def nearest_ctes(search: Search, count: int, *, agent: bool = False) -> tuple[str, dict[str, Any]]:
    """The dense half alone: CTEs ending in ``nearest`` (columns and distance), for a write's
    supersession candidates (memories/services/superseding.py)."""
    return _nearest(search, count, agent=agent)


def _nearest(
    search: Search, count: int, *, agent: bool = False, rows: bool = True
) -> tuple[str, dict[str, Any]]:
    """Return the CTEs that find the ``count`` nearest memories by cosine.

    With ``rows`` the nearest CTE carries the memories' columns; without, ids
    and distances only.

    Two branches, one of which runs, chosen inside the statement:

    * A namespace holding at most the cut-off (below) is ranked exactly:
      every row is compared with the query. That costs a few milliseconds at
      these sizes and is always right. HNSW is not,
      and it is at its weakest exactly here: a young graph, or one holding
      many identical vectors (common phrases stored by many tenants), can
      leave freshly inserted elements unreachable from the entry point, so an
      index scan would silently miss them. The branch orders by
      ``cosine_distance()``, a function call the index cannot serve, so the
      planner never picks the index for it whatever its statistics say.
    * A larger namespace is searched through the per-model HNSW index: ORDER
      BY the distance operator on the same cast expression the index was
      built on, LIMIT k, with the model in the WHERE clause to match the
      partial index. Iterative index scans (set on every connection, see
      settings) keep the scan going past rows the namespace, metadata, date,
      priority, source or tenant filters reject, so a selective filter still
      fills the pool. For an unfiltered search the transaction opens with
      sorting off (``transaction_settings``), so the planner cannot rank a
      namespace that is most of its table by reading and sorting it instead.

    The size: on the user-wide path without source filters, the namespace's
    document count, one row of search_namespaces kept by trigger. Acting as
    an agent, or with memory_search's source filters, what the caller may
    rank can be a small part of a big namespace, where an index scan could
    give up (``hnsw.max_scan_tuples``) before reaching it; then the rows are
    counted, under row-level security and the filters, through the
    narrowest index, up to the cut-off and no further.

    The cut-off is ``RECALL_EXACT_SEARCH_MAX`` (2,000) or, when more,
    sqrt(``RECALL_EXACT_SEARCH_RATIO`` (8) x k x N), where k is the
    neighbours sought (``count``: the limit, or hybrid's pool of 50) and N
    the rows of the model's HNSW index, read from its statistics
    (``pg_class.reltuples``). An exact scan costs in proportion to the n
    rows it ranks; an index scan that must skip every row outside them, in
    proportion to k x N / n. The square root puts the switch where the two
    meet: for N = 144k, 3,400 memories at k = 10 and 7,600 in hybrid mode;
    for N = 1M, 8,900 and 20,000. Measured (``bench/cutoff.py``, tenants in
    one shared table of 144k, p50): 3,000 memories in hybrid mode took 76 ms
    through the graph and 20 ms exactly, 6,000 took 41 and 27 ms, 10,000 27
    and 37 ms; in semantic mode (k = 10) 3,000 took 15 and 16 ms, and 6,000
    11 ms through the graph, 25 ms exactly (BENCHMARKS.md, "Exact or index:
    the cut-off"). A single tenant's 100k keeps the graph.

    Expired memories are excluded inside both branches, like every filter, so
    they never take a place among the k nearest.
    """
    cast = vector_type(search.embedder.dimensions)
    clauses, params = search.filters.clauses()
    where = " AND ".join(["user_id = %(user)s", "embedding_model = %(model)s", *clauses])
    columns = COLUMNS if rows else "id"
    narrowing = [f"{column} = %(source_{column})s" for column in search.filters.sources]
    if agent or narrowing:
        sized = " AND ".join(["user_id = %(user)s", "namespace = %(namespace)s", *narrowing])
        # Without source filters, the ORDER BY steers the planner to the
        # namespace's b-tree; with them, the planner picks the filter's index.
        order = "" if narrowing else "ORDER BY updated_at DESC"
        small = f"""
            SELECT count(*) <= (SELECT rows FROM cutoff) AS yes FROM (
                SELECT 1 FROM memories WHERE {sized} {order}
                LIMIT (SELECT rows + 1 FROM cutoff)
            ) AS capped"""  # noqa: S608
    else:
        small = """
            SELECT coalesce(max(documents), 0) <= (SELECT rows FROM cutoff) AS yes
            FROM search_namespaces
            WHERE user_id = %(user)s AND namespace = %(namespace)s"""
    filtered = search.filters.narrowing
    # A filtered search of a big namespace first asks for the nearest of the
    # memories its filters match, found through the filters' indexes and
    # measured in the same pass (recall_filtered_nearest, migration 0012), if
    # they number at most RECALL_EXACT_SEARCH_MAX; then it reads those few
    # rows by primary key, else it scans the HNSW index with the filters
    # applied along the way. Not the namespace's cut-off: a filter's matches
    # are scattered, one heap page each. At 100k memories a 1% filter's 969
    # matches took 3.7 ms to find and measure; at 1M, where most pages are
    # not in shared buffers, reading 2,001 of them cost 13-28 ms
    # (BENCHMARKS.md, "A million memories, quiet").
    #
    # That attempt is wasted when more match: the function reads the limit
    # and one more only to answer NULL. On the user-wide path a filter of
    # one metadata key and nothing else has a lower bound on its matches,
    # the pair's count in search_metadata (migration 0013): the namespace's
    # memories of this model without an expiry whose value is exactly this
    # one. Above the limit, the function would answer NULL for certain, and
    # the search goes straight to the index.
    counted = not agent and len(search.filters.metadata) == 1 and not search.filters.others
    broad = (
        """,
        broad AS MATERIALIZED (
            SELECT coalesce(max(memories), 0) > %(exact_max)s AS yes
            FROM search_metadata
            WHERE user_id = %(user)s AND namespace = %(namespace)s
              AND embedding_model = %(model)s AND pair = %(metadata)s::jsonb::text
        )"""
        if filtered and counted
        else ""
    )
    skip = " AND NOT (SELECT yes FROM broad)" if broad else ""
    narrow = (
        f"""{broad},
        matching AS MATERIALIZED (
            SELECT recall_filtered_nearest(
                %(namespace)s, %(model)s, %(created_after)s, %(created_before)s,
                %(metadata)s::jsonb, %(priorities)s, %(sources)s::jsonb, %(exact_max)s,
                (SELECT vector FROM query)::vector, %(nearest)s
            ) AS ids
            WHERE NOT (SELECT yes FROM small){skip}
        ),
        narrow AS MATERIALIZED (
            SELECT coalesce((SELECT ids IS NOT NULL FROM matching), false) AS yes
        )"""  # noqa: S608 (constant CTEs; values are parameters)
        if filtered
        else ""
    )
    ranked_matches = (
        f"""
            UNION ALL
            (
                -- The nearest matches by primary key, whatever the table's statistics.
                SELECT found.*
                FROM unnest((SELECT ids FROM matching)::uuid[]) AS match(id)
                CROSS JOIN LATERAL (
                    SELECT {columns},
                           cosine_distance(embedding::{cast}, (SELECT vector FROM query))
                               AS distance
                    FROM memories
                    -- recall_filtered_nearest applied every filter; the caller's
                    -- own policy applies here again, whatever it returned.
                    WHERE memories.id = match.id AND user_id = %(user)s{{held}}
                    LIMIT 1  -- one row per id; it also stops the planner flattening this
                ) AS found
                WHERE (SELECT yes FROM narrow)
                ORDER BY found.distance
                LIMIT %(nearest)s
            )"""  # noqa: S608
        if filtered
        else ""
    )
    not_narrow = " AND NOT (SELECT yes FROM narrow)" if filtered else ""
    ranked_matches = ranked_matches.replace(
        "{held}", "".join(f" AND {c}" for c in search.filters.held())
    )
    # S608: interpolated are only the vector type (from an int width), the
    # constant column list and clauses built from constants; values are parameters.
    sql = f"""
        query AS MATERIALIZED (SELECT %(vector)s::{cast} AS vector),
        cutoff AS MATERIALIZED ({CUTOFF}),
        small AS MATERIALIZED ({small}
        ){narrow},
        nearest AS MATERIALIZED (
            (
                SELECT {columns},
                       cosine_distance(embedding::{cast}, (SELECT vector FROM query)) AS distance
                FROM memories
                WHERE {where} AND (SELECT yes FROM small)
                ORDER BY distance
                LIMIT %(nearest)s
            ){ranked_matches}
            UNION ALL
            (
                SELECT {columns},
                       (embedding::{cast}) <=> (SELECT vector FROM query) AS distance
                FROM memories
                WHERE {where} AND NOT (SELECT yes FROM small){not_narrow}
                ORDER BY distance
                LIMIT %(nearest)s
            )
        )"""  # noqa: S608
    params.update(
        vector=vector_literal(search.vector),
        model=search.embedder.model_id,
        nearest=count,
        **cutoff_params(search.embedder.model_id, count),
    )
    return sql, params


def semantic_sql(
    user_id: Any, search: Search, *, agent: bool = False, limit: int | None = None
) -> tuple[str, dict[str, Any]]:
    """Return the nearest memories by cosine whose score is at or above the threshold.

    The score is a logistic of the similarity (``scoring.SEMANTIC``), so the
    order is the similarity's. The threshold is applied outside, to the k
    nearest, so it can never make the index scan run long. Priority breaks
    ties, and only ties: the k results are the k most similar (priority
    plays no part in choosing them, nor does it touch the threshold),
    ordered by similarity rounded to two decimals, then priority, then exact
    similarity. A memory can therefore rise only above others less than 0.01
    more similar (BENCHMARKS.md, "Priority as a tie-break").
    """
    count = limit or search.limit
    ctes, params = _nearest(search, count, agent=agent)
    sql = f"""
        WITH {ctes}
        SELECT * FROM (
            SELECT *, 1 - distance AS similarity,
                   1 / (1 + exp(-(%(a)s * (1 - distance) + %(c)s))) AS score,
                   1 / (1 + exp(-(%(a)s * (1 - distance) + %(c)s))) AS rank
            FROM nearest
        ) AS scored
        WHERE score >= %(minimum)s
        ORDER BY round((1 - distance)::numeric, 2) DESC, {PRIORITY_ORDER} DESC, distance, id
    """  # noqa: S608
    line = scoring.line("semantic", search.embedder.default_threshold)
    params.update(user=str(user_id), a=line.similarity, c=line.offset, minimum=search.minimum)
    return sql, params


def ranked_sql(
    user_id: Any, search: Search, *, agent: bool = False, limit: int | None = None
) -> tuple[str, dict[str, Any]]:
    """Return the hybrid or lexical ranking: candidates here, fusion in ``recall_rank()``.

    The nearest-neighbour search stays in this statement, where the model is
    a literal match for its partial HNSW index; the rest runs in
    ``recall_rank()`` (see the migrations), whose plan PostgreSQL keeps per
    connection. Its rows are joined back to ``memories`` here, as the caller
    under its own policy, so only rows it may read are ever returned.

    The memories whose own score reaches the threshold are ranked by
    ``rank``: the score with the neighbours' lift (a memory beside one of
    the five best is raised halfway to it). The k best are the results;
    priority then breaks ties among them as in semantic mode, on the rank
    rounded to two decimals. Each result's ``score`` stays its own.
    """
    hybrid = search.mode == "hybrid"
    if hybrid:
        ctes, params = _nearest(search, POOL, agent=agent, rows=False)
    else:
        cast = vector_type(search.embedder.dimensions)
        ctes = f"""
        query AS MATERIALIZED (SELECT %(vector)s::{cast} AS vector),
        nearest AS (SELECT NULL::uuid AS id, NULL::float8 AS distance WHERE false)"""
        params = {"vector": vector_literal(search.vector), "model": search.embedder.model_id}
        params.update(search.filters.clauses()[1])
    columns = ", ".join(f"m.{name.strip()}" for name in COLUMNS.split(","))
    sql = f"""
        WITH {ctes},
        ranked AS MATERIALIZED (
            SELECT * FROM recall_rank(
                %(namespace)s, %(text)s, (SELECT vector::vector FROM query),
                ARRAY(SELECT id FROM nearest ORDER BY id),
                ARRAY(SELECT distance FROM nearest ORDER BY id), %(model)s,
                %(created_after)s, %(created_before)s, %(metadata)s::jsonb,
                %(priorities)s::text[], %(sources)s::jsonb,
                %(pool)s, %(scan)s, %(k1)s, %(b)s, %(prior)s,
                %(similarity)s, %(coverage)s, %(offset)s,
                %(providers)s, %(window)s, %(lift)s, %(held_until)s, %(current)s
            )
        )
        SELECT {columns}, r.similarity, r.score, r.rank
        FROM (
            SELECT ranked.* FROM ranked
            WHERE ranked.score >= %(minimum)s
            ORDER BY ranked.rank DESC, ranked.similarity DESC, ranked.id
            LIMIT %(limit)s
        ) AS r
        JOIN memories AS m ON m.id = r.id
        WHERE m.user_id = %(user)s AND {LIVE}
        ORDER BY round(r.rank::numeric, 2) DESC, {PRIORITY_ORDER} DESC,
                 r.rank DESC, r.similarity DESC, m.id
    """  # noqa: S608
    line = scoring.line(search.mode, search.embedder.default_threshold)
    params.update(
        user=str(user_id),
        text=search.text,
        minimum=search.minimum,
        limit=limit or search.limit,
        pool=POOL,
        scan=SCAN,
        k1=K1,
        b=B,
        prior=PRIOR,
        similarity=line.similarity,
        coverage=line.coverage,
        offset=line.offset,
        providers=PROVIDERS,
        window=WINDOW,
        lift=LIFT if hybrid else 0.0,
        # Filters.held(), for recall_rank()'s lexical candidates and neighbours.
        held_until=search.filters.until,
        current=not search.filters.include_superseded,
    )
    return sql, params
