"""``similarity`` is shown from 0 to 1, as the tools' output describes it."""

from __future__ import annotations

from accounts.tiers import Tier
from memories import services


def test_a_result_facing_away_from_the_query_shows_similarity_0(cast):
    # Cosine runs from -1: "null" against this note is about -0.08, which the
    # tools showed as such, though their output says 0-1.
    services.remember(
        user_id=cast.alice.id, tier=Tier.PRO, content="The Kubernetes cluster runs on three nodes."
    )

    [found] = services.recall(user_id=cast.alice.id, query="null", threshold=0, mode="semantic")
    preview = services.forget(user_id=cast.alice.id, mode="by_query", query="null", threshold=0)

    assert found["similarity"] == 0.0
    assert [m["similarity"] for m in preview["matches"]] == [0.0]
