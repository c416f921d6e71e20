"""Newer first: a read-time order for restatements the write did not link.

Detection on write (``memories/supersession``, ``services/superseding.py``)
links a new memory to what it replaces only when it is confident, and only
against the few nearest notes it finds then. What it misses stays current,
and a search may rank the older statement of a fact above the newer one.

``newer_first`` looks at the few best results of a search, after ranking.
A newer result moves just above an older one ranked above it when the two
likely state the same slot for this query:

* both are notes of one writer, as detection on write compares them:
  conversation turns and document chunks do not replace each other, and
  one agent's memory does not restate another's (or the user-wide ones),
  nor a note of one task a note of another (or of none);
* the newer is current: a replaced one (``include_superseded``) has
  handed its slot on, perhaps to the older memory itself;
* the texts pass every rule that keeps look-alikes apart
  (``supersession.apart``: contrasting subjects such as a sister and a
  brother, staging and production, morning and dinner; other names up
  front; an addition; another attribute; no subject word in common,
  unless the newer shows a new value; a series' numbered items);
* the newer's priority is not below the older's (a priority is the user's
  own word, and the ranking breaks ties by it);
* their vectors are close (cosine at least ``PAIR``);
* the newer answers the query nearly as well (its cosine to the query at
  most ``LAG`` below the older's): a newer memory about something else
  does not jump ahead of the answer.

Nothing is hidden, nothing enters or leaves the top ``TOP`` results: it
only reorders them, so a hit in the top 5 stays in the top 5.

It does not ask the newer to show a change (a new value of a kind both
hold, a change word): on the second development part that kept two more
look-alikes first and lost two more current facts, and a stale fact first
is what this order is for (BENCHMARKS.md, "Knowledge updates, phase C").

The older of such a pair is also marked (``Arranged.restated``, shown as
``may_be_replaced_by``) when both answer this query: the newer's cosine to
it at most ``MARK_LAG`` below the older's, and the older's at most ``LAG``
below the best result's. Wherever the two stood, so a newer already above
marks its older too. A mark is not a link: nothing is written, and the
caller judges (docs/knowledge-updates.md, "Read marks").

The cost: the text rules on each pair of the top results, either way round
(their readings are cached), and one statement for the pairs' cosines, only
when some pair passes those rules and could move or mark.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Generic, NamedTuple, Protocol, TypeVar

from django.conf import settings

from memories.models import PRIORITY_RANK, Memory, SourceKind
from memories.supersession import apart
from memories.supersession.decide import RENAMED

_RANK: dict[str, int] = {str(name): rank for name, rank in PRIORITY_RANK.items()}

# Only the best few results are reordered: what an agent reads first.
TOP = 5
# Chosen on the knowledge-update set's dev part (BENCHMARKS.md, "Newer
# first"): the pair's cosine floor, and how much less the newer may match
# the query than the older it moves above.
PAIR = 0.5
LAG = 0.2
# A pair marks the older only when the newer answers the query this nearly
# as well (BENCHMARKS.md, "Knowledge updates, read marks"; 0.1 until the
# subject rules kept more look-alikes apart: "a mark's lag, again").
MARK_LAG = 0.15
# ``apart`` lets two texts with no subject word in common through when the
# newer shows a new value, on the understanding that their cosine reaches
# ``RENAMED``: the pair's floor must not go below it.
assert PAIR >= RENAMED, "newer first would move reworded pairs the detector calls too far apart"


class Ranked(Protocol):
    """A search result as ``newer_first`` needs it (``search.Found``)."""

    @property
    def memory(self) -> Memory: ...

    @property
    def similarity(self) -> float: ...


T = TypeVar("T", bound=Ranked)


Cosines = Callable[[Sequence[tuple[str, str]]], Mapping[tuple[str, str], float]]


def enabled() -> bool:
    """Whether searches reorder: ``RECALL_NEWER_FIRST``, and detection on (not ``off``)."""
    return bool(getattr(settings, "RECALL_NEWER_FIRST", True)) and (
        str(getattr(settings, "RECALL_SUPERSESSION", "offline")) != "off"
    )


def _restates(older: Ranked, newer: Ranked) -> bool:
    """Whether ``newer`` may restate ``older``'s slot, before their vectors are compared."""
    return (
        newer.memory.created_at > older.memory.created_at
        and older.memory.source_kind == newer.memory.source_kind == SourceKind.NOTE
        and older.memory.agent_id == newer.memory.agent_id
        and older.memory.task_id == newer.memory.task_id
        # Notes attributed to different authors (seed 003's author) are
        # different sources: one never restates the other.
        and (older.memory.author or "") == (newer.memory.author or "")
        # A replaced memory (shown with include_superseded) restates nothing:
        # what replaced it holds the slot, and may be the older memory here.
        and newer.memory.superseded_by is None
        # A priority is the user's own word: never above a higher one.
        and _priority(newer) >= _priority(older)
        and newer.similarity >= older.similarity - LAG
        and apart(older.memory.content, newer.memory.content) is None
    )


