"""search_metadata: per namespace and model, how many memories without an expiry hold
each top-level metadata pair, kept exact by the database whatever writes memories,
private to each tenant (migration 0013)."""

from __future__ import annotations

import json
import threading
from collections import Counter
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection, connections
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from accounts.tiers import Tier
from core import tenancy
from memories import services

pytestmark = pytest.mark.django_db

Key = tuple[str, str, str]  # namespace, model, the pair as canonical JSON


def remember(user_id, content, namespace="default", metadata=None, **extra) -> str:
    return services.remember(
        user_id=user_id,
        tier=Tier.PRO,
        content=content,
        namespace=namespace,
        metadata=metadata,
        **extra,
    )["id"]


def canonical(pair: dict[str, object]) -> str:
    return json.dumps(pair, sort_keys=True)


def counts(user_id) -> Counter[Key]:
    """search_metadata as the tenant reads it."""
    with tenancy.tenant(user_id), connection.cursor() as cursor:
        cursor.execute("SELECT namespace, embedding_model, pair, memories FROM search_metadata")
        rows = cursor.fetchall()
    found: Counter[Key] = Counter()
    for namespace, model, pair, memories in rows:
        assert memories > 0, (namespace, pair)
        # Django's connection reads jsonb as text.
        found[(namespace, model, canonical(json.loads(pair)))] = memories
    return found


def recount(user_id) -> Counter[Key]:
    """What the counts must be, worked out in Python from the memories themselves."""
    with tenancy.tenant(user_id), connection.cursor() as cursor:
        cursor.execute(
            "SELECT namespace, embedding_model, metadata, expires_at FROM memories"
            " WHERE user_id = %s",
            [str(user_id)],
        )
        rows = cursor.fetchall()
    expected: Counter[Key] = Counter()
    for namespace, model, metadata, expires_at in rows:
        if expires_at is not None:
            continue
        for key, value in json.loads(metadata).items():
            # PostgreSQL writes a jsonb value as json.dumps does by default.
            value_text = json.dumps(value, ensure_ascii=False)
            if len(key.encode()) + len(value_text.encode()) <= 256:
                expected[(namespace, model, canonical({key: value}))] += 1
    return expected


def assert_consistent(user_id) -> Counter[Key]:
    found = counts(user_id)
    assert found == recount(user_id)
    return found


def pair(found: Counter[Key], namespace: str, **one: object) -> int:
    wanted = canonical(one)
    return sum(n for (ns, _, text), n in found.items() if ns == namespace and text == wanted)


def test_every_write_keeps_the_counts_exact(cast):
    alice = cast.alice.id
    first = remember(alice, "Alice's project is Apollo.", metadata={"project": "apollo", "n": 1})
    remember(alice, "Alice's deadline is Friday.", metadata={"project": "apollo", "n": 2})
    remember(alice, "Alice likes tea.", metadata={"project": "zeus", "flag": True})
    remember(alice, "Scratch note.", namespace="scratch", metadata={"project": "apollo"})
    remember(alice, "No metadata at all.")
    found = assert_consistent(alice)
    assert pair(found, "default", project="apollo") == 2
    assert pair(found, "scratch", project="apollo") == 1
    assert pair(found, "default", flag=True) == 1

    # A changed value moves the memory from one pair's count to the other's.
    services.update_memory(user_id=alice, id=first, metadata={"project": "zeus", "n": 1})
    found = assert_consistent(alice)
    assert pair(found, "default", project="apollo") == 1
    assert pair(found, "default", project="zeus") == 2

    # Content alone changes no count.
    services.update_memory(user_id=alice, id=first, content="Alice's project is Zeus now.")
    assert assert_consistent(alice) == found

    services.forget_by_id(user_id=alice, id=first)
    found = assert_consistent(alice)
    assert pair(found, "default", project="zeus") == 1
    assert pair(found, "default", n=1) == 0

    services.forget_namespace(user_id=alice, namespace="scratch", purge=True)
    found = assert_consistent(alice)
    assert not [key for key in found if key[0] == "scratch"]


def test_a_memory_that_expires_is_never_counted(cast):
    alice = cast.alice.id
    later = (datetime.now(UTC) + timedelta(days=1)).isoformat()
    remember(alice, "Temporary: door code 4411.", metadata={"kind": "code"}, expires_at=later)
    kept = remember(alice, "Permanent: the wifi is called Meadow.", metadata={"kind": "code"})
    assert pair(assert_consistent(alice), "default", kind="code") == 1

    # Gaining an expiry takes a memory out of the count; losing it puts it back.
    with tenancy.operator(), connection.cursor() as cursor:
        cursor.execute("UPDATE memories SET expires_at = %s WHERE id = %s", [later, kept])
    assert pair(assert_consistent(alice), "default", kind="code") == 0
    with tenancy.operator(), connection.cursor() as cursor:
        cursor.execute("UPDATE memories SET expires_at = NULL")
    assert pair(assert_consistent(alice), "default", kind="code") == 2


def test_values_of_every_type_are_counted_and_long_ones_are_not(cast):
    alice = cast.alice.id
    metadata = {
        "text": "x",
        "number": 1.5,
        "none": None,
        "list": ["a", "b"],
        "object": {"inner": 1},
        "long": "y" * 300,
    }
    remember(alice, "Every kind of value.", metadata=metadata)
    found = assert_consistent(alice)
    for key, value in metadata.items():
        assert pair(found, "default", **{key: value}) == (0 if key == "long" else 1), key


