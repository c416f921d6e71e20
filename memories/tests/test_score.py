"""``score`` is an absolute relevance: a memory's own, comparable across queries and namespaces.

Until issue 22 the hybrid score was min-max normalised over each query's
candidates: a lone match scored 0.0, the best of any pool near 1. These
tests hold the new meaning on the real database, in every mode.
"""

from __future__ import annotations

from typing import Any

import pytest

from accounts.tiers import Tier
from memories import scoring, search, services
from memories.tests.test_recall import DISTRACTORS, FRAMEWORKS

MODES = ["hybrid", "semantic", "lexical"]
WIFI = "The wifi password at the lake house is blue-heron-42."


def remember(user_id, content, namespace="default") -> str:
    return services.remember(user_id=user_id, tier=Tier.PRO, content=content, namespace=namespace)[
        "id"
    ]


def recalled(user_id, query, **arguments) -> list[Any]:
    return list(services.recall(user_id=user_id, query=query, **arguments))


@pytest.mark.parametrize("mode", MODES)
def test_a_lone_relevant_memory_scores_at_least_one_half(cast, mode):
    remember(cast.alice.id, WIFI)

    found = recalled(cast.alice.id, "wifi password", mode=mode, threshold=0)

    assert [r["content"] for r in found] == [WIFI]
    assert found[0]["score"] >= 0.5


@pytest.mark.parametrize("mode", ["hybrid", "semantic"])
def test_an_unrelated_query_scores_lower_than_a_relevant_one(cast, mode):
    remember(cast.alice.id, WIFI)

    relevant = recalled(cast.alice.id, "wifi password", mode=mode, threshold=0)
    unrelated = recalled(cast.alice.id, "When is grandmother's birthday?", mode=mode, threshold=0)

    assert unrelated[0]["score"] < 0.5 <= relevant[0]["score"]
    assert unrelated[0]["score"] < relevant[0]["score"] - 0.3


def test_the_default_threshold_returns_nothing_when_nothing_is_relevant(cast):
    remember(cast.alice.id, WIFI)
    for content in DISTRACTORS:
        remember(cast.alice.id, content)

    assert recalled(cast.alice.id, "Which port does the Kafka broker listen on?") == []
    # At threshold 0 the same search ranks them all, each far below one half.
    everything = recalled(cast.alice.id, "Which port does the Kafka broker listen on?", threshold=0)
    assert everything and max(r["score"] for r in everything) < search.default_threshold()


@pytest.mark.parametrize("mode", MODES)
def test_a_memory_scores_alike_in_namespaces_of_different_sizes(cast, mode):
    remember(cast.alice.id, FRAMEWORKS, namespace="alone")
    remember(cast.alice.id, FRAMEWORKS, namespace="crowded")
    for content in DISTRACTORS:
        remember(cast.alice.id, content, namespace="crowded")
    query = "Which web framework does the user prefer?"

    alone = recalled(cast.alice.id, query, namespace="alone", mode=mode, threshold=0)
    crowded = recalled(cast.alice.id, query, namespace="crowded", mode=mode, threshold=0)

    assert alone[0]["content"] == crowded[0]["content"] == FRAMEWORKS
    assert alone[0]["score"] >= 0.5
    if mode == "semantic":
        assert alone[0]["score"] == pytest.approx(crowded[0]["score"], abs=1e-6)
    else:
        # Coverage reads each namespace's word statistics (IDF, lengths): close, not equal.
        assert alone[0]["score"] == pytest.approx(crowded[0]["score"], abs=0.1)


def test_scores_compare_across_queries(cast):
    for content in [FRAMEWORKS, *DISTRACTORS]:
        remember(cast.alice.id, content)

    good = recalled(cast.alice.id, "Which web framework does the user prefer?", threshold=0)
    poor = recalled(cast.alice.id, "How tall is the Eiffel tower?", threshold=0)

    # Min-max scoring gave each query's best candidate the top of the scale.
    assert good[0]["score"] >= 0.5
    assert poor[0]["score"] < 0.2
    assert poor[0]["score"] < good[0]["score"]


