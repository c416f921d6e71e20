"""``as_of`` answers from the history (issue 22), on the real database.

A search under ``as_of`` picks what was held true at T and shows each
memory as its version at T from ``memory_history``: content, metadata and
priority, with the version's number. One statement reads the versions of
all the results, in the search's transaction, under row-level security.
"""

from __future__ import annotations

import time
from datetime import datetime, timedelta

from django.db import connection
from django.db.models import F
from django.test.utils import CaptureQueriesContext

from accounts.tiers import Tier
from core import tenancy
from memories import services
from memories.models import MemoryHistory
from memories.services import past
from memories.services.shapes import Recalled

HOST = "Staging Postgres runs on pg-staging-3."
EDITED = "Staging Postgres runs on pg-staging-5 since the disk failed."
NEW = "Staging Postgres was migrated to pg-staging-7 last week."
QUESTION = "Which host does staging Postgres run on?"
CACHE = "Staging Redis cache runs on redis-staging-2."


def remember(user_id, content, **kwargs) -> str:
    return services.remember(user_id=user_id, tier=Tier.PRO, content=content, **kwargs)["id"]


def recalled(user_id, **kwargs) -> list[Recalled]:
    return services.recall(user_id=user_id, query=QUESTION, threshold=0.0, **kwargs)


def moment() -> str:
    """Now, as the database's clock reads it, between two writes a little apart."""
    time.sleep(0.05)
    with connection.cursor() as cursor:
        cursor.execute("SELECT clock_timestamp()")
        (now,) = cursor.fetchone()
    time.sleep(0.05)
    return now.isoformat()


def by_id(found: list[Recalled]) -> dict[str, Recalled]:
    return {m["id"]: m for m in found}


def test_filters_under_as_of_hold_for_the_version_shown(cast) -> None:
    # A result shown as it was then, with the metadata and priority it had
    # then, met the filters only with its values now: the answer contradicted
    # its own filter.
    edited = remember(cast.alice.id, HOST, metadata={"env": "staging"})
    then = moment()
    services.update_memory(
        user_id=cast.alice.id, id=edited, metadata={"env": "stage"}, priority="high"
    )

    def ids(**filters: object) -> list[str]:
        return [m["id"] for m in recalled(cast.alice.id, as_of=then, **filters)]

    assert ids(priority="high") == []
    assert ids(metadata_filter={"env": "stage"}) == []
    assert ids(priority="medium", metadata_filter={"env": "staging"}) == []  # not so now
    assert ids() == [edited]
    # Met then and now: shown as it was.
    [found] = recalled(cast.alice.id, as_of=then, priority=["medium", "high"])
    assert (found["priority"], found["metadata"]) == ("medium", {"env": "staging"})


def test_a_memory_edited_since_shows_as_it_was_then_with_its_version(cast) -> None:
    edited = remember(cast.alice.id, HOST, metadata={"env": "staging"})
    kept = remember(cast.alice.id, CACHE)
    then = moment()
    services.update_memory(
        user_id=cast.alice.id, id=edited, content=EDITED, metadata={"env": "stage"}, priority="high"
    )

    past_view = by_id(recalled(cast.alice.id, as_of=then))
    now_view = by_id(recalled(cast.alice.id))

    assert past_view[edited]["content"] == HOST
    assert past_view[edited]["metadata"] == {"env": "staging"}
    assert past_view[edited]["priority"] == "medium"
    assert past_view[edited]["version"] == 1
    # Not edited: its text, and the version it has always been.
    assert (past_view[kept]["content"], past_view[kept]["version"]) == (CACHE, 1)
    # Without as_of, the current version, and no version field.
    assert now_view[edited]["content"] == EDITED
    assert now_view[edited]["priority"] == "high"
    assert "version" not in now_view[edited]


def test_the_version_shown_is_the_latest_at_that_moment(cast) -> None:
    memory = remember(cast.alice.id, HOST)
    services.update_memory(user_id=cast.alice.id, id=memory, content=EDITED)
    then = moment()
    services.update_memory(user_id=cast.alice.id, id=memory, content=NEW)

    [found] = recalled(cast.alice.id, as_of=then)

    assert (found["content"], found["version"]) == (EDITED, 2)


def test_a_memory_asked_at_its_own_created_at_shows_its_first_version(cast) -> None:
    memory = remember(cast.alice.id, HOST)
    [listed] = services.list_memories(user_id=cast.alice.id)
    services.update_memory(user_id=cast.alice.id, id=memory, content=EDITED)

    # as_of includes the millisecond it names, as shown.
    [found] = recalled(cast.alice.id, as_of=listed["created_at"])

    assert (found["content"], found["version"]) == (HOST, 1)


