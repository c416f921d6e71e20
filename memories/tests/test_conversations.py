"""remember(messages=...): a conversation, one memory per message, all or nothing."""

from __future__ import annotations

import pytest

from accounts.tiers import Tier
from core import tenancy
from core.errors import QuotaExceeded, ValidationFailed
from memories import services
from memories.models import Memory
from memories.services import threads
from tests.support import fill_memories

CONVERSATION = [
    {"role": "user", "content": "I'm planning a trip to Kyoto.", "name": "Sam"},
    {"role": "assistant", "content": "Lovely. When are you going?"},
    {"role": "user", "content": "In April.", "timestamp": "2026-11-30T09:15:00+01:00"},
    {"role": "assistant", "content": "Cherry blossom season, then. Book early."},
    {"role": "user", "content": "Thanks."},
    {"role": "assistant", "content": "Cherry blossom season, then. Book early."},  # said twice
]


def remember(user_id, messages, tier=Tier.PRO, **kwargs):
    return services.remember(user_id=user_id, tier=tier, messages=messages, **kwargs)


def count_rows() -> int:
    with tenancy.operator():
        return Memory.objects.count()


def test_each_message_is_a_memory_in_one_thread(cast):
    stored = remember(cast.alice.id, CONVERSATION)

    assert stored["count"] == len(CONVERSATION)
    assert stored["thread_id"]
    assert [m["deduped"] for m in stored["memories"]] == [False] * len(CONVERSATION)
    assert len({m["id"] for m in stored["memories"]}) == len(CONVERSATION)


def test_the_thread_read_back_in_order_is_the_conversation(cast):
    thread = remember(cast.alice.id, CONVERSATION, thread_id="kyoto-trip")["thread_id"]
    services.remember(user_id=cast.alice.id, tier=Tier.PRO, content="An unrelated note.")

    read = services.list_memories(user_id=cast.alice.id, thread_id=thread, limit=100)

    assert thread == "kyoto-trip"
    assert [(m["metadata"]["role"], m["content"]) for m in read] == [
        (m["role"], m["content"]) for m in CONVERSATION
    ]
    assert [m["position"] for m in read] == list(range(len(CONVERSATION)))
    assert read[0]["metadata"]["name"] == "Sam"
    assert read[2]["metadata"]["timestamp"] == "2026-11-30T08:15:00.000Z"


def test_the_calls_metadata_goes_on_every_message(cast):
    thread = remember(cast.alice.id, CONVERSATION[:2], metadata={"channel": "chat"})["thread_id"]

    read = services.list_memories(user_id=cast.alice.id, thread_id=thread)

    assert [m["metadata"]["channel"] for m in read] == ["chat", "chat"]


def test_sending_the_same_conversation_again_stores_nothing_new(cast):
    first = remember(cast.alice.id, CONVERSATION, thread_id="t1")

    again = remember(cast.alice.id, CONVERSATION, thread_id="t1")

    assert [m["id"] for m in again["memories"]] == [m["id"] for m in first["memories"]]
    assert all(m["deduped"] for m in again["memories"])
    assert count_rows() == len(CONVERSATION)


def turns(user_id, thread_id) -> list[tuple[int | None, str]]:
    read = services.list_memories(user_id=user_id, thread_id=thread_id, limit=100)
    return [(m["position"], m["content"]) for m in read]


