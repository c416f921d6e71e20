"""Agents are isolated by the database: a matrix of who can read and change what.

Alice owns two agents, research and writer, and writes user-wide memories
with her API key; Charlie owns helper. Every check below runs raw SQL inside
a tenancy context, so what it proves holds whatever the services' WHERE
clauses say.

Who sees what (README, "Agents and isolation"):

* an agent reads its own memories, and, only in a transaction that names a
  task, its user's other agents' memories filed under that task;
* an agent inserts, updates and deletes only its own memories, never a
  shared task's nor a user-wide one;
* the user-wide path (an unscoped API key, the dashboard) reads and changes
  all of its user's memories, whichever agent wrote them;
* nothing of one user is ever visible to another, whatever agent or task
  ids a transaction names.
"""

from __future__ import annotations

import uuid

import pytest
from django.db import IntegrityError, connection
from django.db.utils import ProgrammingError

from accounts.models import Agent, ApiKey
from accounts.tiers import Tier
from billing.models import UsageEvent
from core import tenancy
from core.errors import NotFound, QuotaExceeded
from memories import services
from memories.models import ForgetConfirmation, Memory
from tests.support import fill_memories, store_memory


@pytest.fixture
def world(cast, agents):
    """One memory per owner, plus task memories, named by their content."""
    store_memory(cast.alice, "alice user-wide")
    store_memory(cast.alice, "research own", agent=agents.research)
    store_memory(cast.alice, "research on task T", agent=agents.research, task_id="T")
    store_memory(cast.alice, "research on task U", agent=agents.research, task_id="U")
    store_memory(cast.alice, "writer own", agent=agents.writer)
    store_memory(cast.alice, "writer on task T", agent=agents.writer, task_id="T")
    store_memory(cast.charlie, "charlie user-wide")
    store_memory(cast.charlie, "helper on task T", agent=agents.helper, task_id="T")
    return cast, agents


def visible(user_id, agent_id=None, task_id=None) -> set[str]:
    with (
        tenancy.tenant(user_id, agent_id=agent_id, task_id=task_id),
        connection.cursor() as cursor,
    ):
        # No WHERE at all: only the policies decide.
        cursor.execute("SELECT content FROM memories")
        return {row[0] for row in cursor.fetchall()}


ALICE_ALL = {
    "alice user-wide",
    "research own",
    "research on task T",
    "research on task U",
    "writer own",
    "writer on task T",
}


@pytest.mark.parametrize(
    ("who", "task", "expected"),
    [
        ("alice", None, ALICE_ALL),
        ("research", None, {"research own", "research on task T", "research on task U"}),
        (
            "research",
            "T",
            {"research own", "research on task T", "research on task U", "writer on task T"},
        ),
        ("writer", None, {"writer own", "writer on task T"}),
        ("writer", "T", {"writer own", "writer on task T", "research on task T"}),
        ("writer", "U", {"writer own", "writer on task T", "research on task U"}),
        ("writer", "nobody-uses-this", {"writer own", "writer on task T"}),
        ("charlie", None, {"charlie user-wide", "helper on task T"}),
        ("helper", None, {"helper on task T"}),
        # Same task id as Alice's agents: still only Charlie's own.
        ("helper", "T", {"helper on task T"}),
    ],
)
def test_each_context_reads_exactly_its_rows(world, who, task, expected):
    cast, agents = world
    user = cast.charlie if who in ("charlie", "helper") else cast.alice
    agent = getattr(agents, who, None) if who not in ("alice", "charlie") else None
    assert visible(user.id, agent.id if agent else None, task) == expected


def test_an_agent_id_of_another_user_reveals_nothing(world):
    cast, agents = world
    # Charlie's transaction naming Alice's agent: the user check still binds.
    assert visible(cast.charlie.id, agents.research.id) == set()
    # Naming a task as well adds only Charlie's own memories of that task.
    assert visible(cast.charlie.id, agents.research.id, "T") == {"helper on task T"}
    # And an agent id that does not exist sees nothing at all.
    assert visible(cast.alice.id, uuid.uuid4(), None) == set()


def insert_as(user_id, agent_id, row_agent_id, row_user_id=None, task_id=None) -> None:
    with (
        tenancy.tenant(user_id, agent_id=agent_id, task_id=task_id),
        connection.cursor() as cursor,
    ):
        cursor.execute(
            "INSERT INTO memories (id, user_id, agent_id, namespace, content, content_hash,"
            " embedding, embedding_model, metadata, task_id)"
            " VALUES (%s, %s, %s, 'default', 'x', %s, '[1,0]', 't', '{}', %s)",
            [uuid.uuid4(), row_user_id or user_id, row_agent_id, uuid.uuid4().hex, task_id],
        )


