"""Newer first: a read-time order for restatements the write did not link.

Detection on write (``memories/supersession``, ``services/superseding.py``)
links a new memory to what it replaces only when it is confident, and only
against the few nearest notes it finds then. What it misses stays current,
and a search may rank the older statement of a fact above the newer one.

``newer_first`` looks at the few best results of a search, after ranking:
when a newer result and an older one ranked above it state the same slot
(the offline detector, given the two texts and their cosine, replaces the
older or finds the pair ambiguous), the newer moves just above the older.
Nothing is hidden or marked, nothing enters or leaves the top ``TOP``
results: it only reorders them, so a hit in the top 5 stays in the top 5.
Look-alikes (a sister's city and a brother's, staging's host and
production's) are what the detector's hard rules keep apart, and they keep
their order here too.

The cost: the detector's text rules on each pair whose later result is the
newer one (its readings are cached; about 0.1 ms for fresh texts), and one
statement for the cosines, only when some pair passes those rules.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Protocol, TypeVar

from django.conf import settings

from memories.models import Memory
from memories.supersession import Candidate, judge

# Only the best few results are reordered: what an agent reads first.
TOP = 5
# Two memories state the same slot when their vectors are this close and the
# detector's evidence for replacement (its logistic score, 0-1) reaches
# SCORE: above its "ambiguous" 0.3, below the 0.6 at which a write links.
# Chosen on the knowledge set's dev part, the only settings there that moved
# no look-alike (BENCHMARKS.md, "Newer first").
SIMILARITY = 0.6
SCORE = 0.5


class Ranked(Protocol):
    """A search result as ``newer_first`` needs it (``search.Found``)."""

    @property
    def memory(self) -> Memory: ...


T = TypeVar("T", bound=Ranked)


Cosines = Callable[[Sequence[tuple[str, str]]], Mapping[tuple[str, str], float]]


def enabled() -> bool:
    """Whether searches reorder: with detection on (``RECALL_SUPERSESSION`` not ``off``)."""
    return str(getattr(settings, "RECALL_SUPERSESSION", "offline")) != "off"


def same_slot(older: str, newer: str, similarity: float) -> bool:
    """Whether ``newer`` likely states a new value for what ``older`` says."""
    if similarity < SIMILARITY:
        return False
    return judge(newer, Candidate("older", older, similarity)).score >= SCORE


def _possible(older: str, newer: str) -> bool:
    # The detector at the highest similarity: its score only grows with the
    # cosine, and a pair its rules keep apart then (a look-alike, another
    # attribute, no new value) they keep apart at any, so the pair's cosine
    # is read only when this passes.
    return same_slot(older, newer, 1.0)


def newer_first(found: list[T], cosines: Cosines) -> list[T]:
    """Return ``found`` with each newer restatement just above the older one, in the top ``TOP``.

    ``cosines`` returns the cosine of each (id, id) pair asked for
    (``search.pair_cosines``: the stored vectors, in the search's transaction).
    """
    top = found[:TOP]
    pairs: list[tuple[int, int]] = []
    for i, upper in enumerate(top):
        for j in range(i + 1, len(top)):
            lower = top[j]
            if _created(lower) > _created(upper) and _possible(_text(upper), _text(lower)):
                pairs.append((i, j))
    if not pairs:
        return found
    ids = [(_id(top[i]), _id(top[j])) for i, j in pairs]
    cosine = cosines(ids)
    moves = [
        (_id(top[i]), _id(top[j]))
        for (i, j), key in zip(pairs, ids, strict=True)
        if key in cosine and same_slot(_text(top[i]), _text(top[j]), cosine[key])
    ]
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


def _id(hit: Ranked) -> str:
    return str(hit.memory.id)


def _text(hit: Ranked) -> str:
    return hit.memory.content


def _created(hit: Ranked) -> datetime:
    return hit.memory.created_at
