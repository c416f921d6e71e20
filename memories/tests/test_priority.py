"""Priority: stored, filterable, and a tie-break that never outranks relevance."""

from __future__ import annotations

import pytest

from accounts.tiers import Tier
from core.errors import ValidationFailed
from memories import services


def remember(user_id, content, priority=None, namespace="default"):
    return services.remember(
        user_id=user_id, tier=Tier.PRO, content=content, priority=priority, namespace=namespace
    )["id"]


def test_a_memory_is_medium_unless_told_otherwise(cast):
    remember(cast.alice.id, "ordinary")
    remember(cast.alice.id, "vital", "critical")

    listed = {m["content"]: m["priority"] for m in services.list_memories(user_id=cast.alice.id)}

    assert listed == {"ordinary": "medium", "vital": "critical"}


def test_recall_and_list_filter_by_one_priority_or_several(cast):
    for level in ("critical", "high", "medium", "low"):
        remember(cast.alice.id, f"The user's {level} note about coffee.", level)

    def recalled(priority):
        found = services.recall(
            user_id=cast.alice.id, query="coffee", threshold=0, priority=priority
        )
        return sorted(m["priority"] for m in found)

    def listed(priority):
        return sorted(
            m["priority"] for m in services.list_memories(user_id=cast.alice.id, priority=priority)
        )

    assert recalled("high") == listed("high") == ["high"]
    assert recalled(["critical", "high"]) == listed(["critical", "high"]) == ["critical", "high"]
    assert len(recalled(None)) == len(listed(None)) == 4


@pytest.mark.parametrize("bad", ["urgent", ["high", "urgent"], [], 3])
def test_an_unknown_priority_is_refused(cast, bad):
    with pytest.raises(ValidationFailed, match="priority must be"):
        services.recall(user_id=cast.alice.id, query="x", priority=bad)
    with pytest.raises(ValidationFailed, match="priority must be"):
        services.list_memories(user_id=cast.alice.id, priority=bad)


def test_update_changes_the_priority(cast):
    memory_id = remember(cast.alice.id, "rising in importance", "low")

    services.update_memory(user_id=cast.alice.id, id=memory_id, priority="critical")

    [listed] = services.list_memories(user_id=cast.alice.id)
    assert listed["priority"] == "critical"


def test_between_equally_similar_memories_the_higher_priority_comes_first(cast):
    # Two phrasings the model finds equally close to the query, to two decimals.
    # The low one is the newer: newer first (memories/ordering.py) would put a
    # restatement above the older, but never above a higher priority.
    high = remember(cast.alice.id, "The user drinks green tea each morning.", "high")
    low = remember(cast.alice.id, "The user drinks green tea every morning.", "low")

    # Semantic mode, where ties are on similarity (hybrid's coverage tells these apart).
    ask = {"query": "What does the user drink?", "threshold": 0, "mode": "semantic"}
    found = services.recall(user_id=cast.alice.id, **ask)

    assert [m["id"] for m in found] == [high, low]
    assert round(found[0]["similarity"], 2) == round(found[1]["similarity"], 2)
    # Without the priority, the low one is (slightly) the closer.
    services.update_memory(user_id=cast.alice.id, id=high, priority="low")
    again = services.recall(user_id=cast.alice.id, **ask)
    assert [m["id"] for m in again] == [low, high]


def test_a_critical_memory_never_rises_above_a_clearly_more_relevant_one(cast):
    relevant = remember(cast.alice.id, "The user drinks green tea every morning.", "low")
    remember(cast.alice.id, "The quarterly report is due on Friday.", "critical")

    found = services.recall(user_id=cast.alice.id, query="What does the user drink?", threshold=0)

    assert found[0]["id"] == relevant
    assert found[0]["priority"] == "low"


def test_priority_never_lets_a_memory_past_the_threshold(cast):
    remember(cast.alice.id, "The quarterly report is due on Friday.", "critical")

    found = services.recall(user_id=cast.alice.id, query="What does the user drink?", threshold=0.5)

    assert found == []


def test_priority_never_changes_which_memories_make_the_limit(cast):
    nearest = remember(cast.alice.id, "The user drinks green tea every morning.", "low")
    remember(cast.alice.id, "The user drinks green tea each morning.", "low")
    remember(cast.alice.id, "The user sometimes has coffee after lunch.", "critical")

    found = services.recall(
        user_id=cast.alice.id, query="What does the user drink?", threshold=0, limit=2
    )

    assert nearest in [m["id"] for m in found]
    assert "critical" not in [m["priority"] for m in found]