def test_a_bulk_write_is_counted_in_one_statement(cast):
    alice = cast.alice.id
    model = remember(alice, "The template fact.")
    with tenancy.operator(), connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO memories (id, user_id, namespace, content, content_hash, embedding,"
            " embedding_model, metadata, created_at, updated_at)"
            " SELECT gen_random_uuid(), user_id, namespace, 'Bulk fact ' || n, md5(n::text),"
            " embedding, embedding_model, jsonb_build_object('batch', n %% 3), now(), now()"
            " FROM memories, generate_series(0, 29) AS n WHERE id = %s",
            [model],
        )
    found = assert_consistent(alice)
    assert [pair(found, "default", batch=n) for n in range(3)] == [10, 10, 10]

    with tenancy.operator(), connection.cursor() as cursor:
        cursor.execute("DELETE FROM memories WHERE metadata->>'batch' IN ('1', '2')")
    found = assert_consistent(alice)
    assert [pair(found, "default", batch=n) for n in range(3)] == [10, 0, 0]


@pytest.mark.django_db(transaction=True)
def test_concurrent_writers_to_one_pair_keep_exact_counts(cast):
    def write(part: range) -> None:
        try:
            for n in part:
                remember(cast.alice.id, f"Concurrent fact {n}.", metadata={"project": "apollo"})
        finally:
            connections.close_all()

    threads = [threading.Thread(target=write, args=(range(n, 24, 4),)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert pair(assert_consistent(cast.alice.id), "default", project="apollo") == 24


def test_truncating_memories_empties_the_counts(cast):
    remember(cast.alice.id, "Alice's project is Apollo.", metadata={"project": "apollo"})
    with connection.cursor() as cursor:
        # Django's foreign keys are deferred; the test's transaction holds their checks.
        cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")
        cursor.execute("TRUNCATE memories CASCADE")
    with tenancy.operator(), connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM search_metadata")
        assert cursor.fetchone()[0] == 0


def test_a_tenant_reads_only_its_own_counts_and_writes_none(cast, agents):
    from django.db.utils import ProgrammingError

    remember(cast.alice.id, "Alice's project is Apollo.", metadata={"project": "apollo"})
    remember(cast.charlie.id, "Charlie's project is Hermes.", metadata={"project": "hermes"})

    assert [key[2] for key in counts(cast.alice.id)] == [canonical({"project": "apollo"})]
    assert [key[2] for key in counts(cast.charlie.id)] == [canonical({"project": "hermes"})]
    # The owner role with no context sees nothing (FORCE).
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM search_metadata")
        assert cursor.fetchone()[0] == 0
    for agent, statement in (
        (None, "DELETE FROM search_metadata"),
        (None, "UPDATE search_metadata SET memories = 0"),
        # An agent may not even read them: they describe every agent's memories.
        (agents.research, "SELECT count(*) FROM search_metadata"),
    ):
        with (
            pytest.raises(ProgrammingError, match="permission denied"),
            tenancy.tenant(cast.alice.id, agent_id=agent.id if agent else None),
            connection.cursor() as cursor,
        ):
            cursor.execute(statement)


def test_deleting_a_user_leaves_nothing_of_their_metadata(cast):
    remember(cast.alice.id, "Alice's project is Apollo.", metadata={"project": "apollo"})
    remember(cast.charlie.id, "Charlie's project is Hermes.", metadata={"project": "hermes"})

    with tenancy.operator():
        cast.alice.delete()
        with connection.cursor() as cursor:
            cursor.execute("SELECT user_id, pair FROM search_metadata")
            rows = cursor.fetchall()
    assert rows == [(cast.charlie.id, '{"project": "hermes"}')]


values = st.one_of(
    st.sampled_from(["apollo", "zeus", "", "Ünïcode"]),
    st.integers(-2, 2),
    st.booleans(),
    st.none(),
    st.lists(st.sampled_from(["a", "b"]), max_size=2),
    # Around the length limit; validation refuses control characters.
    st.text(st.characters(exclude_categories=("Cc", "Cs")), min_size=240, max_size=260),
)
metadatas = st.dictionaries(st.sampled_from(["project", "kind", "n", "tags"]), values, max_size=3)
steps = st.lists(
    st.tuples(
        st.sampled_from(["add", "change", "expire", "keep", "drop"]), metadatas, st.integers()
    ),
    min_size=1,
    max_size=6,
)


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(steps=steps)
def test_any_sequence_of_writes_keeps_the_counts_exact(cast, steps):
    alice = cast.alice.id
    ids: list[str] = []
    for action, metadata, pick in steps:
        if action == "add" or not ids:
            ids.append(remember(alice, f"Fact {len(ids)} {pick}.", metadata=metadata))
            continue
        target = ids[pick % len(ids)]
        if action == "change":
            services.update_memory(user_id=alice, id=target, metadata=metadata)
        elif action == "drop":
            services.forget_by_id(user_id=alice, id=target)
            ids.remove(target)
        else:
            expiry = None if action == "keep" else datetime.now(UTC) + timedelta(days=1)
            with tenancy.operator(), connection.cursor() as cursor:
                cursor.execute(
                    "UPDATE memories SET expires_at = %s WHERE id = %s", [expiry, target]
                )
        assert_consistent(alice)