def said(*lines: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": line} for line in lines]


def test_a_thread_sent_a_turn_at_a_time_keeps_every_turn_in_order(cast):
    # Each call numbered its messages from 0: a new "ok" was taken for the
    # first one and dropped, and later turns went in at the thread's start.
    first = remember(cast.alice.id, said("ok", "Shall I deploy to staging?"), thread_id="c42")
    second = remember(cast.alice.id, said("ok"), thread_id="c42")
    third = remember(cast.alice.id, said("Deployed."), thread_id="c42")

    assert not second["memories"][0]["deduped"]
    assert second["memories"][0]["id"] != first["memories"][0]["id"]
    assert turns(cast.alice.id, "c42") == [
        (0, "ok"),
        (1, "Shall I deploy to staging?"),
        (2, "ok"),
        (3, "Deployed."),
    ]
    read = services.list_memories(user_id=cast.alice.id, thread_id="c42", limit=100)
    assert [m["metadata"]["position"] for m in read] == [0, 1, 2, 3]
    # The last call again (a retry) is found where it went.
    retry = remember(cast.alice.id, said("Deployed."), thread_id="c42")
    assert retry["memories"][0]["id"] == third["memories"][0]["id"]
    assert retry["memories"][0]["deduped"]
    # The thread sent whole, with one turn more, stores only that turn.
    whole = remember(
        cast.alice.id,
        said("ok", "Shall I deploy to staging?", "ok", "Deployed.", "Thanks."),
        thread_id="c42",
    )
    assert [m["deduped"] for m in whole["memories"]] == [True, True, True, True, False]
    assert turns(cast.alice.id, "c42")[-1] == (4, "Thanks.")
    assert count_rows() == 5


def test_listed_newest_first_a_conversation_runs_from_its_last_turn(cast):
    # Its turns share one moment: they came out in the order of their ids.
    remember(cast.alice.id, CONVERSATION, thread_id="kyoto")

    listed = services.list_memories(user_id=cast.alice.id, limit=100)

    assert [m["position"] for m in listed] == list(reversed(range(len(CONVERSATION))))


def test_turns_sent_with_no_thread_are_each_their_own_conversation(cast):
    # seed 003's memory_add takes turns with no thread_id: they were taken for
    # one thread, and the same conversation sent again was stored twice.
    def add(*lines: str) -> list:
        return services.add_turns(
            user_id=cast.alice.id, tier=Tier.PRO, agent_id=None, turns=said(*lines)
        )

    first = add("Hello A.", "Bye A.")
    add("Hello B.", "Bye B.")
    again = add("Hello A.", "Bye A.")

    assert [m["id"] for m in again] == [m["id"] for m in first]
    assert count_rows() == 4


def test_a_thread_sent_whole_with_a_turn_edited_stores_only_what_changed(cast):
    remember(cast.alice.id, said("a1", "b1", "c1"), thread_id="t")

    again = remember(cast.alice.id, said("a1", "b1 (edited)", "c1", "d1"), thread_id="t")

    assert [m["deduped"] for m in again["memories"]] == [True, False, True, False]
    assert count_rows() == 5


def test_a_queued_turn_goes_after_the_thread_it_continues(cast):
    remember(cast.alice.id, said("ok", "Shall I deploy to staging?"), thread_id="c7")
    queued = remember(cast.alice.id, said("ok"), thread_id="c7", background=True)
    services.run_next_job()

    assert turns(cast.alice.id, "c7") == [(0, "ok"), (1, "Shall I deploy to staging?"), (2, "ok")]
    read = services.list_memories(user_id=cast.alice.id, thread_id="c7", limit=100)
    assert read[2]["id"] == queued["memory_ids"][0]


def test_a_turn_queued_behind_another_is_announced_with_the_id_it_gets(cast):
    # At enqueue, "ok" looked like a retry of the thread's last turn and was
    # announced with that turn's id; it goes after "c", queued before it.
    remember(cast.alice.id, said("a", "ok"), thread_id="t")
    remember(cast.alice.id, said("c"), thread_id="t", background=True)
    queued = remember(cast.alice.id, said("ok"), thread_id="t", background=True)
    while services.run_next_job():
        pass

    assert turns(cast.alice.id, "t") == [(0, "a"), (1, "ok"), (2, "c"), (3, "ok")]
    read = services.list_memories(user_id=cast.alice.id, thread_id="t", limit=100)
    assert queued["memory_ids"] == [read[3]["id"]]


@pytest.mark.parametrize(
    ("stored", "sent", "first"),
    [
        ([], ["a"], 0),
        ([(0, "a"), (1, "b")], ["a", "b"], 0),  # the thread again
        ([(0, "a"), (1, "b")], ["a", "b", "c"], 0),  # the thread so far, and more
        ([(0, "a"), (1, "b")], ["b"], 1),  # the last call again
        ([(0, "a"), (1, "b")], ["a"], 2),  # a new turn with an old turn's words
        ([(0, "a"), (1, "b")], ["c", "d"], 2),
        ([(0, "a"), (2, "c")], ["a", "b", "c"], 0),  # whole, with a turn forgotten since
        ([(0, "a"), (2, "b")], ["a", "b"], 3),  # the last two, but not next to each other
        ([(0, "a"), (1, "b"), (2, "c")], ["a", "B", "c", "d"], 0),  # whole, a turn edited
        ([(0, "a"), (1, "b")], ["a", "B", "c"], 0),  # whole, its second turn edited
        ([(0, "a"), (1, "b"), (2, "c")], ["a", "x", "y", "z"], 3),  # new, opening as it did
    ],
)
def test_where_a_calls_turns_go_in_a_thread(stored, sent, first):
    assert threads.first_place(stored, sent) == first


def test_the_same_words_in_another_thread_are_another_memory(cast):
    remember(cast.alice.id, CONVERSATION[:1], thread_id="t1")
    other = remember(cast.alice.id, CONVERSATION[:1], thread_id="t2")

    assert other["memories"][0]["deduped"] is False
    assert count_rows() == 2


def test_messages_are_found_by_recall_with_their_role(cast):
    remember(cast.alice.id, CONVERSATION)

    found = services.recall(user_id=cast.alice.id, query="a trip to Kyoto", threshold=0)

    kyoto = next(m for m in found if "Kyoto" in m["content"])
    assert kyoto["metadata"] == {"role": "user", "position": 0, "name": "Sam"}


@pytest.mark.parametrize(
    ("messages", "fragment"),
    [
        ([], "non-empty list"),
        ("hello", "non-empty list"),
        ([{"role": "user", "content": "ok"}] * 101, "At most 100 messages"),
        ([*CONVERSATION[:2], {"role": "user", "content": ""}], r"messages\[2\].content"),
        ([*CONVERSATION[:2], {"content": "no role"}], r"messages\[2\] needs a role"),
        ([{"role": "user", "content": "x" * 50_001}], "maximum is 50,000"),
        ([{"role": "user", "content": "hi", "mood": "glad"}], "unknown fields: mood"),
        ([{"role": "user", "content": "hi", "timestamp": "yesterday"}], "ISO 8601"),
        (["not an object"], "must be an object"),
    ],
)
def test_one_bad_message_stores_none_of_them(cast, messages, fragment):
    with pytest.raises(ValidationFailed, match=fragment):
        remember(cast.alice.id, messages)

    assert count_rows() == 0


def test_content_and_messages_together_are_refused(cast):
    with pytest.raises(ValidationFailed, match="not both"):
        services.remember(user_id=cast.alice.id, tier=Tier.PRO, content="x", messages=CONVERSATION)


def test_neither_content_nor_messages_is_refused_as_missing(cast):
    with pytest.raises(ValidationFailed) as refused:
        services.remember(user_id=cast.alice.id, tier=Tier.PRO)

    assert refused.value.message == "Pass content (one memory) or messages (a conversation)."


def test_a_conversation_that_would_pass_the_quota_stores_nothing(cast, settings):
    settings.FREE_TIER_MAX_MEMORIES = 10
    fill_memories(cast.alice.id, 6)

    with pytest.raises(QuotaExceeded) as refused:
        remember(cast.alice.id, CONVERSATION, tier=Tier.FREE)

    assert count_rows() == 6
    # Far from the limit by its own count: the message says what the call would make.
    assert refused.value.message.startswith(
        "The free tier holds at most 10 memories. You hold 6 (queued adds included), and"
        f" this call would add {len(CONVERSATION)}."
    )


def test_a_queued_conversation_is_stored_by_a_worker(cast):
    queued = remember(cast.alice.id, CONVERSATION, thread_id="later", background=True)

    assert len(queued["memory_ids"]) == len(CONVERSATION)
    services.run_next_job()

    read = services.list_memories(user_id=cast.alice.id, thread_id="later")
    assert [m["id"] for m in read] == queued["memory_ids"]
    assert [m["content"] for m in read] == [m["content"] for m in CONVERSATION]


def test_remember_and_memory_add_store_a_conversation_the_same_way(cast):
    # Seed 001's messages and seed 003's turns are one kind of thing: a
    # conversation turn in a thread, with its author and its place.
    remember(cast.alice.id, CONVERSATION[:2], thread_id="t-remember")
    services.add_turns(
        user_id=cast.alice.id,
        tier=Tier.PRO,
        agent_id=None,
        turns=CONVERSATION[:2],
        thread_id="t-add",
    )
    with tenancy.operator():
        rows = {
            thread: list(
                Memory.objects.filter(thread_id=thread)
                .order_by("position")
                .values_list("source_kind", "author", "position", "content")
            )
            for thread in ("t-remember", "t-add")
        }
    assert (
        rows["t-remember"]
        == rows["t-add"]
        == [
            ("conversation", "Sam", 0, CONVERSATION[0]["content"]),
            ("conversation", "assistant", 1, CONVERSATION[1]["content"]),
        ]
    )
    # And the same thread reads back in order through list_memories.
    read = services.list_memories(user_id=cast.alice.id, thread_id="t-add")
    assert [m["content"] for m in read] == [m["content"] for m in CONVERSATION[:2]]


@pytest.mark.parametrize("field", ["task_id", "author", "thread_id"])
@pytest.mark.parametrize("bad", ["id\x00", "id\ud800", "i" * 201])
def test_a_notes_labels_must_be_storable(cast, agents, field, bad):
    with pytest.raises(ValidationFailed):
        services.add_note(
            user_id=cast.alice.id,
            tier=Tier.FREE,
            agent_id=agents.research.id,
            content="A note.",
            **{field: bad},
        )

    with tenancy.tenant(cast.alice.id):
        assert not Memory.objects.exists()
