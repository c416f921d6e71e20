"""Newer first: a read-time order for restatements the write did not link.

Detection on write (``memories/supersession``, ``services/superseding.py``)
links a new memory to what it replaces only when it is confident, and only
against the few nearest notes it finds then. What it misses stays current,
and a search may rank the older statement of a fact above the newer one.

``newer_first`` looks at the few best results of a search, after ranking.
A newer result moves just above an older one ranked above it when the two
likely state the same slot for this query:

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

Nothing is hidden or marked, nothing enters or leaves the top ``TOP``
results: it only reorders them, so a hit in the top 5 stays in the top 5.
It does not ask the newer to show a change (a new value of a kind both
hold, a change word): on the second development part that kept two more
look-alikes first and lost two more current facts, and a stale fact first
is what this order is for (BENCHMARKS.md, "Knowledge updates, phase C").

The cost: the text rules on each pair whose later result is the newer one
(their readings are cached), and one statement for the pairs' cosines, only
when some pair passes those rules.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Protocol, TypeVar

from django.conf import settings

from memories.models import PRIORITY_RANK, Memory
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


def _candidate(upper: Ranked, lower: Ranked) -> bool:
    """Whether ``lower`` may move above ``upper``, before their vectors are compared."""
    return (
        lower.memory.created_at > upper.memory.created_at
        # A priority is the user's own word: never above a higher one.
        and _priority(lower) >= _priority(upper)
        and lower.similarity >= upper.similarity - LAG
        and apart(upper.memory.content, lower.memory.content) is None
    )


def newer_first(found: list[T], cosines: Cosines) -> list[T]:
    """Return ``found`` with each newer restatement just above the older one, in the top ``TOP``.

    ``cosines`` returns the cosine of each (id, id) pair asked for
    (``search.pair_cosines``: the stored vectors, under the caller's tenancy).
    """
    top = found[:TOP]
    pairs = [
        (i, j)
        for i in range(len(top))
        for j in range(i + 1, len(top))
        if _candidate(top[i], top[j])
    ]
    if not pairs:
        return found
    ids = [(_id(top[i]), _id(top[j])) for i, j in pairs]
    cosine = cosines(ids)
    moves = [key for key in ids if cosine.get(key, 0.0) >= PAIR]
    if not moves:
        return found
    order = list(top)
    by_id = {_id(hit): hit for hit in order}
    # A chain (v1, v2, v3) settles in a few passes; each move puts a newer
    # memory above an older one, so the passes end.
    for _ in range(len(order)):
        moved = False
        for older, newer in moves:
            keys = [_id(hit) for hit in order]
            at_old, at_new = keys.index(older), keys.index(newer)
            if at_old < at_new:
                order.pop(at_new)
                order.insert(at_old, by_id[newer])
                moved = True
        if not moved:
            break
    return order + found[TOP:]


def _priority(hit: Ranked) -> int:
    return _RANK.get(str(hit.memory.priority), 1)


def _id(hit: Ranked) -> str:
    return str(hit.memory.id)
