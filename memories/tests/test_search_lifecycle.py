"""Search with agents, expiry, priority and purges: every mode, every retrieval path.

The lexical side reads the search tables through definer functions that stand
outside memories' policies; these tests hold them to the same rules: an agent
finds only what it may read, nobody finds an expired memory, priority only
breaks ties, and a purge leaves nothing of the content behind.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from accounts.tiers import Tier
from core import tenancy
from memories import services

MODES = ("hybrid", "semantic", "lexical")
RESEARCH_NOTE = "The Kessler reactor coolant pressure limit is 7731 kilopascals."
WRITER_NOTE = "The Kessler style guide prefers the Oxford comma in every chapter."
QUERY = "Kessler reactor coolant pressure 7731"


def remember(user_id, content, agent=None, **extra) -> str:
    return services.remember(
        user_id=user_id,
        tier=Tier.PRO,
        content=content,
        agent_id=agent.id if agent else None,
        **extra,
    )["id"]


def found(user_id, agent=None, mode="hybrid", query=QUERY, **extra) -> list[str]:
    hits = services.recall(
        user_id=user_id,
        agent_id=agent.id if agent else None,
        query=query,
        mode=mode,
        threshold=0,
        **extra,
    )
    return [hit["content"] for hit in hits]


def search_rows(memory_id) -> int:
    with tenancy.operator(), connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM search_documents WHERE memory_id = %s", [memory_id])
        return cursor.fetchone()[0]


def lexemes(user_id) -> set[str]:
    with tenancy.operator(), connection.cursor() as cursor:
        cursor.execute("SELECT lexeme FROM search_terms WHERE user_id = %s", [str(user_id)])
        return {row[0] for row in cursor.fetchall()}


# Agents ---------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_an_agent_finds_only_its_own_memories_in_every_mode(cast, agents, mode):
    remember(cast.alice.id, RESEARCH_NOTE, agents.research)
    remember(cast.alice.id, WRITER_NOTE, agents.writer)

    as_writer = found(cast.alice.id, agents.writer, mode, query="Kessler")
    as_research = found(cast.alice.id, agents.research, mode, query="Kessler")

    assert RESEARCH_NOTE not in as_writer
    assert as_research == [RESEARCH_NOTE]
    assert WRITER_NOTE in as_writer


@pytest.mark.parametrize("mode", MODES)
def test_the_user_wide_path_finds_every_agents_memories(cast, agents, mode):
    remember(cast.alice.id, RESEARCH_NOTE, agents.research)
    remember(cast.alice.id, WRITER_NOTE, agents.writer)

    assert set(found(cast.alice.id, mode=mode, query="Kessler")) == {RESEARCH_NOTE, WRITER_NOTE}


@pytest.mark.parametrize("mode", MODES)
def test_another_tenants_agent_finds_nothing_of_alices(cast, agents, mode):
    remember(cast.alice.id, RESEARCH_NOTE, agents.research)
    remember(cast.alice.id, RESEARCH_NOTE)

    assert found(cast.charlie.id, agents.helper, mode) == []
    assert found(cast.charlie.id, mode=mode) == []


def test_memory_search_finds_another_agents_memory_filed_under_the_named_task(cast, agents):
    services.add_note(
        user_id=cast.alice.id,
        tier=Tier.PRO,
        agent_id=agents.research.id,
        content=RESEARCH_NOTE,
        task_id="audit-7",
    )

    def search(**filters) -> list[str]:
        hits = services.search_sources(
            user_id=cast.alice.id, agent_id=agents.writer.id, query=QUERY, threshold=0, **filters
        )
        return [hit["content"] for hit in hits]

    assert search() == []
    assert search(task_id="audit-7") == [RESEARCH_NOTE]
    assert search(task_id="audit-8") == []


def test_the_lexical_function_applies_the_agent_rule_itself(cast, agents):
    remember(cast.alice.id, RESEARCH_NOTE, agents.research)

    def matches(agent) -> int:
        with (
            tenancy.tenant(cast.alice.id, agent_id=agent.id if agent else None),
            connection.cursor() as cursor,
        ):
            cursor.execute(
                "SELECT count(*) FROM recall_lexical_matches('default', '{7731}', '{7731}',"
                " '{1}', 10, 0.9, 0.4, 10, NULL, NULL, NULL, NULL, NULL)"
            )
            return cursor.fetchone()[0]

    assert matches(agents.research) == 1
    assert matches(agents.writer) == 0
    assert matches(None) == 1


# Expiry ---------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_an_expired_memory_is_found_in_no_mode(cast, mode):
    memory_id = remember(cast.alice.id, RESEARCH_NOTE, ttl_seconds=60)
    assert found(cast.alice.id, mode=mode) == [RESEARCH_NOTE]

    with tenancy.operator():
        from memories.models import Memory

        Memory.objects.filter(id=memory_id).update(expires_at=timezone.now() - timedelta(1))

    assert found(cast.alice.id, mode=mode) == []
    # Maintenance has not purged it yet: it is the search that skips it.
    assert search_rows(memory_id) == 1


def test_a_changed_expiry_reaches_the_search_document(cast):
    memory_id = remember(cast.alice.id, RESEARCH_NOTE)
    later = timezone.now() + timedelta(days=3)
    with tenancy.operator():
        from memories.models import Memory

        Memory.objects.filter(id=memory_id).update(expires_at=later)
    with tenancy.operator(), connection.cursor() as cursor:
        cursor.execute("SELECT expires_at FROM search_documents WHERE memory_id = %s", [memory_id])
        assert cursor.fetchone()[0] == later


# Priority -------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_priority_breaks_a_tie_in_every_mode(cast, mode):
    remember(cast.alice.id, "Gym locker code: 7731", priority="low")
    remember(cast.alice.id, "Gym locker code - 7731", priority="critical")

    hits = services.recall(
        user_id=cast.alice.id, query="gym locker code 7731", mode=mode, threshold=0
    )

    assert [hit["priority"] for hit in hits] == ["critical", "low"]


def test_priority_filters_inside_the_search(cast):
    remember(cast.alice.id, RESEARCH_NOTE, priority="low")
    remember(cast.alice.id, "Kessler reactor coolant notes, pressure 7731.", priority="high")

    for mode in MODES:
        hits = services.recall(
            user_id=cast.alice.id, query=QUERY, mode=mode, threshold=0, priority="high"
        )
        assert [hit["priority"] for hit in hits] == ["high"], mode


# Purges and deletions -------------------------------------------------------------


def test_forget_with_purge_leaves_nothing_of_the_content_in_the_search_tables(cast):
    memory_id = remember(cast.alice.id, "Zanzibarian quokka passphrase wombatical.")
    remember(cast.alice.id, TEA := "Alice drinks green tea.")
    assert {"zanzibarian", "quokka", "wombat"} <= lexemes(cast.alice.id)

    services.forget_by_id(user_id=cast.alice.id, id=memory_id, purge=True)

    assert search_rows(memory_id) == 0
    assert not {"zanzibarian", "quokka", "wombat"} & lexemes(cast.alice.id)
    assert found(cast.alice.id, query="Zanzibarian quokka", mode="lexical") == []
    assert found(cast.alice.id, query="green tea", mode="lexical") == [TEA]


def test_deleting_a_whole_namespace_empties_its_search_statistics(cast):
    for n in range(3):
        remember(cast.alice.id, f"Note {n} about the Zanzibarian quokka.", namespace="scratch")
    remember(cast.alice.id, "Alice drinks green tea.")

    services.forget_namespace(user_id=cast.alice.id, namespace="scratch", purge=True)

    with tenancy.operator(), connection.cursor() as cursor:
        for table in ("search_documents", "search_terms", "search_namespaces"):
            cursor.execute(
                f"SELECT count(*) FROM {table} WHERE user_id = %s AND namespace = 'scratch'",  # noqa: S608
                [str(cast.alice.id)],
            )
            assert cursor.fetchone()[0] == 0, table


def test_an_import_is_searchable_at_once(cast):
    remember(cast.alice.id, RESEARCH_NOTE)
    exported = list(services.export_memories(user_id=cast.alice.id))
    services.forget_namespace(user_id=cast.alice.id, namespace="default", purge=True)
    assert found(cast.alice.id, mode="lexical") == []

    services.import_memories(user_id=cast.alice.id, records=exported)

    assert found(cast.alice.id, mode="lexical") == [RESEARCH_NOTE]
