"""Search modes, the threshold's rule, date filters and isolation, through the one search service.

The mechanics every mode shares (fields, limits, metadata filters) are in
test_recall.py; the lexical index itself in test_search_index.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection

from accounts.tiers import Tier
from core import tenancy
from core.errors import ValidationFailed
from memories import embeddings, scoring, search, services
from memories.tests.fake_openai import serving

MODES = ["hybrid", "semantic", "lexical"]

NOTES = [
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
PASSPORT = "Zephyrine's passport number is X4471902."


def remember(user_id, content, namespace="default", metadata=None) -> str:
    return services.remember(
        user_id=user_id, tier=Tier.PRO, content=content, namespace=namespace, metadata=metadata
    )["id"]


def contents(results) -> list[str]:
    return [r["content"] for r in results]


# Modes ---------------------------------------------------------------------------------


def test_hybrid_is_the_default_and_orders_by_score(cast):
    for note in NOTES:
        remember(cast.alice.id, note)

    default = services.recall(user_id=cast.alice.id, query="What is the cat called?", threshold=0)
    hybrid = services.recall(
        user_id=cast.alice.id, query="What is the cat called?", threshold=0, mode="hybrid"
    )

    assert default == hybrid
    assert contents(default)[0] == NOTES[0]
    scores = [r["score"] for r in default]
    assert scores[0] == max(scores)  # a lift moves memories up the list, not past it
    assert all(0 <= r["score"] <= 1 and -1 <= r["similarity"] <= 1 for r in default)


def test_semantic_mode_orders_by_similarity_and_scores_it(cast):
    for note in NOTES:
        remember(cast.alice.id, note)

    found = services.recall(
        user_id=cast.alice.id, query="a pet that naps on computers", threshold=0, mode="semantic"
    )

    assert contents(found)[0] == NOTES[0]
    similarities = [r["similarity"] for r in found]
    assert similarities == sorted(similarities, reverse=True)
    # The score is the similarity's calibrated logistic (results round to 4 places).
    assert [r["score"] for r in found] == pytest.approx(
        [scoring.SEMANTIC.score(s) for s in similarities], abs=1e-3
    )


def test_lexical_mode_returns_only_memories_sharing_a_word_best_first(cast):
    for note in NOTES:
        remember(cast.alice.id, note)

    found = services.recall(
        user_id=cast.alice.id, query="user favourite film", threshold=0, mode="lexical"
    )

    assert contents(found)[0] == NOTES[8]  # all three words
    assert all("user" in r["content"].lower() or "film" in r["content"] for r in found)
    assert set(contents(found)) == {n for n in NOTES if "user" in n.lower()}
    scores = [r["score"] for r in found]
    assert scores == sorted(scores, reverse=True)


def test_the_server_wide_default_mode_is_a_setting(cast, settings):
    for note in NOTES:
        remember(cast.alice.id, note)
    settings.RECALL_SEARCH_MODE = "semantic"

    found = services.recall(user_id=cast.alice.id, query="sleepy cat", threshold=0)

    assert [r["score"] for r in found] == pytest.approx(
        [scoring.SEMANTIC.score(r["similarity"]) for r in found], abs=1e-3
    )


def test_metadata_strings_are_searched_as_words(cast):
    remember(
        cast.alice.id, "Ship the release notes before Friday.", metadata={"project": "Orinoco"}
    )
    for note in NOTES:
        remember(cast.alice.id, note)

    found = services.recall(user_id=cast.alice.id, query="Orinoco", mode="lexical")

    assert contents(found) == ["Ship the release notes before Friday."]


def test_a_word_inside_a_host_or_an_address_is_found_lexically(cast):
    remember(cast.alice.id, "Outgoing mail is relayed through smtp.sendgrid.net.")
    remember(cast.alice.id, "Journalists write to press@lumen.dev.")
    for note in NOTES:
        remember(cast.alice.id, note)

    for word, content in (
        ("sendgrid", "Outgoing mail is relayed through smtp.sendgrid.net."),
        ("lumen press", "Journalists write to press@lumen.dev."),
        ("smtp.sendgrid.net", "Outgoing mail is relayed through smtp.sendgrid.net."),
    ):
        found = services.recall(user_id=cast.alice.id, query=word, mode="lexical")
        assert contents(found) == [content], word


# What the threshold keeps ----------------------------------------------------------------


def test_a_rare_number_is_found_in_hybrid_mode_when_cosine_misses_it(cast):
    for note in NOTES:
        remember(cast.alice.id, note)
    remember(cast.alice.id, PASSPORT)

    semantic = services.recall(user_id=cast.alice.id, query="X4471902", mode="semantic")
    hybrid = services.recall(user_id=cast.alice.id, query="X4471902")

    # The local model puts the passport below its similarity threshold (0.35):
    # by cosine alone it is a weak match; its number makes it a clear one.
    [passport] = [r for r in semantic if r["content"] == PASSPORT]
    assert passport["score"] < 0.5
    assert contents(hybrid)[0] == PASSPORT
    assert hybrid[0]["similarity"] < embeddings.get_embedder().default_threshold
    assert hybrid[0]["score"] >= 0.5


def test_a_rare_name_in_a_longer_question_is_found_too(cast):
    for note in NOTES:
        remember(cast.alice.id, note)
    remember(cast.alice.id, PASSPORT)

    found = services.recall(user_id=cast.alice.id, query="What do we know about Zephyrine?")

    assert contents(found)[0] == PASSPORT


def test_memories_matching_only_a_common_word_stay_below_the_threshold(cast):
    for note in NOTES:
        remember(cast.alice.id, note)

    # "user" is in a third of the notes: no share of this question to speak of.
    found = services.recall(
        user_id=cast.alice.id, query="Which user drives a red tractor?", threshold=0.7
    )

    assert found == []


@pytest.fixture
def openai_model(settings) -> Iterator[None]:
    """Configure an OpenAI model (served by a local fake) as the embedder."""
    with serving() as api:
        settings.EMBEDDING_PROVIDER = "openai"
        settings.OPENAI_API_KEY = "sk-test-search"
        settings.OPENAI_BASE_URL = api.url
        settings.RECALL_DEFAULT_THRESHOLD = None
        embeddings.reset_query_cache()
        yield
        embeddings.reset_query_cache()


def test_with_an_openai_model_the_score_reads_similarity_against_its_threshold(cast, openai_model):
    # The fake's vectors are unrelated to each other, as an OpenAI model's
    # are for most pairs at its similarity threshold (0.7).
    deploys = "Production deploys happen on Tuesdays after the standup."
    database = "The production database runs PostgreSQL 16."
    for content in [deploys, database, *NOTES]:
        remember(cast.alice.id, content)
    arguments = {"user_id": cast.alice.id, "query": "When do production deploys happen?"}

    # The default threshold is the score's, whatever the model.
    assert search.default_threshold() == scoring.THRESHOLD
    assert embeddings.get_embedder().default_threshold == 0.7
    # The memory holding every word of the question is found by its words.
    assert contents(services.recall(**arguments)) == [deploys]
    # A similarity counts against the model's own 0.7 as the bundled model's against 0.35.
    semantic = services.recall(**arguments, threshold=0, mode="semantic")
    line = scoring.line("semantic", 0.7)
    assert [r["score"] for r in semantic] == pytest.approx(
        [line.score(r["similarity"]) for r in semantic], abs=1e-3
    )
    assert line.score(0.7) == pytest.approx(scoring.SEMANTIC.score(0.35))


# Dates -----------------------------------------------------------------------------------


@pytest.fixture
def dated(cast) -> dict[str, datetime]:
    """Three memories about tea, created a day apart, at known moments."""
    base = datetime(2025, 3, 1, 9, 30, tzinfo=UTC)
    moments = {}
    for n in range(3):
        memory_id = remember(cast.alice.id, f"Day {n}: Alice tasted a new Darjeeling tea.")
        moments[memory_id] = base + timedelta(days=n)
    with tenancy.operator(), connection.cursor() as cursor:
        for memory_id, moment in moments.items():
            cursor.execute("UPDATE memories SET created_at = %s WHERE id = %s", [moment, memory_id])
    return {f"day{n}": moment for n, moment in enumerate(moments.values())}


@pytest.mark.parametrize("mode", MODES)
def test_created_after_is_inclusive_and_created_before_exclusive(cast, dated, mode):
    def days(**window):
        found = services.recall(
            user_id=cast.alice.id, query="Darjeeling tea", threshold=0, mode=mode, **window
        )
        return sorted(r["content"][:5] for r in found)

    at = dated["day1"].isoformat()
    assert days(created_after=at) == ["Day 1", "Day 2"]
    assert days(created_before=at) == ["Day 0"]
    assert days(created_after=at, created_before=dated["day2"].isoformat()) == ["Day 1"]
    # A date means its midnight UTC; an offset is honoured.
    assert days(created_after="2025-03-02") == ["Day 1", "Day 2"]
    assert days(created_before="2025-03-02T11:30:00+02:00") == ["Day 0"]
    assert days(created_before="2025-03-02T11:31:00+02:00") == ["Day 0", "Day 1"]
    assert days(created_before="2025-03-02T09:30:00") == ["Day 0"]


def test_the_date_filter_applies_before_ranking(cast, dated):
    for n in range(40):
        remember(cast.alice.id, f"Alice tasted Darjeeling tea, cup {n}, and liked it.")

    found = services.recall(
        user_id=cast.alice.id,
        query="Darjeeling tea",
        limit=1,
        threshold=0,
        created_before=dated["day1"].isoformat(),
    )

    assert contents(found) == ["Day 0: Alice tasted a new Darjeeling tea."]


@pytest.mark.parametrize(
    ("arguments", "fragment"),
    [
        ({"mode": "fuzzy"}, 'mode must be "hybrid", "semantic" or "lexical"'),
        ({"created_after": "last week"}, "created_after must be an ISO 8601 date"),
        ({"created_before": 20250301}, "created_before must be an ISO 8601 date"),
        (
            {"created_after": "2025-03-02", "created_before": "2025-03-01"},
            "created_after must be earlier than created_before",
        ),
        (
            {"created_after": "2025-03-01", "created_before": "2025-03-01T00:00:00Z"},
            "created_after must be earlier than created_before",
        ),
        # as_of is applied as the bound a millisecond later: past what a
        # datetime holds, it was an OverflowError and internal_error.
        ({"as_of": "9999-12-31T23:59:59.999Z"}, "as_of is out of range"),
        ({"as_of": "0001-01-01T00:00:00+05:00"}, "as_of is out of range"),
        # The range the message gives is the range taken: year 1's first
        # moment was refused "between the years 1 and 9999".
        ({"created_after": "0001-01-01"}, "from 0001-01-01T00:00:00.001Z to 9999-12-31T23:"),
        # What follows a NUL byte was never read.
        ({"as_of": "2030-01-01T00:00:00Z\x00junk"}, "as_of must be an ISO 8601 date"),
        ({"as_of": "2030-01-01", "include_superseded": True}, "not both"),
    ],
)
def test_it_refuses_bad_search_arguments(cast, arguments, fragment):
    with pytest.raises(ValidationFailed) as caught:
        services.recall(user_id=cast.alice.id, query="tea", **arguments)
    assert fragment in caught.value.message


# Neighbours ----------------------------------------------------------------------------


def test_an_answer_stored_after_its_question_is_found_with_it(cast):
    turns = [
        "Did you finish the quarterly budget for Zephyr Corp?",
        "Yes, it came to 4.2 million in the end.",
        "Great, send it over when you can.",
    ]
    for note in NOTES[:6]:
        remember(cast.alice.id, note)
    for turn in turns:
        remember(cast.alice.id, turn)
    for note in NOTES[6:]:
        remember(cast.alice.id, note)
    query = "How much was the Zephyr Corp quarterly budget?"

    hybrid = contents(services.recall(user_id=cast.alice.id, query=query, threshold=0, limit=3))
    semantic = contents(
        services.recall(user_id=cast.alice.id, query=query, threshold=0, mode="semantic")
    )

    assert hybrid[:2] == turns[:2]
    assert semantic.index(turns[1]) > 1


# Isolation and the one ranking -------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_no_mode_ever_returns_another_tenants_memory(cast, mode):
    remember(cast.charlie.id, PASSPORT)
    remember(cast.charlie.id, "Zephyrine renewed her passport X4471902 in May.")
    for note in NOTES[:3]:
        remember(cast.alice.id, note)

    found = services.recall(
        user_id=cast.alice.id, query="Zephyrine passport X4471902", threshold=0, mode=mode
    )

    assert not {PASSPORT, "Zephyrine renewed her passport X4471902 in May."} & set(contents(found))
    assert len(found) <= 3


def test_forget_previews_the_memories_recall_would_return(cast):
    for note in NOTES:
        remember(cast.alice.id, note)
    remember(cast.alice.id, PASSPORT)
    arguments = {"query": "X4471902 passport", "limit": 5}

    recalled = services.recall(user_id=cast.alice.id, **arguments)
    preview = services.forget_preview(user_id=cast.alice.id, **arguments)

    assert [m["id"] for m in preview["matches"]] == [r["id"] for r in recalled]
    assert [m["score"] for m in preview["matches"]] == [r["score"] for r in recalled]
