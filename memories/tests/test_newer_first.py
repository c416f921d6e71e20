"""Newer first (memories/ordering.py): a restatement the write missed ranks above the older one.

On the real database with the real local model: the pairs are from the
knowledge-update set's dev part, where detection on write kept both.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest

from accounts.tiers import Tier
from memories import ordering, services
from memories.models import Memory, SourceKind
from memories.search import Found

OLDER = "The team style guide uses tabs for indentation."
NEWER = "We adopted four-space indentation across the codebase."
QUESTION = "What indentation does the team use?"


def remember(user_id, content: str) -> str:
    stored = services.remember(user_id=user_id, tier=Tier.PRO, content=content)
    assert "replaces" not in stored  # detection on write kept both
    return str(stored["id"])


def ids(found) -> list[str]:
    return [m["id"] for m in found]


def test_a_newer_restatement_ranks_above_the_older_one(cast) -> None:
    older = remember(cast.alice.id, OLDER)
    newer = remember(cast.alice.id, NEWER)

    found = services.recall(user_id=cast.alice.id, query=QUESTION, threshold=0.0)

    assert ids(found)[:2] == [newer, older]
    # Reordered, not re-scored or hidden: the older still matches the query better.
    assert found[1]["score"] > found[0]["score"]
    assert "superseded_by" not in found[1]


def test_every_search_path_puts_the_newer_first(cast) -> None:
    older = remember(cast.alice.id, OLDER)
    newer = remember(cast.alice.id, NEWER)

    searched, _ = services.search_memories(
        user_id=cast.alice.id, query=QUESTION, threshold=0.0, mode="semantic"
    )
    preview = services.forget_preview(user_id=cast.alice.id, query=QUESTION, threshold=0.0)

    assert ids(searched)[:2] == [newer, older]
    assert [m["id"] for m in preview["matches"]][:2] == [newer, older]


def test_the_older_one_stays_first_with_newer_first_off(cast, settings) -> None:
    older = remember(cast.alice.id, OLDER)
    newer = remember(cast.alice.id, NEWER)
    settings.RECALL_NEWER_FIRST = False

    found = services.recall(user_id=cast.alice.id, query=QUESTION, threshold=0.0)

    assert ids(found)[:2] == [older, newer]


def test_the_older_one_stays_first_with_supersession_off(cast, settings) -> None:
    older = remember(cast.alice.id, OLDER)
    newer = remember(cast.alice.id, NEWER)
    settings.RECALL_SUPERSESSION = "off"

    found = services.recall(user_id=cast.alice.id, query=QUESTION, threshold=0.0)

    assert ids(found)[:2] == [older, newer]


@pytest.mark.parametrize(
    ("first", "second", "question"),
    [
        # Close vectors, a changed number, and still two facts: the detector's
        # evidence stays below even.
        (
            "I run 5 km on weekday mornings.",
            "On Saturdays I do a long 15 km run.",
            "How far do I run on weekday mornings?",
        ),
        (
            "Maya's sister lives in Lisbon.",
            "Maya's brother lives in Porto.",
            "Where does Maya's sister live?",
        ),
        (
            "The design team has 4 people.",
            "Platform team is 9 people after the hires.",
            "How many people are on the design team?",
        ),
    ],
)
def test_look_alikes_keep_their_own_order(cast, first, second, question) -> None:
    a = remember(cast.alice.id, first)
    b = remember(cast.alice.id, second)

    found = services.recall(user_id=cast.alice.id, query=question, threshold=0.0)

    assert ids(found)[:2] == [a, b]


EMPLOYER = "Cormac works at Brackenfield."
NEW_EMPLOYER = "Cormac is a staff engineer at Marlowe Robotics."
WHO = "Which company employs Cormac?"


def test_an_older_memory_a_newer_one_restates_is_marked_on_every_path(cast) -> None:
    older = remember(cast.alice.id, EMPLOYER)
    newer = remember(cast.alice.id, NEW_EMPLOYER)

    found = services.recall(user_id=cast.alice.id, query=WHO, threshold=0.0)
    again, source = services.search_memories(user_id=cast.alice.id, query=WHO, threshold=0.0)
    preview = services.forget_preview(user_id=cast.alice.id, query=WHO, threshold=0.0)

    assert [(m["id"], m.get("may_be_replaced_by")) for m in found][:2] == [
        (newer, None),
        (older, newer),
    ]
    assert source == "cache" and again == found  # the result cache keeps the mark
    assert preview["matches"][1] == {**preview["matches"][1], "may_be_replaced_by": newer}
    # Marked, not linked: the history and the lists know nothing of it.
    assert services.list_memories(user_id=cast.alice.id)[0]["superseded_by"] is None


def test_conversation_turns_are_neither_moved_nor_marked(cast) -> None:
    # The same two statements as the test above, said in conversations: a
    # later turn does not replace an earlier one, and recall keeps its ranking.
    for said in (EMPLOYER, NEW_EMPLOYER):
        services.remember(
            user_id=cast.alice.id, tier=Tier.PRO, messages=[{"role": "user", "content": said}]
        )

    found = services.recall(user_id=cast.alice.id, query=WHO, threshold=0.0)

    assert len(found) == 2
    assert not any("may_be_replaced_by" in m for m in found)
    assert found[0]["score"] >= found[1]["score"]


def test_as_of_shows_no_mark(cast) -> None:
    older = remember(cast.alice.id, EMPLOYER)
    remember(cast.alice.id, NEW_EMPLOYER)
    now = datetime.now(UTC).isoformat()

    found = services.recall(user_id=cast.alice.id, query=WHO, threshold=0.0, as_of=now)

    assert older in ids(found)
    assert not any("may_be_replaced_by" in m for m in found)


def test_a_restatement_answering_much_worse_is_moved_but_not_marked(cast) -> None:
    older = remember(cast.alice.id, OLDER)
    newer = remember(cast.alice.id, NEWER)

    found = services.recall(user_id=cast.alice.id, query=QUESTION, threshold=0.0)

    assert ids(found)[:2] == [newer, older]
    assert not any("may_be_replaced_by" in m for m in found)


# The reordering itself, on search results as search() holds them.


def hit(
    content: str,
    minutes: int,
    similarity: float,
    *,
    kind: SourceKind = SourceKind.NOTE,
    agent_id: uuid.UUID | None = None,
) -> Found:
    at = datetime(2026, 12, 3, 8, tzinfo=UTC) + timedelta(minutes=minutes)
    memory = Memory(
        id=uuid.uuid4(), content=content, created_at=at, source_kind=kind, agent_id=agent_id
    )
    return Found(memory, similarity, similarity, similarity)


def _id(found: Found) -> str:
    return str(found.memory.id)


def close(pairs):
    return {pair: 0.8 for pair in pairs}


def order(found, cosines):
    return ordering.newer_first(found, cosines).found


def marks(found, cosines):
    return ordering.newer_first(found, cosines).restated


def test_nothing_enters_or_leaves_the_top_results() -> None:
    others = [
        hit(f"Unrelated note number {n} about gardening.", n, 0.9 - n / 100) for n in range(5)
    ]
    older = hit(OLDER, 10, 0.5)  # sixth: below the top five
    newer = hit(NEWER, 20, 0.4)
    found = [*others, older, newer]

    assert order(found, close) == found


def test_a_chain_settles_newest_first_within_the_top() -> None:
    first = hit("The team standup is at 9:30.", 0, 0.9)
    second = hit("The team standup moved to 10:00.", 5, 0.8)
    third = hit("The team standup is at 10:30 now.", 9, 0.7)
    rest = [hit(f"Unrelated note number {n} about gardening.", n, 0.5) for n in range(4)]

    reordered = order([first, second, third, *rest], close)

    assert reordered[:3] == [third, second, first]
    assert reordered[3:5] == rest[:2]
    assert reordered[5:] == rest[2:]


def test_a_distant_pair_is_left_as_it_is() -> None:
    older, newer = hit(OLDER, 0, 0.9), hit(NEWER, 5, 0.8)

    assert order([older, newer], lambda pairs: dict.fromkeys(pairs, 0.4)) == [
        older,
        newer,
    ]


def test_a_newer_memory_that_answers_the_query_much_worse_stays_below() -> None:
    older, newer = hit(OLDER, 0, 0.9), hit(NEWER, 5, 0.6)

    assert order([older, newer], close) == [older, newer]
    # Within the lag it moves.
    nearer = hit(NEWER, 5, 0.75)
    assert order([older, nearer], close) == [nearer, older]


def test_an_older_memory_never_moves_above_a_newer_one() -> None:
    newer, older = hit(NEWER, 5, 0.9), hit(OLDER, 0, 0.8)

    assert order([newer, older], close) == [newer, older]
    # Already in order, the older is still marked.
    assert marks([newer, older], close) == {str(older.memory.id): str(newer.memory.id)}


def test_the_older_is_marked_only_when_the_newer_answers_nearly_as_well() -> None:
    older = hit(OLDER, 0, 0.9)
    near = hit(NEWER, 5, 0.9 - ordering.MARK_LAG)
    far = hit(NEWER, 5, 0.85 - ordering.MARK_LAG)

    assert ordering.newer_first([older, near], close) == ([near, older], {_id(older): _id(near)})
    # Still moved within LAG, but not marked.
    assert ordering.newer_first([older, far], close) == ([far, older], {})


def test_a_chain_marks_each_older_with_the_newest() -> None:
    first = hit("The team standup is at 9:30.", 0, 0.9)
    second = hit("The team standup moved to 10:00.", 5, 0.88)
    third = hit("The team standup is at 10:30 now.", 9, 0.86)

    marks = ordering.newer_first([first, second, third], close).restated

    assert marks == {_id(first): _id(third), _id(second): _id(third)}


def test_only_an_answer_to_the_query_is_marked() -> None:
    # Close to each other, far below the best result: not what was asked about.
    best = hit("Unrelated note about gardening.", 30, 0.9)
    older = hit(OLDER, 0, 0.9 - ordering.LAG - 0.01)
    newer = hit(NEWER, 5, older.similarity)

    assert ordering.newer_first([best, older, newer], close).restated == {}


@pytest.mark.parametrize(
    ("older_kind", "newer_kind"),
    [
        (SourceKind.CONVERSATION, SourceKind.CONVERSATION),
        (SourceKind.DOCUMENT, SourceKind.DOCUMENT),
        (SourceKind.NOTE, SourceKind.CONVERSATION),
    ],
)
def test_turns_and_chunks_are_neither_moved_nor_marked(older_kind, newer_kind) -> None:
    # Detection on write compares notes only: a conversation does not replace
    # what was said earlier in it, nor a document its other chunks.
    older = hit(OLDER, 0, 0.9, kind=older_kind)
    newer = hit(NEWER, 5, 0.88, kind=newer_kind)

    assert ordering.newer_first([older, newer], close) == ([older, newer], {})


def test_another_writers_memory_neither_moves_nor_marks() -> None:
    agent = uuid.uuid4()
    user_wide = hit(OLDER, 0, 0.9)
    agents = hit(NEWER, 5, 0.88, agent_id=agent)

    assert ordering.newer_first([user_wide, agents], close) == ([user_wide, agents], {})
    # One agent's own pair still does.
    own = hit(OLDER, 0, 0.9, agent_id=agent)
    assert ordering.newer_first([own, agents], close) == ([agents, own], {_id(own): _id(agents)})


def test_a_note_of_another_task_neither_moves_nor_marks() -> None:
    shared, own = hit(OLDER, 0, 0.9), hit(NEWER, 5, 0.88)
    shared.memory.task_id = "launch"

    assert ordering.newer_first([shared, own], close) == ([shared, own], {})
    own.memory.task_id = "launch"
    assert ordering.newer_first([shared, own], close) == ([own, shared], {_id(shared): _id(own)})


def test_a_note_of_another_author_neither_moves_nor_marks() -> None:
    # Seed 003's author: notes a client attributes to two people are two sources.
    danas, eriks = hit(OLDER, 0, 0.9), hit(NEWER, 5, 0.88)
    danas.memory.author, eriks.memory.author = "dana", "erik"

    assert ordering.newer_first([danas, eriks], close) == ([danas, eriks], {})
    eriks.memory.author = "dana"
    assert ordering.newer_first([danas, eriks], close) == ([eriks, danas], {_id(danas): _id(eriks)})


def test_a_replaced_newer_memory_neither_moves_nor_marks() -> None:
    older, newer = hit(OLDER, 0, 0.9), hit(NEWER, 5, 0.9)
    newer.memory.superseded_by = older.memory.id  # a fact that changed back

    assert ordering.newer_first([older, newer], close) == ([older, newer], {})


def test_a_replaced_memory_keeps_its_own_mark_only() -> None:
    older, newer = hit(OLDER, 0, 0.9), hit(NEWER, 5, 0.9)
    older.memory.superseded_by = uuid.uuid4()

    assert ordering.newer_first([older, newer], close).restated == {}


def test_no_statement_when_no_pair_passes_the_text_rules() -> None:
    older = hit("Maya's sister lives in Lisbon.", 0, 0.9)
    newer = hit("Maya's brother lives in Porto.", 5, 0.85)
    asked: list = []

    def cosines(pairs):
        asked.extend(pairs)
        return close(pairs)

    assert ordering.newer_first([older, newer], cosines) == ([older, newer], {})
    assert asked == []


def test_an_abbreviated_environment_is_a_look_alike() -> None:
    older = hit("The dev cluster's ingress IP is 10.20.0.5.", 0, 0.9)
    newer = hit("The QA cluster's ingress answers on 10.30.0.5.", 5, 0.85)

    assert order([older, newer], close) == [older, newer]


def test_the_slot_in_other_words_moves_when_the_newer_shows_a_new_value() -> None:
    # No subject word in common, but an address swapped: perhaps the same
    # printer under another name. Reordered at the pair's cosine floor.
    older = hit("The printer on floor two is at 192.168.3.9.", 0, 0.9)
    newer = hit("Office HP LaserJet: 192.168.3.44.", 5, 0.85)

    assert order([older, newer], close) == [newer, older]

    def below(pairs):
        return dict.fromkeys(pairs, ordering.PAIR - 0.01)

    assert order([older, newer], below) == [older, newer]


def test_other_words_without_a_new_value_keep_their_order() -> None:
    older = hit("The kids' dentist appointment is on Tuesday.", 0, 0.9)
    newer = hit("Orthodontist visits for the children are covered by insurance.", 5, 0.85)

    assert order([older, newer], close) == [older, newer]
