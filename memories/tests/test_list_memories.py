from __future__ import annotations

import pytest

from accounts.tiers import Tier
from core.errors import ValidationFailed
from memories import services
from tests.support import fill_memories


def remember(user_id, content, namespace="default"):
    return services.remember(user_id=user_id, tier=Tier.PRO, content=content, namespace=namespace)[
        "id"
    ]


def test_it_lists_newest_first(cast):
    ids = [remember(cast.alice.id, f"memory {n}") for n in range(3)]

    listed = services.list_memories(user_id=cast.alice.id)

    assert [m["id"] for m in listed] == list(reversed(ids))
    assert set(listed[0]) == {
        "id",
        "content",
        "namespace",
        "thread_id",
        "position",
        "metadata",
        "priority",
        "hash",
        "version",
        "created_at",
        "updated_at",
        "expires_at",
        "superseded_by",
        "superseded_at",
    }


def test_it_pages_with_limit_and_offset(cast):
    ids = list(reversed([remember(cast.alice.id, f"memory {n}") for n in range(5)]))

    page1 = services.list_memories(user_id=cast.alice.id, limit=2, offset=0)
    page2 = services.list_memories(user_id=cast.alice.id, limit=2, offset=2)
    page3 = services.list_memories(user_id=cast.alice.id, limit=2, offset=4)
    past_end = services.list_memories(user_id=cast.alice.id, limit=2, offset=5)

    assert [m["id"] for m in page1 + page2 + page3] == ids
    assert past_end == []


def test_it_orders_by_updated_at_when_asked(cast):
    first = remember(cast.alice.id, "first")
    remember(cast.alice.id, "second")
    services.update_memory(user_id=cast.alice.id, id=first, metadata={"touched": True})

    by_created = services.list_memories(user_id=cast.alice.id, order="created_at")
    by_updated = services.list_memories(user_id=cast.alice.id, order="updated_at")

    assert by_created[0]["content"] == "second"
    assert by_updated[0]["content"] == "first"


def test_it_defaults_to_twenty_results(cast):
    fill_memories(cast.alice.id, 25)
    assert len(services.list_memories(user_id=cast.alice.id)) == 20
    assert len(services.list_memories(user_id=cast.alice.id, limit=100)) == 25


def test_it_lists_only_the_given_namespace(cast):
    remember(cast.alice.id, "at work", "work")
    remember(cast.alice.id, "at home", "home")

    assert [
        m["content"] for m in services.list_memories(user_id=cast.alice.id, namespace="work")
    ] == ["at work"]


def test_charlie_never_sees_alices_memories(cast):
    remember(cast.alice.id, "Alice's secret")

    assert services.list_memories(user_id=cast.charlie.id) == []


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"limit": 0}, "limit must be an integer from 1 to 100"),
        ({"limit": 101}, "limit must be an integer from 1 to 100"),
        ({"offset": -1}, "offset must be an integer from 0"),
        ({"offset": "2"}, "offset must be an integer"),
        ({"order": "content"}, 'order must be "created_at" or "updated_at"'),
        ({"namespace": "no spaces allowed"}, "namespace must be"),
    ],
)
def test_it_refuses_bad_input(cast, kwargs, fragment):
    with pytest.raises(ValidationFailed) as caught:
        services.list_memories(user_id=cast.alice.id, **kwargs)
    assert fragment in caught.value.message