def test_an_agent_cannot_write_as_a_sibling_or_as_the_user(world):
    cast, agents = world
    for row_agent in (agents.writer.id, None):
        with pytest.raises(ProgrammingError, match="row-level security"):
            insert_as(cast.alice.id, agents.research.id, row_agent)
    # Naming a task does not widen what may be written.
    with pytest.raises(ProgrammingError, match="row-level security"):
        insert_as(cast.alice.id, agents.research.id, agents.writer.id, task_id="T")


def test_a_memory_cannot_name_another_users_agent(world):
    cast, agents = world
    # The user-wide path may write any agent's row, but only its own user's
    # agents: the composite key refuses Charlie's agent on Alice's row.
    with pytest.raises(IntegrityError, match="memories_agent_same_user"):
        insert_as(cast.alice.id, None, agents.helper.id)


def change(user_id, agent_id, content: str, task_id=None, *, delete: bool) -> int:
    with (
        tenancy.tenant(user_id, agent_id=agent_id, task_id=task_id),
        connection.cursor() as cursor,
    ):
        if delete:
            cursor.execute("DELETE FROM memories WHERE content = %s", [content])
        else:
            cursor.execute(
                "UPDATE memories SET metadata = '{\"touched\": true}' WHERE content = %s",
                [content],
            )
        return cursor.rowcount


@pytest.mark.parametrize("delete", [False, True], ids=["update", "delete"])
def test_shared_task_memories_are_read_only_to_other_agents(world, delete):
    cast, agents = world
    # Writer sees research's task T memory when naming T, but cannot change it.
    assert change(cast.alice.id, agents.writer.id, "research on task T", "T", delete=delete) == 0
    assert change(cast.alice.id, agents.writer.id, "alice user-wide", "T", delete=delete) == 0
    assert change(cast.alice.id, agents.writer.id, "writer on task T", "T", delete=delete) == 1
    # The user owns every agent's memories.
    assert change(cast.alice.id, None, "research own", delete=delete) == 1
    # Charlie can change nothing of Alice's.
    assert change(cast.charlie.id, None, "research own", delete=delete) == 0


def test_an_agent_cannot_move_its_memory_to_a_sibling(world):
    cast, agents = world
    with (
        pytest.raises(ProgrammingError, match="row-level security"),
        tenancy.tenant(cast.alice.id, agent_id=agents.research.id),
        connection.cursor() as cursor,
    ):
        cursor.execute(
            "UPDATE memories SET agent_id = %s WHERE content = 'research own'",
            [agents.writer.id],
        )


def test_the_services_keep_agents_apart(cast, agents):
    research = services.remember(
        user_id=cast.alice.id,
        tier=Tier.PRO,
        content="The launch is on Friday.",
        agent_id=agents.research.id,
    )
    # The same words from another agent are that agent's own memory, not a dedup.
    writer = services.remember(
        user_id=cast.alice.id,
        tier=Tier.PRO,
        content="The launch is on Friday.",
        agent_id=agents.writer.id,
    )
    assert research["deduped"] is False and writer["deduped"] is False
    assert research["id"] != writer["id"]

    found = services.recall(
        user_id=cast.alice.id, agent_id=agents.research.id, query="When is the launch?"
    )
    assert [m["id"] for m in found] == [research["id"]]
    with pytest.raises(NotFound):
        services.forget_by_id(user_id=cast.alice.id, agent_id=agents.research.id, id=writer["id"])
    with pytest.raises(NotFound):
        services.update_memory(
            user_id=cast.alice.id, agent_id=agents.research.id, id=writer["id"], metadata={}
        )
    # The user-wide view sees both.
    everything = services.recall(user_id=cast.alice.id, query="When is the launch?")
    assert {m["id"] for m in everything} == {research["id"], writer["id"]}


def test_a_forget_preview_is_confirmable_only_by_its_agent(cast, agents):
    services.remember(
        user_id=cast.alice.id,
        tier=Tier.PRO,
        content="Temporary note about lunch.",
        agent_id=agents.research.id,
    )
    preview = services.forget_preview(
        user_id=cast.alice.id, agent_id=agents.research.id, query="lunch", threshold=0
    )
    token = preview["confirmation_token"]
    assert token
    from core.errors import ConfirmationInvalid

    with pytest.raises(ConfirmationInvalid):
        services.forget_confirm(
            user_id=cast.alice.id, agent_id=agents.writer.id, confirmation_token=token
        )
    done = services.forget_confirm(
        user_id=cast.alice.id, agent_id=agents.research.id, confirmation_token=token
    )
    assert done["deleted_count"] == 1


