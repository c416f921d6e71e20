"""A search outside a transaction opens its tenant transaction, ranks and commits in one trip.

``core.tenancy.read_once`` sends BEGIN, the role switch and settings, the
ranking statement and COMMIT together; ``memories.search.found_rows`` loads
the rows as the ORM would. Inside a transaction (a test's, a forget preview's)
the search takes ``tenant()`` as before: both must find the same thing, and
the one-round-trip path must keep tenants and agents apart as strictly.
"""

from __future__ import annotations

import pytest
from django.db import connection, transaction
from psycopg.pq import TransactionStatus

from accounts.tiers import Tier
from core import tenancy
from memories import search, services

pytestmark = pytest.mark.django_db(transaction=True)

NOTES = [
    ("Alice drinks green tea every morning before work.", {"kind": "habit"}, "high"),
    ("The green tea shop on Elm Street closed in March.", {"kind": "fact"}, None),
    ("Alice's build pipeline runs on Fridays after lunch.", {"kind": "work"}, "low"),
    ("Charlie's tea is never green.", {}, None),
]


@pytest.fixture(autouse=True)
def no_result_cache(settings):
    """These tests compare the ranking's two paths: no cached answer stands in for either,
    and newer first's statement of its own (a pair's cosine) is not counted as one."""
    settings.RESULT_CACHE_SIZE = 0
    settings.RECALL_NEWER_FIRST = False


@pytest.fixture
def one_round_trip(monkeypatch):
    """Count the searches read_once answered (rather than declined)."""
    answered: list[int] = []
    real = tenancy.read_many

    def counting(*args, **kwargs):
        rows = real(*args, **kwargs)
        if rows is not None:
            answered.append(len(rows[-1].rows))
        return rows

    # read_once is read_many of one statement; a search reads its namespace's
    # generation for the result cache (memories/results.py) before it ranks.
    monkeypatch.setattr(tenancy, "read_many", counting)
    return answered


def store(user_id, agent_id=None) -> None:
    for content, metadata, priority in NOTES:
        arguments = {"content": content, "metadata": metadata, "namespace": "tea"}
        if priority:
            arguments["priority"] = priority
        services.remember(user_id=user_id, tier=Tier.PRO, agent_id=agent_id, **arguments)


def found(user_id, agent_id=None, **arguments) -> list[search.Found]:
    args = search.SearchArgs.parse(query="green tea", namespace="tea", threshold=0, **arguments)
    return search.search(user_id=user_id, args=args, agent_id=agent_id).found


@pytest.mark.parametrize("mode", ["hybrid", "semantic", "lexical"])
def test_it_finds_what_the_tenant_transaction_finds_field_for_field(cast, one_round_trip, mode):
    store(cast.alice.id)

    once = found(cast.alice.id, mode=mode)
    assert one_round_trip, "the search did not take the one-round-trip path"
    with transaction.atomic():  # inside a transaction: tenant(), as before
        before = found(cast.alice.id, mode=mode)
    assert len(one_round_trip) == 1

    assert once and [f.memory.id for f in once] == [f.memory.id for f in before]
    for new, old in zip(once, before, strict=True):
        assert (new.similarity, new.score) == (old.similarity, old.score)
        for field in ("content", "metadata", "priority", "namespace", "user_id", "agent_id"):
            assert getattr(new.memory, field) == getattr(old.memory, field), field
        assert new.memory.created_at == old.memory.created_at
        assert new.memory.created_at.tzinfo is not None
        assert isinstance(new.memory.metadata, dict)
        assert new.memory._state.adding is False  # loaded, as the ORM marks it


def test_a_filtered_search_takes_the_same_path(cast, one_round_trip):
    store(cast.alice.id)

    results = found(cast.alice.id, metadata_filter={"kind": "fact"})

    assert [f.memory.content for f in results] == [NOTES[1][0]]
    assert one_round_trip == [1]


def test_it_keeps_tenants_and_agents_apart(cast, agents, one_round_trip):
    store(cast.alice.id, agent_id=agents.research.id)
    services.remember(
        user_id=cast.alice.id,
        tier=Tier.PRO,
        agent_id=agents.writer.id,
        content="The writer agent prefers green tea too.",
        namespace="tea",
    )

    assert found(cast.charlie.id) == []
    as_research = found(cast.alice.id, agent_id=agents.research.id)
    as_writer = found(cast.alice.id, agent_id=agents.writer.id)
    as_alice = found(cast.alice.id)

    assert {f.memory.agent_id for f in as_research} == {agents.research.id}
    assert [f.memory.content for f in as_writer] == ["The writer agent prefers green tea too."]
    assert len(as_alice) == len(NOTES) + 1
    assert len(one_round_trip) == 4


def test_a_failed_statement_leaves_no_transaction_open(cast, monkeypatch):
    store(cast.alice.id)
    monkeypatch.setattr(search, "statement", lambda *a, **k: ("SELECT 1 / 0 AS x", {}))

    with pytest.raises(Exception, match="division by zero"):
        found(cast.alice.id)

    assert tenancy.current() is None
    assert connection.connection.info.transaction_status == TransactionStatus.IDLE
    # The connection still serves, and no tenant setting survived the failure.
    with connection.cursor() as cursor:
        cursor.execute("SELECT current_user, current_setting('app.current_user_id', true)")
        role, tenant = cursor.fetchone()
    assert role != tenancy.APP_ROLE
    assert not tenant
    monkeypatch.undo()
    assert [f.memory.content for f in found(cast.alice.id, mode="lexical")][:1]
