from __future__ import annotations

import uuid

import numpy as np
import pytest
from django.db import connection

from accounts.tiers import Tier
from core import tenancy
from core.errors import Conflict, NotFound, ValidationFailed
from memories import services
from memories.models import Memory


def remember(user_id, content, namespace="default", metadata=None):
    return services.remember(
        user_id=user_id, tier=Tier.PRO, content=content, namespace=namespace, metadata=metadata
    )["id"]


def load(user_id, memory_id) -> Memory:
    with tenancy.tenant(user_id):
        return Memory.objects.get(id=memory_id)


def test_a_content_change_re_embeds_the_memory(cast):
    memory_id = remember(cast.alice.id, "The user drinks coffee.")
    before = load(cast.alice.id, memory_id)

    assert services.update_memory(
        user_id=cast.alice.id, id=memory_id, content="The user switched to tea."
    ) == {"success": True}

    after = load(cast.alice.id, memory_id)
    assert after.content == "The user switched to tea."
    assert after.content_hash != before.content_hash
    assert not np.allclose(after.embedding, before.embedding)
    assert after.updated_at > before.updated_at
    found = services.recall(user_id=cast.alice.id, query="tea", threshold=0)
    assert found[0]["id"] == memory_id


def test_a_priority_change_alone_moves_updated_at(cast):
    # Ordered by updated_at, an edited memory comes first, whatever the edit.
    memory_id = remember(cast.alice.id, "The deploy runbook lives in the wiki.")
    other = remember(cast.alice.id, "Standup is at 9:30.")
    before = load(cast.alice.id, memory_id)

    services.update_memory(user_id=cast.alice.id, id=memory_id, priority="high")

    after = load(cast.alice.id, memory_id)
    assert after.updated_at > before.updated_at
    listed = services.list_memories(user_id=cast.alice.id, order="updated_at")
    assert [m["id"] for m in listed] == [memory_id, other]


def test_metadata_replaces_the_old_metadata(cast):
    memory_id = remember(cast.alice.id, "A fact", metadata={"a": 1, "b": 2})

    services.update_memory(user_id=cast.alice.id, id=memory_id, metadata={"c": 3})

    after = load(cast.alice.id, memory_id)
    assert after.metadata == {"c": 3}
    assert after.content == "A fact"


def test_a_metadata_change_keeps_the_embedding(cast):
    memory_id = remember(cast.alice.id, "A fact")
    before = load(cast.alice.id, memory_id)

    services.update_memory(user_id=cast.alice.id, id=memory_id, metadata={})

    assert np.array_equal(load(cast.alice.id, memory_id).embedding, before.embedding)


def test_it_refuses_content_that_duplicates_another_memory(cast):
    remember(cast.alice.id, "Existing memory")
    other = remember(cast.alice.id, "Other memory")

    with pytest.raises(Conflict) as caught:
        services.update_memory(user_id=cast.alice.id, id=other, content="Existing memory ")

    assert caught.value.code == "conflict"
    assert "already has this content" in caught.value.message
    assert load(cast.alice.id, other).content == "Other memory"


def test_content_only_an_expired_memory_held_is_free_to_take(cast):
    # Expired, not yet purged: it held the place in the dedup index, and the
    # update answered "conflict ... (id None)", naming nothing the caller could change.
    expired = services.remember(
        user_id=cast.alice.id, tier=Tier.PRO, content="A passing fact", ttl_seconds=60
    )["id"]
    with tenancy.operator(), connection.cursor() as cursor:
        cursor.execute(
            "UPDATE memories SET expires_at = statement_timestamp() - interval '1 second'"
            " WHERE id = %s",
            [expired],
        )
    other = remember(cast.alice.id, "Other memory")

    assert services.update_memory(user_id=cast.alice.id, id=other, content="A passing fact") == {
        "success": True
    }

    assert load(cast.alice.id, other).content == "A passing fact"
    with tenancy.operator():
        assert not Memory.objects.filter(id=expired).exists()


def test_setting_the_same_content_again_succeeds(cast):
    memory_id = remember(cast.alice.id, "Unchanged")
    assert services.update_memory(user_id=cast.alice.id, id=memory_id, content=" Unchanged ") == {
        "success": True
    }


def test_charlie_cannot_update_alices_memory(cast):
    memory_id = remember(cast.alice.id, "Alice's memory")

    with pytest.raises(NotFound):
        services.update_memory(user_id=cast.charlie.id, id=memory_id, content="hijacked")

    assert load(cast.alice.id, memory_id).content == "Alice's memory"


def test_an_unknown_id_is_not_found(cast):
    with pytest.raises(NotFound) as caught:
        services.update_memory(user_id=cast.alice.id, id=str(uuid.uuid4()), metadata={})
    assert caught.value.code == "not_found"


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({}, "Pass content, metadata or priority"),
        ({"content": ""}, "content must not be empty"),
        ({"content": "z" * 50_001}, "maximum is 50,000"),
        ({"metadata": [1, 2]}, "metadata must be a JSON object"),
        ({"id": "not-a-uuid", "metadata": {}}, "id must be a memory id"),
        ({"id": 12, "metadata": {}}, "id must be a memory id"),
    ],
)
def test_it_refuses_bad_input_and_changes_nothing(cast, kwargs, fragment):
    memory_id = remember(cast.alice.id, "Stays as it was", metadata={"keep": True})
    arguments = {"id": memory_id, **kwargs}

    with pytest.raises(ValidationFailed) as caught:
        services.update_memory(user_id=cast.alice.id, **arguments)

    assert fragment in caught.value.message
    memory = load(cast.alice.id, memory_id)
    assert (memory.content, memory.metadata) == ("Stays as it was", {"keep": True})
