"""Usage events whose agent or API key went while they waited: kept, without the reference.

A call still running (or its event still queued) when the user deletes the
agent it acts as ends with an event naming a row that is gone. The usage is
billed all the same, and the other events written with it must not suffer.
"""

from __future__ import annotations

import uuid

import pytest

from accounts import services as accounts_services
from accounts.models import ApiKey
from billing import services, usage
from billing.models import UsageEvent
from conftest import Agents, Cast, issue_key
from core import tenancy

pytestmark = pytest.mark.django_db(transaction=True)


def event(
    user_id: uuid.UUID, *, key_id: uuid.UUID | None = None, agent_id: uuid.UUID | None = None
) -> usage.Event:
    return usage.Event(
        user_id=user_id,
        api_key_id=key_id,
        agent_id=agent_id,
        request_id=uuid.uuid4().hex,
        tool_name="remember",
        success=True,
        latency_ms=5,
    )


def stored(user_id: uuid.UUID) -> dict[str, tuple[uuid.UUID | None, uuid.UUID | None]]:
    with tenancy.operator():
        rows = UsageEvent.objects.filter(user_id=user_id).values_list(
            "request_id", "agent_id", "api_key_id"
        )
        return {request_id: (agent_id, key_id) for request_id, agent_id, key_id in rows}


def test_an_event_of_a_just_deleted_agent_is_kept_with_the_rest_of_the_batch(
    cast: Cast, agents: Agents
) -> None:
    recorder = usage.UsageRecorder()
    accounts_services.delete_agent(user_id=cast.alice.id, agent_id=agents.research.id)
    orphan = event(cast.alice.id, agent_id=agents.research.id)
    user_wide = event(cast.alice.id, key_id=cast.alice_key.key.id)
    writer = event(cast.alice.id, agent_id=agents.writer.id)
    for each in (orphan, user_wide, writer):
        recorder.record(each)
    recorder.stop()

    assert recorder.dropped == 0
    assert stored(cast.alice.id) == {
        orphan.request_id: (None, None),
        user_wide.request_id: (None, cast.alice_key.key.id),
        writer.request_id: (agents.writer.id, None),
    }


def test_an_event_of_a_deleted_agents_scoped_key_keeps_neither(cast: Cast, agents: Agents) -> None:
    # Deleting an agent deletes its keys too: the event names two rows that are gone.
    with tenancy.operator():
        scoped, _ = ApiKey.objects.issue(user=cast.alice, name="research", agent=agents.research)
    accounts_services.delete_agent(user_id=cast.alice.id, agent_id=agents.research.id)
    orphan = event(cast.alice.id, key_id=scoped.id, agent_id=agents.research.id)
    bob = event(cast.alice.id, key_id=cast.bob_key.key.id)

    services.save_usage_events(user_id=cast.alice.id, events=[orphan, bob])

    assert stored(cast.alice.id) == {
        orphan.request_id: (None, None),
        bob.request_id: (None, cast.bob_key.key.id),
    }


def test_an_event_of_a_deleted_key_is_kept_without_it(cast: Cast) -> None:
    gone = issue_key(cast.alice, "soon gone")
    with tenancy.operator():
        ApiKey.objects.filter(id=gone.key.id).delete()
    orphan = event(cast.alice.id, key_id=gone.key.id)
    kept = event(cast.alice.id, key_id=cast.alice_key.key.id)

    services.save_usage_events(user_id=cast.alice.id, events=[orphan, kept])

    assert stored(cast.alice.id) == {
        orphan.request_id: (None, None),
        kept.request_id: (None, cast.alice_key.key.id),
    }


def test_a_batch_written_again_after_a_deleted_agent_stores_each_event_once(
    cast: Cast, agents: Agents
) -> None:
    first = event(cast.alice.id, agent_id=agents.writer.id)
    services.save_usage_events(user_id=cast.alice.id, events=[first])
    accounts_services.delete_agent(user_id=cast.alice.id, agent_id=agents.research.id)
    orphan = event(cast.alice.id, agent_id=agents.research.id)

    # The recorder's retry after an unanswered COMMIT: ``first`` again, with a new one.
    services.save_usage_events(user_id=cast.alice.id, events=[first, orphan])
    services.save_usage_events(user_id=cast.alice.id, events=[first, orphan])

    assert stored(cast.alice.id) == {
        first.request_id: (agents.writer.id, None),
        orphan.request_id: (None, None),
    }


def test_events_of_a_deleted_user_are_still_refused(cast: Cast) -> None:
    # Nothing to null there: the failure is the user's, and it is not swallowed.
    recorder = usage.UsageRecorder()
    recorder.record(event(uuid.uuid4()))
    recorder.record(event(cast.charlie.id, key_id=cast.charlie_key.key.id))
    recorder.stop()

    assert recorder.dropped == 1
    assert len(stored(cast.charlie.id)) == 1
