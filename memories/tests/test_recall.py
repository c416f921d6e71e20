from __future__ import annotations

import contextlib

import pytest
from django.db import transaction

from accounts.tiers import Tier
from core.errors import ValidationFailed
from memories import scoring, services

FRAMEWORKS = (
    "The user prefers Python for data analysis and prefers FastAPI over Flask for web services."
)
DISTRACTORS = [
    "The user's cat is called Miso and sleeps on the keyboard.",
    "Dinner reservations are at 7pm on Friday at the Thai place.",
    "The quarterly tax filing is due on the fifteenth of April.",
    "The user runs five kilometres every Sunday morning.",
    "Grandmother's birthday is on the third of June.",
    "The office thermostat is set to 21 degrees.",
    "The user is allergic to peanuts and shellfish.",
    "The car needs new winter tyres before December.",
    "The user's favourite film is Spirited Away.",
    "Book club meets on the last Thursday of each month.",
    "The garden hose leaks near the tap.",
    "The user wants to learn to play the cello.",
]


def remember_all(user_id, contents, namespace="default", metadata=None):
    return [
        services.remember(
            user_id=user_id, tier=Tier.PRO, content=c, namespace=namespace, metadata=metadata
        )["id"]
        for c in contents
    ]


def test_it_ranks_the_relevant_memory_first_among_distractors(cast):
    remember_all(cast.alice.id, [*DISTRACTORS[:6], FRAMEWORKS, *DISTRACTORS[6:]])

    results = services.recall(
        user_id=cast.alice.id, query="What are the user's web framework preferences?", threshold=0
    )

    assert results[0]["content"] == FRAMEWORKS
    # The best score leads; the memories stored beside it (DISTRACTORS[4:8])
    # are lifted up the list, but keep their own, lower scores.
    scores = [r["score"] for r in results]
    assert scores[0] == max(scores) >= 0.5
    assert max(scores[1:]) < 0.15
    lifted = {r["content"] for r in results[1:5]}
    assert lifted == set(DISTRACTORS[4:8])


def test_semantic_mode_ranks_by_cosine_similarity_alone(cast):
    remember_all(cast.alice.id, [*DISTRACTORS[:6], FRAMEWORKS, *DISTRACTORS[6:]])

    results = services.recall(
        user_id=cast.alice.id,
        query="What are the user's web framework preferences?",
        threshold=0,
        mode="semantic",
    )

    assert results[0]["content"] == FRAMEWORKS
    similarities = [r["similarity"] for r in results]
    assert similarities == sorted(similarities, reverse=True)
    # Scored by the similarity alone (its calibrated logistic), in the same order.
    scores = [r["score"] for r in results]
    assert scores == sorted(scores, reverse=True)
    assert scores == pytest.approx([scoring.SEMANTIC.score(s) for s in similarities], abs=1e-3)


def test_the_limit_defaults_to_ten(cast):
    remember_all(
        cast.alice.id, [f"Note {n}: the user builds web APIs in Python." for n in range(12)]
    )

    results = services.recall(user_id=cast.alice.id, query="Python web APIs", threshold=0)

    assert len(results) == 10


def test_each_result_has_the_specified_fields(cast):
    [memory_id] = remember_all(cast.alice.id, [FRAMEWORKS], "preferences", {"source": "chat"})

    [result] = services.recall(
        user_id=cast.alice.id, query="web frameworks", namespace="preferences", threshold=0
    )

    assert set(result) == {
        "id",
        "content",
        "similarity",
        "score",
        "metadata",
        "namespace",
        "priority",
        "created_at",
        "expires_at",
    }
    assert result["id"] == memory_id
    assert result["metadata"] == {"source": "chat"}
    assert result["namespace"] == "preferences"
    assert result["created_at"].endswith("Z")
    assert 0 < result["similarity"] <= 1
    assert 0 <= result["score"] <= 1


def test_the_threshold_drops_weak_matches(cast):
    remember_all(cast.alice.id, [FRAMEWORKS, *DISTRACTORS])

    results = services.recall(
        user_id=cast.alice.id, query="Which web framework does the user like?", threshold=0.45
    )

    assert [r["content"] for r in results] == [FRAMEWORKS]


def test_the_default_threshold_keeps_a_clear_match_and_drops_unrelated_ones(cast):
    remember_all(cast.alice.id, [FRAMEWORKS, *DISTRACTORS])

    results = services.recall(
        user_id=cast.alice.id, query="What web framework does the user prefer?"
    )

    assert results and results[0]["content"] == FRAMEWORKS
    assert "The garden hose leaks near the tap." not in [r["content"] for r in results]


def test_it_searches_only_the_given_namespace(cast):
    remember_all(cast.alice.id, [FRAMEWORKS], namespace="work")
    remember_all(cast.alice.id, DISTRACTORS[:3], namespace="home")

    results = services.recall(
        user_id=cast.alice.id, query="web framework", namespace="home", threshold=0
    )

    assert FRAMEWORKS not in [r["content"] for r in results]
    assert {r["namespace"] for r in results} == {"home"}


def test_the_limit_caps_the_results(cast):
    remember_all(
        cast.alice.id, [f"Note {n}: the user builds web APIs in Python." for n in range(5)]
    )
    assert len(services.recall(user_id=cast.alice.id, query="Python", limit=3, threshold=0)) == 3


