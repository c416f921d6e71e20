"""Expiry: expires_at or ttl_seconds; expired memories are never returned, then purged."""

from __future__ import annotations

from datetime import UTC, timedelta

import pytest
from django.db import connection
from django.utils import timezone

from accounts.tiers import Tier
from core import tenancy
from core.errors import NotFound, ValidationFailed
from memories import services
from memories.models import Memory, MemoryHistory


def remember(user_id, content, **kwargs):
    return services.remember(user_id=user_id, tier=Tier.PRO, content=content, **kwargs)


def expire_now(memory_id) -> None:
    """Move a memory's expiry into the past, as time passing would."""
    with tenancy.operator(), connection.cursor() as cursor:
        cursor.execute(
            "UPDATE memories SET expires_at = statement_timestamp() - interval '1 second'"
            " WHERE id = %s",
            [memory_id],
        )


def test_ttl_seconds_sets_the_expiry_from_now(cast):
    before = timezone.now()
    memory_id = remember(cast.alice.id, "for an hour", ttl_seconds=3600)["id"]

    [listed] = services.list_memories(user_id=cast.alice.id)

    assert listed["id"] == memory_id
    expires = listed["expires_at"]
    assert expires is not None
    moment = timezone.datetime.fromisoformat(expires.replace("Z", "+00:00"))
    assert timedelta(seconds=3599) <= moment - before <= timedelta(seconds=3601)


def test_expires_at_is_stored_as_given(cast):
    remember(cast.alice.id, "until new year", expires_at="2099-01-01T00:00:00Z")

    [listed] = services.list_memories(user_id=cast.alice.id)

    assert listed["expires_at"] == "2099-01-01T00:00:00.000Z"


@pytest.mark.parametrize("offset", ["+16:00", "-20:00", "+23:59"])
def test_an_offset_python_reads_and_postgresql_would_not_is_taken_as_its_utc_time(cast, offset):
    # Python reads offsets up to 23:59, PostgreSQL refuses past 15:59: stored or
    # searched with as given, it was internal_error.
    remember(cast.alice.id, "until new year", expires_at=f"2099-01-01T00:00:00{offset}")
    [listed] = services.list_memories(user_id=cast.alice.id)
    moment = timezone.datetime.fromisoformat(f"2099-01-01T00:00:00{offset}")
    assert listed["expires_at"] == moment.astimezone(UTC).isoformat()[:19] + ".000Z"

    after = services.recall(
        user_id=cast.alice.id,
        query="new year",
        threshold=0,
        created_after=f"2000-01-01T00:00:00{offset}",
    )
    then = services.recall(
        user_id=cast.alice.id, query="new year", threshold=0, as_of=f"2001-01-01T00:00:00{offset}"
    )
    assert [m["content"] for m in after] == ["until new year"]
    assert then == []  # stored after that


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"expires_at": "2000-01-01T00:00:00Z"}, "in the past"),
        ({"expires_at": "next tuesday"}, "ISO 8601"),
        ({"expires_at": "2099-13-01T00:00:00Z"}, "ISO 8601"),
        ({"ttl_seconds": 0}, "ttl_seconds must be"),
        ({"ttl_seconds": "60"}, "ttl_seconds must be"),
        ({"ttl_seconds": 60, "expires_at": "2099-01-01T00:00:00Z"}, "not both"),
    ],
)
def test_a_bad_expiry_is_refused_and_nothing_is_stored(cast, kwargs, fragment):
    with pytest.raises(ValidationFailed, match=fragment):
        remember(cast.alice.id, "never stored", **kwargs)

    with tenancy.operator():
        assert not Memory.objects.exists()


def test_no_read_returns_an_expired_memory(cast):
    gone = remember(cast.alice.id, "The user's parking spot is B12.", ttl_seconds=60)["id"]
    kept = remember(cast.alice.id, "The user's desk is on floor 3.")["id"]
    expire_now(gone)

    found = services.recall(user_id=cast.alice.id, query="parking spot", threshold=0)
    listed = services.list_memories(user_id=cast.alice.id)

    assert [m["id"] for m in found] == [kept]
    assert [m["id"] for m in listed] == [kept]
    assert services.count_namespace(user_id=cast.alice.id) == 1
    assert [r["id"] for r in services.export_memories(user_id=cast.alice.id)] == [kept]
    with pytest.raises(NotFound):
        services.update_memory(user_id=cast.alice.id, id=gone, content="revived?")
    preview = services.forget_preview(user_id=cast.alice.id, query="parking spot", threshold=0)
    assert [m["id"] for m in preview["matches"]] == [kept]


