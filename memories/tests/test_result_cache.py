"""The search result cache (memories/results.py) on the real database.

A repeated search answers from the cache, without the ranking statement; any
write of the namespace, by any connection, or an expiry passing, makes the
next search rank afresh; a write elsewhere does not; tenants never share an
entry; a cached answer is the uncached one, field for field.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from django.db import ProgrammingError, connection
from django.utils import timezone
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from accounts.tiers import Tier
from core import tenancy
from core.errors import Conflict
from memories import results, search, services
from memories.embeddings import cache
from memories.services import maintenance, superseding

pytestmark = pytest.mark.django_db(transaction=True)

NOTES = [
    "Alice drinks green tea every morning before work.",
    "The green tea shop on Elm Street closed in March.",
    "Alice's build pipeline runs on Fridays after lunch.",
    "Green tea with jasmine is Alice's favourite in winter.",
]
QUERY = "green tea"


@pytest.fixture(autouse=True)
def empty_cache():
    results.reset_cache()
    yield
    results.reset_cache()


@pytest.fixture
def ranked(monkeypatch) -> list[int]:
    """Count the ranking statements built: one per search the cache did not answer."""
    built: list[int] = []
    real = search.statement

    def counting(*args: Any, **kwargs: Any) -> Any:
        built.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(search, "statement", counting)
    return built


def remember(user_id: Any, content: str, namespace: str = "tea", **kwargs: Any) -> str:
    stored = services.remember(
        user_id=user_id, tier=Tier.PRO, content=content, namespace=namespace, **kwargs
    )
    return str(stored["id"])


def store(user_id: Any, namespace: str = "tea") -> list[str]:
    return [remember(user_id, note, namespace) for note in NOTES]


def find(user_id: Any, namespace: str = "tea", **arguments: Any) -> search.Searched:
    agent = arguments.pop("agent", None)
    arguments.setdefault("query", QUERY)
    arguments.setdefault("threshold", 0)
    args = search.SearchArgs.parse(namespace=namespace, **arguments)
    return search.search(user_id=user_id, args=args, agent_id=agent)


def answer(searched: search.Searched) -> list[tuple[Any, ...]]:
    return [
        (str(f.memory.id), f.similarity, f.score, f.rank, f.memory.content, f.memory.priority)
        for f in searched.found
    ]


def fresh(user_id: Any, namespace: str = "tea", **arguments: Any) -> list[tuple[Any, ...]]:
    """The uncached answer (the cache bypassed, as prefer_cache=false does)."""
    return answer(find(user_id, namespace, use_cache=False, **arguments))


@pytest.mark.parametrize("mode", ["hybrid", "semantic", "lexical"])
def test_a_repeated_search_answers_from_the_cache_without_ranking(cast, ranked, mode):
    store(cast.alice.id)
    first = find(cast.alice.id, mode=mode)
    assert not first.cached and len(ranked) == 1

    second = find(cast.alice.id, mode=mode)

    assert second.cached
    assert len(ranked) == 1, "the ranking statement ran again"
    assert answer(second) == answer(first) and answer(first)
    for new, old in zip(second.found, first.found, strict=True):
        assert new.memory.created_at == old.memory.created_at
        assert new.memory.metadata == old.memory.metadata
        assert new.memory._state.adding is False
    stats = results.stats(cache.scope(cast.alice.id))
    assert (stats.hits, stats.misses, stats.size) == (1, 1, 1)


def test_search_memories_says_cache_when_the_result_cache_answered(cast):
    store(cast.alice.id)
    services.search_memories(user_id=cast.alice.id, query=QUERY, namespace="tea")
    found, source = services.search_memories(user_id=cast.alice.id, query=QUERY, namespace="tea")
    assert source == "cache" and found


def test_prefer_cache_false_ranks_afresh(cast, ranked):
    store(cast.alice.id)
    find(cast.alice.id)
    searched = find(cast.alice.id, use_cache=False)
    assert not searched.cached and len(ranked) == 2


def test_each_argument_of_the_search_is_part_of_the_key(cast, ranked):
    store(cast.alice.id)
    variants: list[dict[str, Any]] = [
        {},
        {"limit": 2},
        {"threshold": 0.3},
        {"mode": "semantic"},
        {"query": "tea shop"},
        {"priority": "high"},
        {"metadata_filter": {"kind": "habit"}},
        {"created_after": "2020-01-01T00:00:00Z"},
        {"created_before": "2999-01-01T00:00:00Z"},
        {"include_superseded": True},
        {"as_of": "2999-01-01T00:00:00Z"},
    ]
    for arguments in variants:
        find(cast.alice.id, **arguments)
    assert len(ranked) == len(variants), "a different search was answered from another's entry"
    for arguments in variants:
        assert find(cast.alice.id, **arguments).cached
    assert len(ranked) == len(variants)


def _replace(user_id: Any, ids: list[str]) -> None:
    remember(user_id, "Alice switched from green tea to coffee.", replaces=ids[0])


def _restore(user_id: Any, ids: list[str]) -> None:
    _replace(user_id, ids)
    find(user_id)  # cache the answer with the replacement in it
    superseding.restore(user_id=user_id, id=ids[0])


WRITES = {
    "remember": lambda user_id, ids: remember(user_id, "Green tea is brewed at 80 degrees."),
    "update content": lambda user_id, ids: services.update_memory(
        user_id=user_id, id=ids[2], content="Alice's green tea order is sencha."
    ),
    "update priority": lambda user_id, ids: services.update_memory(
        user_id=user_id, id=ids[1], priority="critical"
    ),
    "forget": lambda user_id, ids: services.forget(user_id=user_id, mode="by_id", id=ids[0]),
    "supersede": _replace,
    "restore": _restore,
}


@pytest.mark.parametrize("write", sorted(WRITES))
def test_a_write_in_the_namespace_makes_the_next_search_fresh(cast, ranked, write):
    ids = store(cast.alice.id)
    before = answer(find(cast.alice.id))

    WRITES[write](cast.alice.id, ids)
    built = len(ranked)
    after = find(cast.alice.id)

    assert not after.cached and len(ranked) == built + 1
    assert answer(after) == fresh(cast.alice.id)
    assert answer(after) != before, "the write should change this answer"


def test_a_write_from_another_connection_makes_the_next_search_fresh(cast, ranked):
    """Another worker, another server, or psql: only the database knows; it is asked."""
    ids = store(cast.alice.id)
    find(cast.alice.id)
    assert find(cast.alice.id).cached and len(ranked) == 1

    settings_dict = connection.settings_dict
    with psycopg.connect(
        host=settings_dict["HOST"],
        port=settings_dict["PORT"],
        dbname=settings_dict["NAME"],
        user=settings_dict["USER"],
        password=settings_dict["PASSWORD"],
        autocommit=True,
    ) as other:
        other.execute("SET ROLE recall_operator")
        # The same memories, one of them reworded: only the generation can tell.
        other.execute(
            "UPDATE memories SET content = 'Green tea, twice a day.' WHERE id = %s", [ids[3]]
        )

    after = find(cast.alice.id)
    assert not after.cached and len(ranked) == 2
    assert answer(after) == fresh(cast.alice.id)
    assert "Green tea, twice a day." in [row[4] for row in answer(after)]


def test_a_purge_of_expired_memories_makes_the_next_search_fresh(cast, ranked):
    store(cast.alice.id)
    soon = remember(cast.alice.id, "Green tea tasting on Saturday.", ttl_seconds=60)
    assert soon in [row[0] for row in answer(find(cast.alice.id))]

    maintenance.clean_up(now=timezone.now() + timedelta(minutes=2))  # deletes it: a write

    after = find(cast.alice.id)
    assert not after.cached and len(ranked) == 2
    assert soon not in [row[0] for row in answer(after)]


@pytest.mark.parametrize("among_results", [True, False])
def test_an_expiry_passing_makes_the_next_search_fresh_without_a_write(cast, ranked, among_results):
    """Expiry leaves results with no write: the entry lasts until the namespace's next one.

    Not only a result's: a memory outside the results that expires can let
    another in (a pool, a neighbour's lift), so it ends the entry too.
    """
    store(cast.alice.id)
    content = "Green tea tasting today." if among_results else "Quarterly tax filing reminder."
    expiry = timezone.now() + timedelta(seconds=1.5)
    soon = remember(cast.alice.id, content, expires_at=expiry.isoformat())
    first = answer(find(cast.alice.id, limit=3 if among_results else 2))
    assert (soon in [row[0] for row in first]) is among_results
    assert find(cast.alice.id, limit=3 if among_results else 2).cached

    time.sleep(max(0.0, (expiry - timezone.now()).total_seconds()) + 0.3)
    after = find(cast.alice.id, limit=3 if among_results else 2)

    assert not after.cached and len(ranked) == 2
    assert soon not in [row[0] for row in answer(after)]


def test_a_write_in_another_namespace_or_tenant_keeps_the_entry(cast, ranked):
    store(cast.alice.id)
    store(cast.charlie.id)
    find(cast.alice.id)

    remember(cast.alice.id, "Green tea notes for the garden.", namespace="garden")
    remember(cast.charlie.id, "Charlie's green tea is never sweet.")

    assert find(cast.alice.id).cached and len(ranked) == 1


def test_two_tenants_with_the_same_search_never_share_an_entry(cast, ranked):
    alice_ids = store(cast.alice.id)
    charlie_ids = store(cast.charlie.id)
    alice = find(cast.alice.id)
    charlie = find(cast.charlie.id)

    assert not charlie.cached and len(ranked) == 2
    assert {row[0] for row in answer(alice)} <= set(alice_ids)
    assert {row[0] for row in answer(charlie)} <= set(charlie_ids)
    charlie_stats = results.stats(cache.scope(cast.charlie.id))
    assert (charlie_stats.hits, charlie_stats.stale, charlie_stats.misses) == (0, 0, 1)
    assert find(cast.charlie.id).cached and find(cast.alice.id).cached


def test_an_agent_and_its_user_keep_apart_entries(cast, agents, ranked):
    store(cast.alice.id)
    remember(cast.alice.id, "The research agent's green tea list.", agent_id=agents.research.id)
    user = answer(find(cast.alice.id))
    agent = answer(find(cast.alice.id, agent=agents.research.id))
    assert len(ranked) == 2 and user != agent
    assert answer(find(cast.alice.id, agent=agents.research.id)) == agent
    assert len(ranked) == 2

    # Another agent's write in the namespace: the research agent's entry is checked anew.
    remember(cast.alice.id, "Writer's green tea draft.", agent_id=agents.writer.id)
    assert not find(cast.alice.id, agent=agents.research.id).cached


def generation(user_id: Any, namespace: str = "tea") -> int:
    with tenancy.tenant(user_id), connection.cursor() as cursor:
        cursor.execute("SELECT generation FROM recall_search_state(%s)", [namespace])
        return int(cursor.fetchone()[0])


STATEMENTS = {
    "a column no search reads": "UPDATE memories SET author = 'someone' WHERE id = %(id)s",
    "the expiry": "UPDATE memories SET expires_at = now() + interval '1 day' WHERE id = %(id)s",
    "the vector": "UPDATE memories SET embedding = embedding WHERE id = %(id)s",
    "the namespace (away)": "UPDATE memories SET namespace = 'elsewhere' WHERE id = %(id)s",
    "a delete": "DELETE FROM memories WHERE id = %(id)s",
}


@pytest.mark.parametrize("what", sorted(STATEMENTS))
def test_every_statement_that_writes_a_namespace_gives_it_a_new_generation(cast, what):
    ids = store(cast.alice.id)
    store(cast.alice.id, namespace="garden")
    before, garden = generation(cast.alice.id), generation(cast.alice.id, "garden")
    assert before > 0

    with tenancy.operator(), connection.cursor() as cursor:
        cursor.execute(STATEMENTS[what], {"id": ids[0]})
        assert cursor.rowcount == 1
        cursor.execute("UPDATE memories SET author = 'nobody' WHERE false")  # no row: no change

    assert generation(cast.alice.id) != before
    assert generation(cast.alice.id, "garden") == garden


def test_deleting_a_user_deletes_its_generations(cast):
    store(cast.charlie.id)
    store(cast.alice.id)
    with tenancy.operator():  # as the admin deletes a user (on the operator path)
        cast.charlie.delete()
    assert generation(cast.alice.id) > 0
    with tenancy.operator(), connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM search_generations WHERE user_id = %s", [cast.charlie.id]
        )
        assert cursor.fetchone()[0] == 0


def test_the_generations_are_under_row_level_security(cast, agents):
    store(cast.alice.id)
    store(cast.charlie.id, namespace="charlie-tea")
    with tenancy.tenant(cast.charlie.id), connection.cursor() as cursor:
        cursor.execute("SELECT user_id, namespace FROM search_generations")
        rows = cursor.fetchall()
        cursor.execute("SELECT generation FROM recall_search_state('tea')")
        own = cursor.fetchone()[0]
    assert [(str(user), ns) for user, ns in rows] == [(str(cast.charlie.id), "charlie-tea")]
    assert own == 0  # Alice's "tea" is not Charlie's

    denied = pytest.raises(ProgrammingError, match="permission denied")
    agent = tenancy.tenant(cast.alice.id, agent_id=agents.research.id)
    with denied, agent, connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM search_generations")
    denied = pytest.raises(ProgrammingError, match="permission denied")
    with denied, tenancy.tenant(cast.alice.id), connection.cursor() as cursor:
        cursor.execute("UPDATE search_generations SET generation = 1")


def test_optimize_cache_with_force_refresh_drops_the_callers_answers(cast, ranked):
    store(cast.alice.id)
    store(cast.charlie.id)
    find(cast.alice.id)
    find(cast.charlie.id)

    done = services.optimize_cache(user_id=cast.alice.id, force_refresh=True)

    assert done["refreshed"] >= 1
    assert not find(cast.alice.id).cached
    assert find(cast.charlie.id).cached


# Random interleavings: whatever happened, a cached answer is the uncached one.
OPERATION = st.one_of(
    st.tuples(st.just("search"), st.sampled_from(["hybrid", "semantic", "lexical"])),
    st.tuples(st.just("remember"), st.sampled_from([*NOTES, "Oolong is a tea too."])),
    st.tuples(st.just("forget"), st.integers(0, 20)),
    st.tuples(st.just("priority"), st.integers(0, 20)),
    st.tuples(st.just("content"), st.integers(0, 20)),
)


@settings(
    max_examples=12,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(st.lists(OPERATION, min_size=4, max_size=14))
# Found by a CI run: two memories edited to the same text, the second refused.
@example(
    operations=[
        ("content", 4),
        ("remember", "Oolong is a tea too."),
        ("content", 4),
        ("search", "hybrid"),
    ]
)
def test_a_cached_answer_is_always_the_uncached_one(cast, operations):
    namespace = f"prop-{uuid.uuid4().hex[:12]}"
    ids = store(cast.alice.id, namespace)[:2]
    for kind, value in operations:
        if kind == "search":
            cached = find(cast.alice.id, namespace, mode=value)
            assert answer(cached) == fresh(cast.alice.id, namespace, mode=value)
        elif kind == "remember":
            stored = remember(cast.alice.id, f"{value} ({len(ids)})", namespace)
            if stored not in ids:  # a text said again is the same memory, not a second one
                ids.append(stored)
        elif ids and kind == "forget":
            services.forget(user_id=cast.alice.id, mode="by_id", id=ids.pop(value % len(ids)))
        elif ids and kind == "priority":
            level = ["low", "medium", "high"][value % 3]
            services.update_memory(user_id=cast.alice.id, id=ids[value % len(ids)], priority=level)
        elif ids and kind == "content":
            target = ids[value % len(ids)]
            # Another memory may already say it: refused, nothing written.
            with contextlib.suppress(Conflict):
                services.update_memory(
                    user_id=cast.alice.id, id=target, content=f"Green tea, version {value}."
                )