def test_an_agents_forget_all_token_is_not_confirmed_user_wide(cast, agents):
    # The user-wide path sees the agent's token; confirming it there deleted
    # the user's own memory too, which the agent's preview had not counted.
    store_memory(cast.alice, "alice user-wide", namespace="shared")
    store_memory(cast.alice, "research own", namespace="shared", agent=agents.research)
    preview = services.forget(
        user_id=cast.alice.id, agent_id=agents.research.id, mode="all", namespace="shared"
    )
    assert preview["total_matches"] == 1
    from core.errors import ConfirmationInvalid

    with pytest.raises(ConfirmationInvalid):
        services.forget(
            user_id=cast.alice.id, mode="all", confirmation_token=preview["confirmation_token"]
        )
    done = services.forget(
        user_id=cast.alice.id,
        agent_id=agents.research.id,
        mode="all",
        confirmation_token=preview["confirmation_token"],
    )
    assert done["deleted_count"] == 1
    with tenancy.tenant(cast.alice.id):
        assert list(Memory.objects.values_list("content", flat=True)) == ["alice user-wide"]


def test_the_free_quota_counts_every_agents_memories(cast, agents, settings):
    settings.FREE_TIER_MAX_MEMORIES = 3
    fill_memories(cast.alice.id, 2)  # user-wide
    store_memory(cast.alice, "one of writer's", agent=agents.writer)
    with pytest.raises(QuotaExceeded):
        services.remember(
            user_id=cast.alice.id,
            tier=Tier.FREE,
            content="over the line",
            agent_id=agents.research.id,
        )


def test_deleting_an_agent_takes_its_memories_and_keys_and_keeps_its_usage(cast, agents):
    store_memory(cast.alice, "research own", agent=agents.research)
    store_memory(cast.alice, "alice user-wide")
    with tenancy.operator():
        key, _ = ApiKey.objects.issue(user=cast.alice, name="scoped", agent=agents.research)
        UsageEvent.objects.create(
            user=cast.alice,
            agent=agents.research,
            api_key=key,  # a used key: its event names it
            request_id="r",
            tool_name="recall",
            success=True,
        )
    from accounts import services as accounts_services

    with connection.cursor() as cursor:
        # Checked at once, not at the commit this test never reaches: the key's
        # delete failed there (a 500 on the dashboard) while its event named it.
        cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")
    accounts_services.delete_agent(user_id=cast.alice.id, agent_id=agents.research.id)

    assert visible(cast.alice.id) == {"alice user-wide"}
    with tenancy.operator():
        assert not Agent.objects.filter(id=agents.research.id).exists()
        assert not ApiKey.objects.filter(id=key.id).exists()
        [event] = UsageEvent.objects.filter(user=cast.alice)
        assert (event.agent_id, event.api_key_id) == (None, None)
    # Charlie cannot delete Alice's agent.
    with pytest.raises(NotFound):
        accounts_services.delete_agent(user_id=cast.charlie.id, agent_id=agents.writer.id)


def test_agent_scoped_keys_see_and_issue_only_their_agents_keys(cast, agents):
    from accounts import services as accounts_services

    scoped, _ = accounts_services.issue_own_key(
        user_id=cast.alice.id, max_tier=Tier.FREE, name="scoped", agent_id=agents.research.id
    )
    assert scoped.agent_id == agents.research.id
    # An agent's key lists only its agent's keys, not Alice's user-wide ones.
    listed = accounts_services.list_own_keys(user_id=cast.alice.id, agent_id=agents.research.id)
    assert [k.id for k in listed] == [scoped.id]
    # And the database refuses a user-wide key from an agent's transaction.
    with (
        pytest.raises(ProgrammingError, match="row-level security"),
        tenancy.tenant(cast.alice.id, agent_id=agents.research.id),
    ):
        ApiKey.objects.create(user=cast.alice, prefix="recall_live_x", key_hash="h" * 64)


def test_usage_events_are_agent_scoped_for_agents(cast, agents):
    with tenancy.operator():
        for agent in (agents.research, agents.writer, None):
            UsageEvent.objects.create(
                user=cast.alice, agent=agent, request_id="r", tool_name="recall", success=True
            )
    with tenancy.tenant(cast.alice.id, agent_id=agents.research.id):
        assert list(UsageEvent.objects.values_list("agent_id", flat=True)) == [agents.research.id]
    with tenancy.tenant(cast.alice.id):
        assert UsageEvent.objects.count() == 3


def test_forget_confirmations_follow_the_agent(cast, agents):
    from datetime import timedelta

    from django.utils import timezone

    with tenancy.tenant(cast.alice.id, agent_id=agents.research.id):
        ForgetConfirmation.objects.create(
            token_hash="a" * 64,
            user=cast.alice,
            agent=agents.research,
            memory_ids=[],
            expires_at=timezone.now() + timedelta(minutes=5),
        )
    with tenancy.tenant(cast.alice.id, agent_id=agents.writer.id):
        assert not ForgetConfirmation.objects.exists()
    with tenancy.tenant(cast.alice.id, agent_id=agents.research.id):
        assert ForgetConfirmation.objects.count() == 1
    assert Memory.objects.count() == 0  # and outside any context, nothing at all