def test_forgetting_an_expired_memory_answers_as_every_other_tool_does(cast):
    gone = remember(cast.alice.id, "The user's parking spot is B12.", ttl_seconds=60)["id"]
    lapsed = remember(cast.alice.id, "The user's locker is 41.", ttl_seconds=60)["id"]
    kept = remember(cast.alice.id, "The user's desk is on floor 3.")["id"]
    expire_now(gone)

    with pytest.raises(NotFound):
        services.forget(user_id=cast.alice.id, mode="by_id", id=gone, purge=True)
    with tenancy.operator():  # left for the purge, and purge=true erased nothing
        assert Memory.objects.filter(id=gone).exists()
        assert MemoryHistory.objects.filter(memory_id=gone).exists()
    preview = services.forget(user_id=cast.alice.id, mode="all", namespace="default")
    expire_now(lapsed)
    done = services.forget(
        user_id=cast.alice.id, mode="all", confirmation_token=preview["confirmation_token"]
    )

    assert preview["total_matches"] == 2
    assert done["deleted_count"] == 1
    with tenancy.operator():
        assert not Memory.objects.filter(id__in=[gone, lapsed, kept]).exists()


def test_an_expired_memory_does_not_count_as_a_duplicate(cast):
    old = remember(cast.alice.id, "The user is at the conference.", ttl_seconds=60)["id"]
    expire_now(old)

    again = remember(cast.alice.id, "The user is at the conference.")

    assert again["deduped"] is False
    assert again["id"] != old
    [listed] = services.list_memories(user_id=cast.alice.id)
    assert (listed["id"], listed["expires_at"]) == (again["id"], None)


def test_a_conversation_stored_again_after_its_copy_expired_is_stored_in_one_call(cast):
    # Every message's place is held by an expired copy; they all go before
    # the writing transaction, not one per attempt of the call.
    messages = [{"role": "user", "content": f"Message {n} of the trip plan."} for n in range(1, 6)]
    first = services.remember(
        user_id=cast.alice.id, tier=Tier.PRO, messages=messages, thread_id="trip", ttl_seconds=60
    )
    for memory in first["memories"]:
        expire_now(memory["id"])

    again = services.remember(
        user_id=cast.alice.id, tier=Tier.PRO, messages=messages, thread_id="trip"
    )

    assert [m["deduped"] for m in again["memories"]] == [False] * 5
    assert not {m["id"] for m in again["memories"]} & {m["id"] for m in first["memories"]}
    with tenancy.operator():
        assert Memory.objects.filter(user_id=cast.alice.id).count() == 5


def test_a_write_drops_only_the_expired_copies_in_its_way_as_the_purge_would(cast, agents):
    fact = "The team offsite is in Lisbon."
    mine = remember(cast.alice.id, fact, ttl_seconds=60)["id"]
    theirs = remember(
        cast.alice.id, fact, ttl_seconds=60, agent_id=agents.research.id, namespace="other"
    )["id"]
    expire_now(mine)
    expire_now(theirs)

    again = remember(cast.alice.id, fact)

    assert not again["deduped"]
    with tenancy.operator():
        # Another writer's copy in another namespace is the purge's to take.
        assert Memory.objects.filter(id=theirs).exists()
        assert not Memory.objects.filter(id=mine).exists()
        gone = MemoryHistory.objects.get(memory_id=mine, action="deleted")
    assert gone.client == "maintenance"


def test_an_expired_replacement_stored_again_takes_its_place_and_frees_what_it_replaced(cast):
    older = remember(cast.alice.id, "The user's desk is 4B.")["id"]
    expiring = remember(
        cast.alice.id, "The user moved to desk 7C.", replaces=older, ttl_seconds=60
    )["id"]
    expire_now(expiring)

    again = remember(cast.alice.id, "The user moved to desk 7C.")

    assert again["deduped"] is False and again["id"] != expiring
    with tenancy.tenant(cast.alice.id):
        assert not Memory.objects.filter(id=expiring).exists()
        # Freed by the delete, which its history says; detection may then
        # link it to the new copy.
        link = Memory.objects.get(id=older).superseded_by
        freed = MemoryHistory.objects.get(memory_id=older, action="restored")
    assert link is None or str(link) == again["id"]
    assert freed.decision == {
        "decided_by": "expiry",
        "reason": "the memory that replaced it expired",
    }


def test_maintenance_purges_expired_memories_leaving_a_deletion_in_their_history(cast):
    gone = remember(cast.alice.id, "temporary", ttl_seconds=60)["id"]
    remember(cast.alice.id, "permanent")
    expire_now(gone)

    done = services.clean_up()

    assert done is not None and done.expired_memories == 1
    with tenancy.operator():
        assert not Memory.objects.filter(id=gone).exists()
    versions = services.memory_history(user_id=cast.alice.id, id=gone)
    assert [(v["action"], v["client"]) for v in versions] == [
        ("created", "system"),
        ("updated", "system"),  # expire_now() moved the expiry
        ("deleted", "maintenance"),
    ]


def test_maintenance_runs_in_one_process_at_a_time(cast):
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_lock(%s)", [services._MAINTENANCE_LOCK])
    try:
        # This connection holds the lock; a second session would be refused.
        # Here the same session re-enters it (advisory locks stack), so ask
        # from another connection instead.
        from django.db import connections

        other = connections.create_connection("default")
        try:
            with other.cursor() as cursor:
                cursor.execute("SELECT pg_try_advisory_lock(%s)", [services._MAINTENANCE_LOCK])
                assert cursor.fetchone()[0] is False
        finally:
            other.close()
    finally:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_unlock(%s)", [services._MAINTENANCE_LOCK])