class Arranged(NamedTuple, Generic[T]):
    """A search's results in their new order, and which of them a newer one may replace."""

    found: list[T]
    # An older result's id -> the newest result that likely restates its slot.
    restated: dict[str, str]


def newer_first(found: list[T], cosines: Cosines) -> Arranged[T]:
    """Put each newer restatement just above the older one in the top ``TOP``, and mark the older.

    ``cosines`` returns the cosine of each (id, id) pair asked for
    (``search.pair_cosines``: the stored vectors, under the caller's tenancy).
    An older result is marked (``restated``) when it answers the query
    nearly as well as the best result (``LAG``) and its restatement answers
    it nearly as well as it does (``MARK_LAG``), wherever the two stood.
    """
    top = found[:TOP]
    best = max((hit.similarity for hit in top), default=0.0)

    def markable(older: Ranked, newer: Ranked) -> bool:
        # An answer to this query (nearly as close to it as the best result)
        # that its restatement answers nearly as well. A replaced memory
        # (include_superseded) already carries its own mark.
        return (
            older.memory.superseded_by is None
            and older.similarity >= best - LAG
            and newer.similarity >= older.similarity - MARK_LAG
        )

    # A pair is compared when the newer could move (it stands below) or could
    # mark the older; a pair already in order that could not mark costs nothing.
    pairs = [
        (older, newer)
        for i in range(len(top))
        for j in range(i + 1, len(top))
        for older, newer in ((top[i], top[j]), (top[j], top[i]))
        if _restates(older, newer) and (older is top[i] or markable(older, newer))
    ]
    if not pairs:
        return Arranged(found, {})
    cosine = cosines([(_id(older), _id(newer)) for older, newer in pairs])
    close = [
        (older, newer)
        for older, newer in pairs
        if cosine.get((_id(older), _id(newer)), 0.0) >= PAIR
    ]
    if not close:
        return Arranged(found, {})
    restated: dict[str, Ranked] = {}
    for older, newer in close:
        if markable(older, newer):
            known = restated.get(_id(older))
            if known is None or newer.memory.created_at > known.memory.created_at:
                restated[_id(older)] = newer
    marked = {older: _id(newer) for older, newer in restated.items()}
    order = list(top)
    by_id = {_id(hit): hit for hit in order}
    moves = [(_id(older), _id(newer)) for older, newer in close]
    # A chain (v1, v2, v3) settles in a few passes; each move puts a newer
    # memory above an older one, so the passes end.
    for _ in range(len(order)):
        moved = False
        for older_id, newer_id in moves:
            keys = [_id(hit) for hit in order]
            at_old, at_new = keys.index(older_id), keys.index(newer_id)
            if at_old < at_new:
                order.pop(at_new)
                order.insert(at_old, by_id[newer_id])
                moved = True
        if not moved:
            break
    return Arranged(order + found[TOP:], marked)


def _priority(hit: Ranked) -> int:
    return _RANK.get(str(hit.memory.priority), 1)


def _id(hit: Ranked) -> str:
    return str(hit.memory.id)