def test_history_follows_the_agent_of_its_memory(world):
    cast, agents = world
    with tenancy.tenant(cast.alice.id, agent_id=agents.research.id), connection.cursor() as cursor:
        # No WHERE: only the policies decide. Task sharing lends memories, not their history.
        cursor.execute("SELECT content FROM memory_history")
        assert {row[0] for row in cursor.fetchall()} == {
            "research own",
            "research on task T",
            "research on task U",
        }
    with tenancy.tenant(cast.alice.id), connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM memory_history")
        assert cursor.fetchone()[0] == len(ALICE_ALL)
    with tenancy.tenant(cast.charlie.id, agent_id=agents.writer.id), connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM memory_history")
        assert cursor.fetchone()[0] == 0


def test_an_agent_cannot_forge_or_erase_a_siblings_history(world):
    cast, agents = world
    writer_own = visible_ids(cast.alice.id, agents.writer.id)["writer own"]
    with (
        pytest.raises(ProgrammingError, match="row-level security"),
        tenancy.tenant(cast.alice.id, agent_id=agents.research.id),
        connection.cursor() as cursor,
    ):
        cursor.execute(
            "INSERT INTO memory_history (memory_id, user_id, agent_id, version, action,"
            " namespace, content, metadata, priority, client, recorded_at)"
            " VALUES (%s, %s, %s, 9, 'updated', 'default', 'forged', '{}', 'medium', 'x', now())",
            [writer_own, cast.alice.id, agents.writer.id],
        )
    # The writer deletes its memory; research's purge cannot reach that history.
    services.forget_by_id(user_id=cast.alice.id, agent_id=agents.writer.id, id=str(writer_own))
    with tenancy.tenant(cast.alice.id, agent_id=agents.research.id), connection.cursor() as cursor:
        cursor.execute("SELECT recall_purge_history(%s::uuid[])", [[writer_own]])
        assert cursor.fetchone()[0] == 0
    versions = services.memory_history(user_id=cast.alice.id, id=str(writer_own))
    assert [v["action"] for v in versions] == ["created", "deleted"]
    with pytest.raises(NotFound):
        services.memory_history(
            user_id=cast.alice.id, agent_id=agents.research.id, id=str(writer_own)
        )


def test_jobs_follow_the_agent_that_queued_them(cast, agents):
    queued = services.remember(
        user_id=cast.alice.id,
        agent_id=agents.research.id,
        tier=Tier.PRO,
        content="Queued by research.",
        background=True,
        idempotency_key="same-key",
    )
    # A sibling may choose the same key: it gets its own job, not research's.
    sibling = services.remember(
        user_id=cast.alice.id,
        agent_id=agents.writer.id,
        tier=Tier.PRO,
        content="Queued by writer.",
        background=True,
        idempotency_key="same-key",
    )
    assert sibling["job_id"] != queued["job_id"]
    with pytest.raises(NotFound):
        services.job_status(
            user_id=cast.alice.id, agent_id=agents.writer.id, job_id=queued["job_id"]
        )
    with tenancy.tenant(cast.alice.id, agent_id=agents.writer.id), connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM memory_jobs")
        assert cursor.fetchone()[0] == 1
    # The user-wide view sees both; the worker stores each as its agent.
    assert services.job_status(user_id=cast.alice.id, job_id=queued["job_id"])["status"] == "queued"
    while services.run_next_job():
        pass
    done = services.job_status(
        user_id=cast.alice.id, agent_id=agents.research.id, job_id=queued["job_id"]
    )
    assert done["status"] == "done"
    assert visible(cast.alice.id, agents.research.id) == {"Queued by research."}
    assert visible(cast.alice.id, agents.writer.id) == {"Queued by writer."}


def visible_ids(user_id, agent_id=None) -> dict[str, uuid.UUID]:
    with tenancy.tenant(user_id, agent_id=agent_id), connection.cursor() as cursor:
        cursor.execute("SELECT content, id FROM memories")
        return dict(cursor.fetchall())


def test_deleting_an_agent_keeps_its_memories_history_for_the_user(cast, agents):
    memory = store_memory(cast.alice, "research own", agent=agents.research)
    from accounts import services as accounts_services

    accounts_services.delete_agent(user_id=cast.alice.id, agent_id=agents.research.id)
    # The foreign key's cascade deleted the memory: its history says so, user-wide.
    versions = services.memory_history(user_id=cast.alice.id, id=str(memory.id))
    assert [(v["action"], v["content"]) for v in versions] == [
        ("created", "research own"),
        ("deleted", "research own"),
    ]