def test_a_memory_whose_history_begins_later_shows_its_first_version(cast) -> None:
    memory = remember(cast.alice.id, HOST)
    then = moment()
    services.update_memory(user_id=cast.alice.id, id=memory, content=EDITED)
    # A history that begins after the memory's created_at (an insert late in
    # its transaction, a memory brought from elsewhere): nothing at T.
    with tenancy.operator():
        MemoryHistory.objects.filter(memory_id=memory).update(
            recorded_at=F("recorded_at") + timedelta(hours=1)
        )

    [found] = recalled(cast.alice.id, as_of=then)

    assert (found["content"], found["version"]) == (HOST, 1)


def test_a_memory_replaced_since_is_marked_with_its_text_then(cast) -> None:
    old = remember(cast.alice.id, HOST)
    then = moment()
    services.update_memory(user_id=cast.alice.id, id=old, content=EDITED)
    new = remember(cast.alice.id, NEW, replaces=old)

    [found] = recalled(cast.alice.id, as_of=then)

    assert found["id"] == old
    assert (found["content"], found["version"]) == (HOST, 1)
    assert found["superseded_by"] == new  # replaced since: marked


def test_a_memory_replaced_then_and_restored_since_was_not_held_true_then(cast) -> None:
    old = remember(cast.alice.id, HOST)
    new = remember(cast.alice.id, NEW, replaces=old)
    then = moment()
    services.restore(user_id=cast.alice.id, id=old)

    past_view = recalled(cast.alice.id, as_of=then)
    now_view = recalled(cast.alice.id)

    assert [m["id"] for m in past_view] == [new]
    assert {old, new} <= {m["id"] for m in now_view}


def test_a_result_left_out_then_makes_room_for_the_next_one(cast) -> None:
    # The best match was replaced at T (restored since): with limit 1 the
    # answer is the next memory held true then, not an empty list.
    old = remember(cast.alice.id, HOST)
    new = remember(cast.alice.id, NEW, replaces=old)
    other = remember(cast.alice.id, CACHE)
    then = moment()
    services.restore(user_id=cast.alice.id, id=old)
    services.forget_by_id(user_id=cast.alice.id, id=new)

    past_view = recalled(cast.alice.id, as_of=then, limit=1)
    all_then = recalled(cast.alice.id, as_of=then)

    assert [m["id"] for m in past_view] == [other]
    assert [m["id"] for m in all_then] == [other]


def test_one_statement_reads_the_versions_of_every_result(cast) -> None:
    for content in (HOST, CACHE, "The staging Kafka broker lives on kafka-stg-1."):
        remember(cast.alice.id, content)
    then = moment()

    with CaptureQueriesContext(connection) as queries:
        found = recalled(cast.alice.id, as_of=then)

    assert len(found) == 3
    assert all(m["version"] == 1 for m in found)
    reads = [q["sql"] for q in queries.captured_queries if "memory_history" in q["sql"]]
    assert len(reads) == 1


def test_another_tenants_history_never_shows(cast) -> None:
    alices = remember(cast.alice.id, HOST)
    services.update_memory(user_id=cast.alice.id, id=alices, content=EDITED)
    until = datetime.fromisoformat(moment())

    # Charlie's transaction, asking for Alice's rows by id and by user:
    # forced row-level security answers nothing.
    with tenancy.tenant(cast.charlie.id):
        stolen = past.versions_at(cast.alice.id, [alices], until)
    with tenancy.tenant(cast.alice.id):
        own = past.versions_at(cast.alice.id, [alices], until)

    assert stolen == {}
    assert own[alices].content == EDITED
    assert recalled(cast.charlie.id, as_of=until.isoformat()) == []


def test_an_agent_never_reads_another_agents_history(cast, agents) -> None:
    writers = remember(cast.alice.id, HOST, agent_id=agents.writer.id)
    until = datetime.fromisoformat(moment())

    with tenancy.tenant(cast.alice.id, agent_id=agents.research.id):
        other = past.versions_at(cast.alice.id, [writers], until)
    with tenancy.tenant(cast.alice.id, agent_id=agents.writer.id):
        own = past.versions_at(cast.alice.id, [writers], until)

    assert other == {}
    assert own[writers].content == HOST
