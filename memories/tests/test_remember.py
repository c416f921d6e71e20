from __future__ import annotations

import threading
import uuid

import pytest
from django.db import connection
from django.test import override_settings

from accounts.tiers import Tier
from conftest import Cast
from core import tenancy
from core.errors import QuotaExceeded, ValidationFailed
from memories import services
from memories.models import Memory


def count_rows(user_id) -> int:
    with tenancy.tenant(user_id):
        return Memory.objects.count()


def remember(cast, content="The user prefers dark mode.", **kwargs):
    return services.remember(user_id=cast.alice.id, tier=Tier.FREE, content=content, **kwargs)


def test_it_stores_a_memory_and_returns_its_id(cast):
    result = remember(cast, namespace="preferences", metadata={"source": "conversation"})

    assert result["deduped"] is False
    with tenancy.tenant(cast.alice.id):
        memory = Memory.objects.get(id=result["id"])
    assert memory.content == "The user prefers dark mode."
    assert memory.namespace == "preferences"
    assert memory.metadata == {"source": "conversation"}
    assert memory.embedding_model == "all-MiniLM-L6-v2"
    assert len(memory.embedding) == 384


def test_an_argument_it_does_not_take_is_refused_and_nothing_is_stored(cast):
    # A Python caller's typo or a field of another call ("task_id" is a
    # note's, not remember's) was dropped silently, the memory stored without it.
    with pytest.raises(TypeError, match="task_id"):
        remember(cast, task_id="release-42")

    assert count_rows(cast.alice.id) == 0


def test_it_defaults_to_the_default_namespace(cast):
    result = remember(cast)
    with tenancy.tenant(cast.alice.id):
        assert Memory.objects.get(id=result["id"]).namespace == "default"


def test_it_returns_the_existing_id_for_identical_content(cast):
    first = remember(cast, content="Likes green tea.")
    second = remember(cast, content="  Likes green tea.\r\n")

    assert second == {"id": first["id"], "deduped": True}
    assert count_rows(cast.alice.id) == 1


def test_it_normalises_unicode_before_deduplicating(cast):
    composed = remember(cast, content="Caf\u00e9 on Tuesdays")
    decomposed = remember(cast, content="Cafe\u0301 on Tuesdays")

    assert decomposed == {"id": composed["id"], "deduped": True}


def test_it_keeps_identical_content_in_other_namespaces_apart(cast):
    first = remember(cast, content="Same words", namespace="a")
    second = remember(cast, content="Same words", namespace="b")

    assert first["id"] != second["id"]
    assert second["deduped"] is False


def test_it_keeps_identical_content_of_two_tenants_apart(cast):
    alices = remember(cast, content="Shared sentence")
    charlies = services.remember(user_id=cast.charlie.id, tier=Tier.FREE, content="Shared sentence")

    assert charlies["deduped"] is False
    assert charlies["id"] != alices["id"]


@pytest.mark.django_db(transaction=True)
def test_concurrent_identical_calls_store_exactly_one_row(cast: Cast) -> None:
    results: list[dict] = []
    errors: list[BaseException] = []
    barrier = threading.Barrier(8)

    def worker():
        try:
            barrier.wait()
            results.append(remember(cast, content="Race me to the database"))
        except BaseException as exc:  # surfaced below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert errors == []
    assert len({result["id"] for result in results}) == 1
    assert sum(not result["deduped"] for result in results) == 1
    assert count_rows(cast.alice.id) == 1


@override_settings(FREE_TIER_MAX_MEMORIES=3)
def test_it_obeys_the_free_tier_limit(cast):
    for n in range(3):
        remember(cast, content=f"memory number {n}")

    with pytest.raises(QuotaExceeded) as caught:
        remember(cast, content="one too many")
    assert caught.value.code == "quota_exceeded"
    assert count_rows(cast.alice.id) == 3


@override_settings(FREE_TIER_MAX_MEMORIES=1)
def test_a_quota_of_one_says_one_memory(cast):
    # review145: "The free tier holds at most 1 memories."
    from recall.startup import describe_tier

    remember(cast, content="the only one")
    with pytest.raises(QuotaExceeded) as caught:
        remember(cast, content="one too many")
    assert caught.value.message.startswith("The free tier holds at most 1 memory. Forget")
    with pytest.raises(QuotaExceeded) as caught:
        services.remember(
            user_id=cast.alice.id,
            tier=Tier.FREE,
            messages=[{"role": "user", "content": "a"}, {"role": "user", "content": "b"}],
        )
    assert "at most 1 memory. You hold 1 (queued adds included), and this call would add 2." in (
        caught.value.message
    )
    assert describe_tier(Tier.FREE).endswith(", at most 1 memory")


@override_settings(FREE_TIER_MAX_MEMORIES=2)
def test_a_duplicate_at_the_limit_is_deduplicated_not_refused(cast):
    first = remember(cast, content="one")
    remember(cast, content="two")

    assert remember(cast, content="one") == {"id": first["id"], "deduped": True}