def test_metadata_filter_requires_every_key_to_match(cast):
    services.remember(
        user_id=cast.alice.id,
        tier=Tier.PRO,
        content=FRAMEWORKS,
        metadata={"source": "conversation", "confidence": 0.95, "pinned": True},
    )
    services.remember(
        user_id=cast.alice.id,
        tier=Tier.PRO,
        content="The user prefers Django for web apps.",
        metadata={"source": "import", "confidence": 0.95},
    )

    def contents(**filters):
        found = services.recall(
            user_id=cast.alice.id, query="web framework", threshold=0, metadata_filter=filters
        )
        return [r["content"] for r in found]

    assert contents(source="conversation") == [FRAMEWORKS]
    assert contents(confidence=0.95, pinned=True) == [FRAMEWORKS]
    assert len(contents(confidence=0.95)) == 2
    assert contents(source="conversation", confidence=0.5) == []
    assert contents(missing=None) == []


def test_alice_never_recalls_charlies_memories(cast):
    remember_all(cast.charlie.id, [FRAMEWORKS])
    remember_all(cast.alice.id, DISTRACTORS[:2])

    results = services.recall(user_id=cast.alice.id, query=FRAMEWORKS, threshold=0)

    assert FRAMEWORKS not in [r["content"] for r in results]
    assert len(results) == 2


def test_an_empty_namespace_returns_no_results(cast):
    assert services.recall(user_id=cast.alice.id, query="anything", threshold=0) == []


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"query": ""}, "query must not be empty"),
        ({"query": "q" * 10_001}, "maximum is 10,000"),
        ({"query": None}, "query must be a string"),
        ({"limit": 0}, "limit must be an integer from 1 to 50"),
        ({"limit": 51}, "limit must be an integer from 1 to 50"),
        ({"limit": 2.5}, "limit must be an integer"),
        ({"limit": "10"}, "limit must be an integer"),
        ({"limit": True}, "limit must be an integer"),
        ({"threshold": -0.01}, "threshold must be a number from 0 to 1"),
        ({"threshold": 1.01}, "threshold must be a number from 0 to 1"),
        ({"threshold": "high"}, "threshold must be a number"),
        ({"threshold": float("nan")}, "threshold must be a number"),
        ({"namespace": "bad namespace"}, "namespace must be"),
        ({"metadata_filter": {f"k{n}": n for n in range(9)}}, "at most 8 keys"),
        ({"metadata_filter": {"tags": ["a"]}}, "strings, numbers, booleans or null"),
        ({"metadata_filter": {"nested": {"a": 1}}}, "strings, numbers, booleans or null"),
        ({"metadata_filter": "source=chat"}, "metadata_filter must be a JSON object"),
    ],
)
def test_it_refuses_bad_input(cast, kwargs, fragment):
    arguments = {"query": "valid query", **kwargs}
    with pytest.raises(ValidationFailed) as caught:
        services.recall(user_id=cast.alice.id, **arguments)
    assert fragment in caught.value.message


def test_bounds_are_inclusive(cast):
    remember_all(cast.alice.id, DISTRACTORS[:2])
    assert services.recall(user_id=cast.alice.id, query="q" * 10_000, limit=50, threshold=0)
    # No distractor is the query's vector, and none holds all of "cosine 1" either.
    assert services.recall(user_id=cast.alice.id, query="cosine 1", limit=1, threshold=1.0) == []
    eight = {f"k{n}": n for n in range(8)}
    assert services.recall(user_id=cast.alice.id, query="cat", metadata_filter=eight) == []


def test_a_filter_finds_every_key_remember_accepts_the_empty_one_too(cast):
    odd = services.remember(
        user_id=cast.alice.id, tier=Tier.PRO, content="The cat sleeps.", metadata={"": 1, " ": "x"}
    )["id"]
    services.remember(user_id=cast.alice.id, tier=Tier.PRO, content="The cat eats.")

    for where in ({"": 1}, {" ": "x"}):
        found = services.recall(user_id=cast.alice.id, query="cat", metadata_filter=where)
        assert [m["id"] for m in found] == [odd]


class _Undo(Exception):
    pass


def test_a_small_namespace_is_ranked_exactly_even_when_the_graph_is_degenerate(cast):
    # Many identical vectors (here: the same four sentences, stored and rolled
    # back twenty times) saturate HNSW neighbour lists, and elements inserted
    # afterwards can become unreachable from the graph's entry point. Before
    # small namespaces were ranked by an exact scan, this lost every memory.
    for _ in range(20):
        with contextlib.suppress(_Undo), transaction.atomic():
            for n in range(3):
                services.remember(user_id=cast.alice.id, tier=Tier.PRO, content=f"alice {n}")
            services.remember(user_id=cast.charlie.id, tier=Tier.PRO, content="charlie 0")
            raise _Undo
    contents = [*DISTRACTORS, FRAMEWORKS]
    ids = remember_all(cast.alice.id, contents)

    for memory_id, content in zip(ids, contents, strict=True):
        found = services.recall(user_id=cast.alice.id, query=content, limit=1, threshold=0)
        assert [r["id"] for r in found] == [memory_id]