@pytest.mark.parametrize("mode", MODES)
def test_the_threshold_filters_on_the_score(cast, mode):
    for content in [FRAMEWORKS, *DISTRACTORS]:
        remember(cast.alice.id, content)
    query = "What does the user like to eat or drink, and which programs?"
    everything = recalled(cast.alice.id, query, mode=mode, threshold=0)
    scores = sorted({round(r["score"], 6) for r in everything}, reverse=True)
    assert len(scores) >= 2
    cut = (scores[0] + scores[1]) / 2

    kept = recalled(cast.alice.id, query, mode=mode, threshold=cut)

    assert [r["id"] for r in kept] == [r["id"] for r in everything if r["score"] >= cut]
    assert all(r["score"] >= cut for r in kept)


def test_the_threshold_is_not_a_similarity(cast):
    # The threshold reads the score: a memory more similar than the threshold
    # but scoring less is left out, one less similar but scoring more is kept.
    for content in [FRAMEWORKS, *DISTRACTORS]:
        remember(cast.alice.id, content)
    query = "Which web framework does the user prefer?"
    everything = recalled(cast.alice.id, query, mode="semantic", threshold=0)
    high = next(r for r in everything if r["score"] - r["similarity"] > 0.05)
    low = next(r for r in everything if r["similarity"] - r["score"] > 0.05)

    above = recalled(cast.alice.id, query, mode="semantic", threshold=high["similarity"] + 0.02)
    below = recalled(cast.alice.id, query, mode="semantic", threshold=low["score"] + 0.02)

    assert high["id"] in [r["id"] for r in above]
    assert low["id"] not in [r["id"] for r in below]


def test_the_default_threshold_is_the_scores_and_a_setting_moves_it(cast, settings):
    settings.RECALL_DEFAULT_THRESHOLD = None
    assert search.default_threshold() == scoring.THRESHOLD
    remember(cast.alice.id, WIFI)
    [found] = recalled(cast.alice.id, "wifi password")

    settings.RECALL_DEFAULT_THRESHOLD = min(1.0, found["score"] + 0.001)

    assert search.default_threshold() == settings.RECALL_DEFAULT_THRESHOLD
    assert recalled(cast.alice.id, "wifi password") == []


def test_a_lone_match_scores_what_the_formula_says(cast):
    remember(cast.alice.id, WIFI)

    [found] = recalled(cast.alice.id, "wifi password", mode="semantic", threshold=0)

    # Both are rounded to four decimals in results.
    assert found["score"] == pytest.approx(scoring.SEMANTIC.score(found["similarity"]), abs=1e-3)


def test_forget_previews_the_same_absolute_scores(cast):
    remember(cast.alice.id, WIFI)

    preview = services.forget_preview(user_id=cast.alice.id, query="wifi password")
    [found] = recalled(cast.alice.id, "wifi password")

    assert [m["score"] for m in preview["matches"]] == [found["score"]]
    assert found["score"] >= 0.5


def test_a_neighbour_is_lifted_up_the_list_but_keeps_its_own_score(cast):
    # Stored as conversation turns are: the memories just before and after a
    # strong match rise in the list (the answer often sits beside the turn
    # naming the subject), but their scores stay their own, and the default
    # threshold reads those.
    for content in [*DISTRACTORS[:6], FRAMEWORKS, *DISTRACTORS[6:]]:
        remember(cast.alice.id, content)
    query = "Which web framework does the user prefer?"

    everything = recalled(cast.alice.id, query, threshold=0)
    by_default = recalled(cast.alice.id, query)

    assert everything[0]["content"] == FRAMEWORKS
    neighbours = set(DISTRACTORS[4:8])
    assert {r["content"] for r in everything[1:5]} == neighbours
    lifted = [r["score"] for r in everything[1:5]]
    others = [r["score"] for r in everything[5:]]
    assert min(lifted) < max(others)  # listed above a memory that scores more
    assert [r["content"] for r in by_default] == [FRAMEWORKS]