@override_settings(FREE_TIER_MAX_MEMORIES=2)
@pytest.mark.parametrize("tier", [Tier.PRO, Tier.UNLIMITED])
def test_paid_and_granted_tiers_have_no_memory_quota(cast, tier):
    for n in range(4):
        services.remember(user_id=cast.alice.id, tier=tier, content=f"kept memory {n}")
    assert count_rows(cast.alice.id) == 4


@override_settings(FREE_TIER_MAX_MEMORIES=2)
def test_the_free_quota_is_per_tenant(cast):
    remember(cast, content="one")
    remember(cast, content="two")

    result = services.remember(user_id=cast.charlie.id, tier=Tier.FREE, content="one")
    assert result["deduped"] is False


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"content": ""}, "content must not be empty"),
        ({"content": "   \n\t "}, "content must not be empty"),
        # Stored, each was a memory no one could see or find.
        ({"content": "\u200b"}, "only invisible characters"),
        ({"content": "\ufeff"}, "only invisible characters"),
        ({"content": " \u200d\u2060 \u200c"}, "only invisible characters"),
        ({"content": "\u3164\u2800 \ufe0f"}, "only invisible characters"),
        ({"content": "x" * 50_001}, "content is 50,001 characters; the maximum is 50,000."),
        # U+0958 becomes two characters in NFC: the count is said to be the stored one.
        ({"content": "\u0958" * 30_000}, "60,000 characters once normalised (Unicode NFC)"),
        ({"content": 42}, "content must be a string"),
        ({"content": None}, "Pass content (one memory) or messages"),
        ({"content": "nul \x00 byte"}, "NUL"),
        ({"content": "lone \ud800 surrogate"}, "valid Unicode"),
        ({"namespace": ""}, "namespace must be"),
        ({"namespace": "n" * 65}, "namespace must be"),
        ({"namespace": "has space"}, "namespace must be"),
        ({"namespace": "<script>"}, "namespace must be"),
        ({"namespace": 7}, "namespace must be"),
        ({"metadata": ["not", "an", "object"]}, "metadata must be a JSON object"),
        ({"metadata": "text"}, "metadata must be a JSON object"),
        ({"metadata": {"big": "x" * 17_000}}, "maximum is 16,384"),
        ({"metadata": {"n": float("nan")}}, "finite"),
        ({"metadata": {"k": "nul\x00"}}, "NUL"),
        ({"metadata": {"k\x00": "nul in a key"}}, "NUL"),
        ({"metadata": {"k": ["in a list \ud800"]}}, "valid Unicode"),
        # Nine objects deep; eight are allowed (as README says, "nested ≤ 8 deep").
        (
            {"metadata": {"a": {"b": {"c": {"d": {"e": {"f": {"g": {"h": {"i": 1}}}}}}}}}},
            "nest deeper",
        ),
        ({"metadata": {"x": object()}}, "only JSON values"),
    ],
)
def test_it_refuses_bad_input_and_writes_nothing(cast, kwargs, fragment):
    arguments = {"content": "valid content", **kwargs}
    with pytest.raises(ValidationFailed) as caught:
        remember(cast, **arguments)
    assert fragment in caught.value.message
    assert caught.value.code == "validation_failed"
    assert count_rows(cast.alice.id) == 0


def test_text_beside_an_invisible_character_is_stored(cast):
    stored = remember(cast, content="\u200bThe user's team is Platform.")
    assert stored["deduped"] is False


def test_metadata_nested_eight_deep_is_stored(cast):
    # The message said "must not nest deeper than 8 levels" of eight.
    eight = {"a": {"b": {"c": {"d": {"e": {"f": {"g": {"h": 1}}}}}}}}

    stored = services.remember(user_id=cast.alice.id, tier=Tier.PRO, content="x", metadata=eight)

    assert stored["deduped"] is False


def test_it_accepts_content_at_exactly_the_maximum_length(cast):
    result = remember(cast, content="y" * 50_000)
    with tenancy.tenant(cast.alice.id):
        assert len(Memory.objects.get(id=result["id"]).content) == 50_000


def test_it_accepts_a_namespace_of_64_safe_characters(cast):
    namespace = "project:recall/notes_v2.0-@" + "x" * 37
    assert len(namespace) == 64
    result = remember(cast, namespace=namespace)
    assert uuid.UUID(result["id"])


@pytest.mark.parametrize(
    ("thread_id", "fragment"),
    [("thread\x00", "NUL"), ("thread\ud800", "valid Unicode"), ("t" * 201, "at most 200")],
)
def test_a_thread_id_the_database_cannot_store_is_refused(cast, thread_id, fragment):
    with pytest.raises(ValidationFailed) as caught:
        services.remember(
            user_id=cast.alice.id,
            tier=Tier.FREE,
            messages=[{"role": "user", "content": "hello"}],
            thread_id=thread_id,
        )

    assert fragment in caught.value.message
    assert count_rows(cast.alice.id) == 0
