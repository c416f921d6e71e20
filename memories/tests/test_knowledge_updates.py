"""Knowledge updates (issue 22) on the real database: links, reads, undo, isolation, the model.

A later memory replaces an older one: the older keeps its row, leaves
searches and lists by default, comes back marked when asked, and is current
again after an undo or when what replaced it is forgotten.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.db import DatabaseError, connection
from django.utils import timezone

from accounts.tiers import Tier
from core import tenancy
from core.errors import Conflict, NotFound, ValidationFailed
from memories import services
from memories.models import Memory, MemoryHistory
from memories.services.shapes import Recalled
from memories.tests.test_supersession_llm import ChatStub

OLD = "Staging Postgres runs on pg-staging-3."
NEW = "Staging Postgres was migrated to pg-staging-7 last week."
QUESTION = "Which host does staging Postgres run on?"


def remember(user_id, content, **kwargs):
    return services.remember(user_id=user_id, tier=Tier.PRO, content=content, **kwargs)


def recalled(user_id, query=QUESTION, **kwargs) -> list[Recalled]:
    return services.recall(user_id=user_id, query=query, threshold=0.0, **kwargs)


def ids(found) -> list[str]:
    return [m["id"] for m in found]


def row(memory_id) -> Memory:
    with tenancy.operator():
        return Memory.objects.get(id=memory_id)


def history(memory_id) -> list[MemoryHistory]:
    with tenancy.operator():
        return list(MemoryHistory.objects.filter(memory_id=memory_id).order_by("version"))


def decided(version: MemoryHistory) -> dict:
    """A history row's decision (who linked or unlinked, and why); {} when none."""
    return dict(version.decision or {})


def test_a_named_replacement_hides_the_old_memory_and_marks_it_when_asked(cast) -> None:
    old = remember(cast.alice.id, "The office wifi password is tulip-42.")["id"]
    new = remember(
        cast.alice.id, "New office wifi password: orchid-77.", replaces=old, namespace="default"
    )

    assert new["replaces"] == [old]
    plain = recalled(cast.alice.id, "office wifi password")
    assert ids(plain) == [new["id"]]
    assert "superseded_by" not in plain[0]
    marked = recalled(cast.alice.id, "office wifi password", include_superseded=True)
    assert set(ids(marked)) == {old, new["id"]}
    [older] = [m for m in marked if m["id"] == old]
    assert older["superseded_by"] == new["id"]
    assert older["superseded_at"].endswith("Z")
    # The row, its history and its vector stay.
    assert row(old).content == "The office wifi password is tulip-42."


def test_both_sides_of_a_link_are_in_the_history(cast) -> None:
    old = remember(cast.alice.id, "Our dentist is Dr Okafor.")["id"]
    new = remember(cast.alice.id, "We switched dentist to Dr Lindqvist.", replaces=old)["id"]

    older = services.memory_history(user_id=cast.alice.id, id=old)
    newer = services.memory_history(user_id=cast.alice.id, id=new)

    assert [(v["version"], v["action"]) for v in older] == [(1, "created"), (2, "superseded")]
    assert older[1]["superseded_by"] == new
    assert older[1]["decision"] == {"decided_by": "explicit"}
    assert newer[0]["action"] == "created"
    assert newer[0]["replaces"] == [old]


def test_purging_one_memory_of_a_pair_withholds_the_link_reasons_that_quote_it(cast) -> None:
    older = remember(cast.alice.id, OLD)["id"]
    newer = remember(cast.alice.id, NEW)
    assert newer["replaces"] == [older]  # linked offline, with its reason
    [linked] = [v for v in history(older) if v.action == "superseded"]
    assert "pg-staging-7" in decided(linked)["reason"]

    services.forget(user_id=cast.alice.id, mode="by_id", id=newer["id"], purge=True)

    kept = history(older)
    assert [v.action for v in kept] == ["created", "superseded", "restored"]
    assert not any("pg-staging-7" in str(v.decision) for v in kept)
    assert decided(kept[1]) == {
        "decided_by": "offline",
        "reason": "withheld: a memory it named was purged",
        "score": decided(linked)["score"],
    }
    assert history(newer["id"]) == []


def test_a_wrong_replaces_writes_nothing(cast) -> None:
    theirs = remember(cast.charlie.id, "Charlie's gym is on Elm Street.")["id"]
    elsewhere = remember(cast.alice.id, "The bakery opens at 7.", namespace="errands")["id"]
    with tenancy.operator():
        before = Memory.objects.count()

    with pytest.raises(NotFound):
        remember(cast.alice.id, "The gym moved to Oak Street.", replaces=str(uuid.uuid4()))
    with pytest.raises(NotFound):  # another tenant's id is no id at all
        remember(cast.alice.id, "The gym moved to Oak Street.", replaces=theirs)
    with pytest.raises(ValidationFailed):
        remember(cast.alice.id, "The bakery opens at 8.", replaces=elsewhere)
    with pytest.raises(ValidationFailed):
        remember(cast.alice.id, "The gym moved to Oak Street.", replaces="not-an-id")
    with pytest.raises(NotFound):  # async: refused before anything is queued
        remember(cast.alice.id, "The gym moved to Oak Street.", replaces=theirs, background=True)

    with tenancy.operator():
        assert Memory.objects.count() == before
    assert row(theirs).superseded_by is None


def test_an_already_replaced_memory_is_a_conflict(cast) -> None:
    old = remember(cast.alice.id, "The team standup is at 9:30.")["id"]
    remember(cast.alice.id, "The team standup moved to 10:00.", replaces=old)

    with pytest.raises(Conflict):
        remember(cast.alice.id, "The team standup is at 10:15 now.", replaces=old)


def test_the_same_replacing_call_again_is_answered_as_the_first_not_a_conflict(cast) -> None:
    # A retry after a timeout, or a hint taken twice: it was a conflict telling the caller
    # to replace the memory this very call had stored.
    old = remember(cast.alice.id, "The team standup is at 9:30.")["id"]
    first = remember(cast.alice.id, "The team standup moved to 10:00.", replaces=old)

    again = remember(cast.alice.id, "The team standup moved to 10:00.", replaces=old)

    assert (again["id"], again["deduped"], again["replaces"]) == (first["id"], True, [old])
    assert row(old).superseded_by == uuid.UUID(first["id"])
    assert [v.action for v in history(first["id"])] == ["created"]  # nothing written again


def test_a_queued_replacing_call_again_is_no_conflict(cast) -> None:
    # The check before queuing knew nothing of the content's memory, so a retry of a
    # background replace whose link stood was a conflict, and with its idempotency
    # key it never reached the key's replay.
    old = remember(cast.alice.id, "The team standup is at 9:30.")["id"]
    call = {"content": "The team standup moved to 10:00.", "replaces": old}
    first = remember(cast.alice.id, background=True, idempotency_key="k-1", **call)
    assert services.run_next_job() is True

    replayed = remember(cast.alice.id, background=True, idempotency_key="k-1", **call)
    again = remember(cast.alice.id, background=True, **call)
    assert services.run_next_job() is True

    assert replayed["job_id"] == first["job_id"]
    assert again["memory_ids"] == first["memory_ids"]
    status = services.job_status(user_id=cast.alice.id, job_id=again["job_id"])
    assert status["status"] == "done", status
    assert row(old).superseded_by == uuid.UUID(first["memory_ids"][0])


def cast_list(value: object) -> list[dict[str, Any]]:
    assert isinstance(value, list)
    return value


@pytest.mark.parametrize("meanwhile", ["forgotten", "replaced"])
def test_a_queued_replace_whose_memory_went_meanwhile_stores_its_note_unlinked(
    cast, meanwhile
) -> None:
    # The job failed (not_found / conflict) and its memory was never stored: a
    # fact the call was acknowledged for, lost.
    old = remember(cast.alice.id, "The CI runner image is ubuntu-20.04.")["id"]
    queued = remember(
        cast.alice.id, "The CI runner image is ubuntu-22.04 now.", replaces=old, background=True
    )
    newest = None
    if meanwhile == "forgotten":
        services.forget_by_id(user_id=cast.alice.id, id=old)
    else:
        newest = remember(
            cast.alice.id, "The CI runner image moved to ubuntu-24.04.", replaces=old
        )["id"]
    assert services.run_next_job() is True

    done = services.job_status(user_id=cast.alice.id, job_id=queued["job_id"])
    assert done["status"] == "done", done
    [stored] = cast_list(done["memories"])
    assert stored["id"] == queued["memory_ids"][0]
    assert stored["not_replaced"]["id"] == old
    code = "not_found" if meanwhile == "forgotten" else "conflict"
    assert stored["not_replaced"]["code"] == code
    assert row(stored["id"]).content == "The CI runner image is ubuntu-22.04 now."
    assert row(stored["id"]).superseded_by is None
    # It replaces nothing, not even the memory that replaced its target meanwhile,
    # which detection alone would have taken for the older value.
    assert "replaces" not in stored
    if newest is not None:
        assert row(newest).superseded_by is None


def test_a_changed_fact_is_found_without_being_named(cast) -> None:
    old = remember(cast.alice.id, OLD)["id"]
    remember(cast.alice.id, "The production database runs on pg-prod-1.")
    new = remember(cast.alice.id, NEW)

    assert new["replaces"] == [old]
    assert ids(recalled(cast.alice.id))[0] == new["id"]
    assert old not in ids(recalled(cast.alice.id))
    [superseded] = [v for v in history(old) if v.action == "superseded"]
    assert decided(superseded)["decided_by"] == "offline"
    assert decided(superseded)["reason"]


@pytest.mark.parametrize(
    ("first", "second"),
    [
        ("Maya's sister lives in Lisbon.", "Maya's brother lives in Porto."),
        ("Staging Postgres runs on pg-staging-3.", "Production Postgres runs on pg-prod-9."),
        ("Sam drinks green tea in the morning.", "Sam drinks red wine at dinner."),
    ],
)
def test_look_alike_facts_stay_apart(cast, first, second) -> None:
    a = remember(cast.alice.id, first)["id"]
    b = remember(cast.alice.id, second)

    assert "replaces" not in b
    assert row(a).superseded_by is None
    assert {a, b["id"]} <= set(ids(recalled(cast.alice.id, first)))


@pytest.mark.parametrize(
    "template",
    [
        "list item number {n} about topic {m}",
        "Server web-{n} has IP address 10.0.{m}.{n}",
        "Invoice {n} total is {m}00 EUR",
        "The capital of country {n} is city {m}",
    ],
)
def test_templated_facts_about_many_things_are_all_kept_current(cast, template) -> None:
    # 25 such calls used to leave 1 memory listed: each linked over the last.
    for n in range(1, 13):
        remember(cast.alice.id, template.format(n=n, m=n % 5 + 1), namespace="fleet")

    with tenancy.tenant(cast.alice.id):
        current = Memory.objects.filter(namespace="fleet", superseded_by__isnull=True).count()
    assert current == 12


def test_detection_can_be_turned_off(cast, settings) -> None:
    settings.RECALL_SUPERSESSION = "off"
    old = remember(cast.alice.id, OLD)["id"]
    new = remember(cast.alice.id, NEW)

    assert "replaces" not in new
    assert row(old).superseded_by is None


def test_conversation_turns_are_never_replaced(cast) -> None:
    said = services.remember(
        user_id=cast.alice.id,
        tier=Tier.PRO,
        messages=[{"role": "user", "content": OLD}],
    )
    new = remember(cast.alice.id, NEW)

    assert "replaces" not in new
    assert row(said["memories"][0]["id"]).superseded_by is None


def test_an_undo_restores_the_older_memory(cast) -> None:
    old = remember(cast.alice.id, OLD)["id"]
    new = remember(cast.alice.id, NEW, replaces=old)["id"]

    undone = services.restore(user_id=cast.alice.id, id=old)

    assert undone["restored"] is True
    assert undone["was_superseded_by"] == new
    assert row(old).superseded_by is None
    assert row(old).superseded_at is None
    assert {old, new} <= set(ids(recalled(cast.alice.id)))
    last = history(old)[-1]
    assert (last.action, decided(last)["decided_by"], last.superseded_by) == (
        "restored",
        "undo",
        None,
    )
    # The replacing memory's history says so too (review133: it said "replaces" still).
    released = history(new)[-1]
    assert (released.action, released.replaces, released.content) == ("updated", [], NEW)
    assert decided(released) == {"decided_by": "undo", "reason": f"no longer replaces {old}"}
    with pytest.raises(Conflict):
        services.restore(user_id=cast.alice.id, id=old)
    with pytest.raises(NotFound):
        services.restore(user_id=cast.charlie.id, id=old)


@pytest.mark.parametrize("how", ["forget", "expiry"])
def test_a_memory_current_again_because_its_replacement_went_says_so(cast, how) -> None:
    # The key clears the link when the replacing memory is deleted; the older
    # memory's history read "restored" with no reason, like an undo by hand.
    old = remember(cast.alice.id, OLD)["id"]
    new = remember(cast.alice.id, NEW, replaces=old, ttl_seconds=60)["id"]
    if how == "forget":
        services.forget(user_id=cast.alice.id, mode="by_id", id=new)
    else:
        assert services.clean_up(now=timezone.now() + timedelta(minutes=2)) is not None

    last = history(old)[-1]
    assert (last.action, row(old).superseded_by) == ("restored", None)
    assert (
        decided(last)
        == {
            "forget": {
                "decided_by": "deletion",
                "reason": "the memory that replaced it was deleted",
            },
            "expiry": {"decided_by": "expiry", "reason": "the memory that replaced it expired"},
        }[how]
    )


def test_the_quick_purge_frees_a_memory_whose_replacement_expired(cast) -> None:
    # The older value stayed replaced, by a memory no tool returns, until the
    # minute's clean-up ran: the fact was missing from every search meanwhile.
    from memories.services import maintenance

    old = remember(cast.alice.id, OLD)["id"]
    new = remember(cast.alice.id, NEW, replaces=old, ttl_seconds=60)["id"]
    later = timezone.now() + timedelta(minutes=2)

    assert maintenance.free_expired_replacements(now=later) == 1
    assert row(old).superseded_by is None
    assert decided(history(old)[-1])["decided_by"] == "expiry"
    with tenancy.operator():
        assert not Memory.objects.filter(id=new).exists()


def test_the_quick_purge_leaves_expired_memories_that_replaced_nothing_to_the_clean_up(
    cast,
) -> None:
    from memories.services import maintenance

    alone = remember(cast.alice.id, OLD, ttl_seconds=60)["id"]
    later = timezone.now() + timedelta(minutes=2)

    assert maintenance.free_expired_replacements(now=later) == 0
    with tenancy.operator():
        assert Memory.objects.filter(id=alone).exists()


def test_an_expired_memory_is_not_restored(cast) -> None:
    old = remember(cast.alice.id, OLD, ttl_seconds=60)["id"]
    remember(cast.alice.id, NEW, replaces=old)
    with tenancy.operator(), connection.cursor() as cursor:
        cursor.execute(
            "UPDATE memories SET expires_at = statement_timestamp() - interval '1 second'"
            " WHERE id = %s",
            [old],
        )
    versions = len(history(old))

    # Gone to every tool, as to update_memory: not "current again", unseen.
    with pytest.raises(NotFound):
        services.restore(user_id=cast.alice.id, id=old)
    assert len(history(old)) == versions


def test_a_memory_named_as_replacing_itself_is_refused(cast) -> None:
    old = remember(cast.alice.id, OLD)["id"]

    with pytest.raises(ValidationFailed, match="cannot replace itself"):
        remember(cast.alice.id, OLD, replaces=old)
    assert row(old).superseded_by is None
    assert [h.action for h in history(old)] == ["created"]


def test_a_replaced_fact_stated_again_is_current_again(cast) -> None:
    # The host moved, then moved back: the first statement, word for word.
    old = remember(cast.alice.id, OLD)["id"]
    new = remember(cast.alice.id, NEW)
    assert new["replaces"] == [old]  # detected

    again = remember(cast.alice.id, OLD)

    assert again == {"id": old, "deduped": True, "replaces": [new["id"]]}
    assert row(old).superseded_by is None
    assert str(row(new["id"]).superseded_by) == old
    assert ids(recalled(cast.alice.id))[:1] == [old]
    assert new["id"] not in ids(recalled(cast.alice.id))
    listed = services.list_memories(user_id=cast.alice.id)
    assert ids(listed) == [old]
    restored, replacing = history(old)[-2:]
    assert (restored.action, decided(restored)["decided_by"]) == ("restored", "restated")
    assert new["id"] in decided(restored)["reason"]
    # Both sides of the new link, as of any link.
    assert (replacing.action, replacing.content) == ("updated", OLD)
    assert [str(x) for x in replacing.replaces or []] == [new["id"]]
    assert decided(replacing)["decided_by"] == "restated"
    replaced = history(new["id"])[-1]
    assert (replaced.action, str(replaced.superseded_by)) == ("superseded", old)
    assert decided(replaced)["decided_by"] == "restated"


def test_a_link_made_after_both_were_stored_is_in_both_histories(cast) -> None:
    old = remember(cast.alice.id, AMBIGUOUS_OLD)["id"]
    hinted = remember(cast.alice.id, AMBIGUOUS_NEW)
    assert "replaces" not in hinted and hinted["may_replace"][0]["id"] == old
    new = hinted["id"]
    versions = len(history(new))

    # As an agent links a hint: the same content again, naming what it replaces.
    linked = remember(cast.alice.id, AMBIGUOUS_NEW, replaces=old)

    assert linked == {"id": new, "deduped": True, "replaces": [old]}
    assert history(old)[-1].action == "superseded"
    later = history(new)
    assert len(later) == versions + 1
    assert (later[-1].action, [str(x) for x in later[-1].replaces or []]) == ("updated", [old])
    assert decided(later[-1]) == {"decided_by": "explicit"}
    assert later[-1].content == later[-2].content
    shown = services.memory_history(user_id=cast.alice.id, id=new)
    assert shown[-1]["replaces"] == [old]


def test_a_fact_stated_again_replaces_the_end_of_its_chain(cast) -> None:
    first = remember(cast.alice.id, "The team standup is at 9:30.")["id"]
    second = remember(cast.alice.id, "The team standup moved to 10:00.", replaces=first)["id"]
    third = remember(cast.alice.id, "The team standup is at 10:30 now.", replaces=second)["id"]

    again = remember(cast.alice.id, "The team standup is at 9:30.")

    assert again["replaces"] == [third]
    assert row(first).superseded_by is None
    assert str(row(second).superseded_by) == third  # history between stays as it was
    assert str(row(third).superseded_by) == first
    assert ids(services.list_memories(user_id=cast.alice.id)) == [first]


def links_by_content(user_id) -> dict[str, str | None]:
    with tenancy.operator():
        rows = list(Memory.objects.filter(user_id=user_id))
    content = {m.id: m.content for m in rows}
    return {m.content: content.get(m.superseded_by) for m in rows}  # type: ignore[arg-type]


def test_a_fact_that_changed_back_keeps_its_chain_through_export_and_import(cast) -> None:
    # The file lists memories by creation, the older first; here the older
    # replaces the newer, and was replaced again since: linked in the file's
    # order, the second link named a memory already replaced and the
    # database refused it, and with it every link of the import.
    first = remember(cast.alice.id, "The team standup is at 9:30.")["id"]
    remember(cast.alice.id, "The team standup moved to 10:00.", replaces=first)
    remember(cast.alice.id, "The team standup is at 9:30.")  # changed back
    latest = remember(cast.alice.id, "The team standup is at 11:00 now.", replaces=first)
    assert latest["replaces"] == [first]
    records = list(services.export_memories(user_id=cast.alice.id))

    report = services.import_memories(user_id=cast.charlie.id, records=records)

    assert (report.imported, report.linked, report.unlinked) == (3, 2, 0)
    assert links_by_content(cast.charlie.id) == links_by_content(cast.alice.id)
    assert links_by_content(cast.charlie.id) == {
        "The team standup moved to 10:00.": "The team standup is at 9:30.",
        "The team standup is at 9:30.": "The team standup is at 11:00 now.",
        "The team standup is at 11:00 now.": None,
    }


def test_an_import_whose_links_loop_drops_a_link_not_the_import(cast) -> None:
    one = remember(cast.alice.id, OLD)["id"]
    two = remember(cast.alice.id, "The office wifi password is tulip-42.")["id"]
    records = list(services.export_memories(user_id=cast.alice.id))
    # Edited by hand: each replaces the other.
    for record in records:
        record["superseded_by"] = two if record["id"] == one else one
        record["superseded_at"] = "2026-12-01T10:00:00Z"

    report = services.import_memories(user_id=cast.charlie.id, records=records)

    assert (report.imported, report.linked, report.unlinked, report.refused) == (2, 1, 0, 1)
    linked = links_by_content(cast.charlie.id)
    assert sorted(v is None for v in linked.values()) == [False, True]


def test_an_import_names_its_own_ids_in_the_history_and_drops_a_link_across_namespaces(
    cast,
) -> None:
    # Alice's export into Charlie on the same server: every id is taken, so
    # each memory gets a new one, and the history still named Alice's. A
    # link across a namespace (an edited file) stopped every link.
    old = remember(cast.alice.id, OLD)["id"]
    new = remember(cast.alice.id, NEW, replaces=old)["id"]
    stray = remember(cast.alice.id, "The office wifi password is tulip-42.")["id"]
    records = list(services.export_memories(user_id=cast.alice.id))
    for record in records:
        if record["id"] == stray:
            # Moved whole, history too: a history in another namespace is refused.
            record["namespace"] = "elsewhere"
            versions: list[dict[str, object]] = record["history"]  # type: ignore[assignment]
            for entry in versions:
                entry["namespace"] = "elsewhere"
            record["superseded_by"], record["superseded_at"] = new, "2026-12-01T10:00:00Z"

    report = services.import_memories(user_id=cast.charlie.id, records=records)

    assert (report.imported, report.linked, report.unlinked, report.refused) == (3, 1, 0, 1)
    with tenancy.operator():
        mine = set(Memory.objects.filter(user_id=cast.charlie.id).values_list("id", flat=True))
        named = set()
        for version in MemoryHistory.objects.filter(user_id=cast.charlie.id):
            named |= {version.superseded_by, *(version.replaces or [])} - {None}
    assert named and named <= mine
    assert links_by_content(cast.charlie.id)[OLD] == NEW


def test_an_import_links_a_memory_it_found_here_with_history_and_counts_a_repeat(cast) -> None:
    old = remember(cast.alice.id, OLD)["id"]
    remember(cast.alice.id, NEW, replaces=old)
    records = list(services.export_memories(user_id=cast.alice.id))
    here = remember(cast.charlie.id, OLD)["id"]  # Charlie's own, before the import

    first = services.import_memories(user_id=cast.charlie.id, records=records)
    again = services.import_memories(user_id=cast.charlie.id, records=records)

    assert (first.imported, first.deduplicated, first.linked, first.unlinked) == (1, 1, 1, 0)
    # The same file again: every memory found, the link already there, none made (review145).
    assert (again.imported, again.deduplicated, again.linked, again.unlinked) == (0, 2, 0, 0)
    assert (again.already_linked, again.refused) == (1, 0)
    # Linked silently before: no version, no history row, held true at every moment.
    last = history(here)[-1]
    assert (last.action, last.version) == ("superseded", 2)
    assert decided(last)["decided_by"] == "import"
    assert links_by_content(cast.charlie.id)[OLD] == NEW


def test_an_import_takes_the_place_of_an_expired_copy_not_yet_purged(cast) -> None:
    # The copy no tool returns still held its place to the dedup index: the
    # batch's insert conflicted three times and the import stopped.
    remember(cast.alice.id, OLD)
    records = list(services.export_memories(user_id=cast.alice.id))
    expiring = remember(cast.charlie.id, OLD, ttl_seconds=60)["id"]
    with tenancy.operator(), connection.cursor() as cursor:
        cursor.execute(
            "UPDATE memories SET expires_at = statement_timestamp() - interval '1 second'"
            " WHERE id = %s",
            [expiring],
        )

    report = services.import_memories(user_id=cast.charlie.id, records=records)

    assert (report.imported, report.deduplicated) == (1, 0)
    assert [m["content"] for m in services.list_memories(user_id=cast.charlie.id)] == [OLD]


@pytest.mark.parametrize(
    ("edit", "fragment"),
    [
        (lambda h: h[0].update(replaces=5), "replaces must be a list"),
        (lambda h: h.append(dict(h[0])), "two entries of one version"),
        (lambda h: h[0].update(decision={"reason": "a\x00b"}), "metadata"),
    ],
)
def test_a_malformed_history_is_refused_not_a_crash(cast, edit, fragment) -> None:
    remember(cast.alice.id, OLD)
    [record] = list(services.export_memories(user_id=cast.alice.id))
    edit(record["history"])

    with pytest.raises(ValidationFailed, match=fragment):
        services.import_memories(user_id=cast.charlie.id, records=[record])
    with tenancy.operator():
        assert not Memory.objects.filter(user_id=cast.charlie.id).exists()


def test_a_replaced_memory_shown_on_request_marks_and_moves_nothing(cast) -> None:
    first = remember(cast.alice.id, "The primary database host is pg-1.")["id"]
    second = remember(cast.alice.id, "The primary database host is pg-2.", replaces=first)["id"]
    remember(cast.alice.id, "The primary database host is pg-1.")  # changed back

    found = recalled(cast.alice.id, "What is the primary database host?", include_superseded=True)

    assert ids(found) == [first, second]
    current, replaced = found
    assert "may_be_replaced_by" not in current and "superseded_by" not in current
    assert replaced["superseded_by"] == first


def test_a_replaced_memory_lifts_none_of_its_neighbours(cast) -> None:
    # The replaced fact matches the question best, word for word; the fact
    # stored beside it does not answer it. Hidden, the replaced one must not
    # raise its neighbour (by creation) above the current answer.
    old = remember(cast.alice.id, "Finn's swimming lessons are on Saturday mornings.")["id"]
    beside = remember(cast.alice.id, "Finn is 9 years old.")["id"]
    for filler in ("The car is due its MOT in May.", "Our wifi router is in the hall."):
        remember(cast.alice.id, filler)
    new = remember(
        cast.alice.id, "Swimming for Finn is Sunday afternoons this term.", replaces=old
    )["id"]

    found = ids(recalled(cast.alice.id, "When are Finn's swimming lessons?"))

    assert old not in found
    assert found.index(new) < found.index(beside)
    # Shown on request, the replaced memory ranks (and lifts) as before.
    assert old in ids(
        recalled(cast.alice.id, "When are Finn's swimming lessons?", include_superseded=True)
    )


def test_a_server_of_the_previous_release_still_ranks(cast, monkeypatch) -> None:
    # During a rolling upgrade the servers not yet restarted call recall_rank()
    # without 0020's two arguments (migration 0021 keeps that form): it ranks
    # as before 0020, replaced memories included, for them to drop as they did.
    from memories import search

    old = remember(cast.alice.id, "Finn's swimming lessons are on Saturday mornings.")["id"]
    remember(cast.alice.id, "Finn is 9 years old.")
    remember(cast.alice.id, "Swimming for Finn is Sunday afternoons this term.", replaces=old)
    question = "When are Finn's swimming lessons?"
    current = recalled(cast.alice.id, question, include_superseded=True)
    ranked_sql = search.ranked_sql
    sent: list[str] = []

    def previous_release(*args, **kwargs):
        sql, params = ranked_sql(*args, **kwargs)
        assert ", %(held_until)s, %(current)s\n" in sql
        sent.append(sql.replace(", %(held_until)s, %(current)s\n", "\n"))
        return sent[-1], params

    monkeypatch.setattr(search, "ranked_sql", previous_release)

    before = recalled(cast.alice.id, question, include_superseded=True, use_cache=False)
    assert sent  # ranked afresh, by the 22-argument form
    ranked = len(sent)
    assert [(r["id"], r["score"]) for r in before] == [(r["id"], r["score"]) for r in current]
    assert old in ids(recalled(cast.alice.id, question, use_cache=False))
    assert len(sent) > ranked


def test_replaced_memories_take_none_of_the_lexical_sides_places(
    cast, monkeypatch, settings
) -> None:
    # The lexical side keeps its best BM25 matches (search.POOL of them);
    # replaced versions that matched better took those places and were
    # dropped only afterwards, so a current match was left out (0024): here
    # (a pool of 2, two replaced versions that outscore both current
    # memories) a lexical search found nothing at all. A hybrid search has the
    # nearest neighbours too, so shows it only past the pool's size.
    from memories import search

    settings.RECALL_SUPERSESSION = "off"  # only the links named below
    note = remember(cast.alice.id, "Ordered more zebrafish food from Aquarium Supplies.")["id"]
    chain = [remember(cast.alice.id, "Zebrafish: the zebrafish tank is zebrafish tank A.")["id"]]
    for tank in ("B", "C"):
        content = f"Zebrafish: the zebrafish tank is zebrafish tank {tank}."
        chain.append(remember(cast.alice.id, content, replaces=chain[-1])["id"])
    monkeypatch.setattr(search, "POOL", 2)

    found = ids(recalled(cast.alice.id, "zebrafish", mode="lexical", use_cache=False))

    assert found == [chain[-1], note]


def test_memories_not_held_at_as_of_take_none_of_the_lexical_sides_places(
    cast, monkeypatch, settings
) -> None:
    # The same for as_of: two memories stored after it match better, and
    # are no answer then.
    from memories import search
    from memories.tests.test_as_of import moment

    settings.RECALL_SUPERSESSION = "off"
    note = remember(cast.alice.id, "Ordered more zebrafish food from Aquarium Supplies.")["id"]
    then = moment()
    for tank in ("B", "C"):
        remember(cast.alice.id, f"Zebrafish: the zebrafish tank is zebrafish tank {tank}.")
    monkeypatch.setattr(search, "POOL", 2)

    found = recalled(cast.alice.id, "zebrafish", mode="lexical", use_cache=False, as_of=then)

    assert ids(found) == [note]


def first_read_then(monkeypatch, meanwhile) -> None:
    """Run ``meanwhile`` once, just after store() first reads what is stored already."""
    from memories.services import storing

    original = storing._held_by_place
    ran: list[bool] = []

    def read_then(*args, **kwargs):
        found = original(*args, **kwargs)
        if not ran:
            ran.append(True)
            meanwhile()
        return found

    monkeypatch.setattr(storing, "_held_by_place", read_then)


def test_content_forgotten_while_it_is_stated_again_is_stored_anew(cast, monkeypatch) -> None:
    old = remember(cast.alice.id, OLD)["id"]
    first_read_then(
        monkeypatch, lambda: services.forget(user_id=cast.alice.id, mode="by_id", id=old)
    )

    again = remember(cast.alice.id, OLD)

    # Not "stored already" under the id that was just deleted.
    assert again["deduped"] is False and again["id"] != old
    assert ids(services.list_memories(user_id=cast.alice.id)) == [again["id"]]


def test_content_replaced_while_it_is_stated_again_is_current_again(cast, monkeypatch) -> None:
    old = remember(cast.alice.id, OLD)["id"]
    new: list[str] = []
    first_read_then(monkeypatch, lambda: new.append(remember(cast.alice.id, NEW)["id"]))

    again = remember(cast.alice.id, OLD)

    assert again == {"id": old, "deduped": True, "replaces": new}
    assert row(old).superseded_by is None


def test_content_that_keeps_changing_under_a_call_is_a_conflict_to_retry(cast, monkeypatch) -> None:
    from memories.services import storing

    old = remember(cast.alice.id, OLD)["id"]
    reads = []

    def always_changed(user_id, held):
        reads.append(held)
        raise storing._PlaceChanged

    monkeypatch.setattr(storing, "_still_held", always_changed)
    with pytest.raises(Conflict, match="Make the call again"):
        remember(cast.alice.id, OLD)
    assert len(reads) == storing.PLACE_ATTEMPTS
    assert ids(services.list_memories(user_id=cast.alice.id)) == [old]


def test_a_current_fact_stated_again_changes_nothing(cast) -> None:
    old = remember(cast.alice.id, OLD)["id"]
    versions = len(history(old))

    again = remember(cast.alice.id, OLD)

    assert again == {"id": old, "deduped": True}
    assert len(history(old)) == versions


def test_a_fact_stated_again_with_replaces_links_what_was_named(cast) -> None:
    old = remember(cast.alice.id, OLD)["id"]
    new = remember(cast.alice.id, NEW, replaces=old)["id"]

    again = remember(cast.alice.id, OLD, replaces=new)

    assert again["replaces"] == [new]
    assert row(old).superseded_by is None
    assert decided(history(new)[-1])["decided_by"] == "explicit"


def test_with_detection_off_a_fact_stated_again_is_current_and_links_nothing(
    cast, settings
) -> None:
    settings.RECALL_SUPERSESSION = "off"
    old = remember(cast.alice.id, OLD)["id"]
    new = remember(cast.alice.id, NEW, replaces=old)["id"]  # the caller's own link

    again = remember(cast.alice.id, OLD)

    assert again == {"id": old, "deduped": True}
    assert row(old).superseded_by is None
    assert row(new).superseded_by is None  # both current: no link but the caller's
    assert decided(history(old)[-1])["decided_by"] == "restated"


def test_a_fact_stated_again_links_no_expired_memory(cast) -> None:
    old = remember(cast.alice.id, OLD)["id"]
    new = remember(cast.alice.id, NEW, replaces=old)["id"]
    with tenancy.operator():
        Memory.objects.filter(id=new).update(expires_at=timezone.now() - timedelta(seconds=1))

    again = remember(cast.alice.id, OLD)

    assert again == {"id": old, "deduped": True}
    assert row(old).superseded_by is None
    assert row(new).superseded_by is None


def test_a_memory_whose_replacement_expired_can_be_named_before_the_purge(cast) -> None:
    # It was a conflict ("already replaced by <the expired one>; replace that one"), and
    # naming the expired one was not_found: no way on but restore, until the purge ran.
    old = remember(cast.alice.id, OLD)["id"]
    gone = remember(cast.alice.id, NEW, replaces=old)["id"]
    with tenancy.operator():
        Memory.objects.filter(id=gone).update(expires_at=timezone.now() - timedelta(seconds=1))

    newest = remember(cast.alice.id, "The primary database moved to pg-main-3.", replaces=old)

    assert newest["replaces"] == [old]
    assert row(old).superseded_by == uuid.UUID(newest["id"])
    freed = [v for v in history(old) if v.action == "restored"]
    assert [decided(v)["decided_by"] for v in freed] == ["expiry"]


def test_a_memory_whose_expired_replacement_was_replaced_in_turn_names_the_chains_end(
    cast,
) -> None:
    # A -> B -> C, B expired: A is C's older value (the purge passes it on), so a
    # write naming A is told to replace C. Freeing A made a second current end.
    first = remember(cast.alice.id, OLD)["id"]
    middle = remember(cast.alice.id, NEW, replaces=first)["id"]
    last = remember(cast.alice.id, "The primary database moved to pg-main-3.", replaces=middle)
    with tenancy.operator():
        Memory.objects.filter(id=middle).update(expires_at=timezone.now() - timedelta(seconds=1))

    with pytest.raises(Conflict, match=f"already replaced by {last['id']}; replace that one"):
        remember(cast.alice.id, "The primary database is now pg-main-4.", replaces=first)

    assert row(first).superseded_by == uuid.UUID(middle)
    with tenancy.operator():
        assert not Memory.objects.filter(content__endswith="pg-main-4.").exists()


def test_naming_a_memory_whose_chain_has_expired_steps_names_its_latest_live_one(cast) -> None:
    # A -> B -> C -> D, B and D expired: the purge leaves A -> C with C current, so
    # a write naming A is told to replace C. Looking at the end (D, expired) alone,
    # A was freed and replaced: C and the new memory both current after the purge.
    user = cast.alice.id
    first = remember(user, OLD)["id"]
    second = remember(user, NEW, replaces=first)["id"]
    third = remember(user, "The primary database moved to pg-main-3.", replaces=second)["id"]
    fourth = remember(user, "The primary database is now pg-main-4.", replaces=third)["id"]
    with tenancy.operator():
        Memory.objects.filter(id__in=[second, fourth]).update(
            expires_at=timezone.now() - timedelta(seconds=1)
        )

    with pytest.raises(Conflict, match=f"already replaced by {third}; replace that one"):
        remember(user, "The primary database is pg-main-5.", replaces=first)


def test_a_fact_stated_again_by_another_writer_is_its_own_memory(cast, agents) -> None:
    # Deduplication is per writer: the user-wide copy stays replaced.
    old = remember(cast.alice.id, OLD)["id"]
    remember(cast.alice.id, NEW, replaces=old)

    theirs = services.remember(
        user_id=cast.alice.id, agent_id=agents.research.id, tier=Tier.PRO, content=OLD
    )

    assert theirs["id"] != old and theirs["deduped"] is False
    assert row(old).superseded_by is not None


EMPLOYER = "Cormac works at Brackenfield."
NEW_EMPLOYER = "Cormac is a staff engineer at Marlowe Robotics."


def test_a_mark_the_user_agrees_with_becomes_a_link(cast) -> None:
    old = remember(cast.alice.id, EMPLOYER)["id"]
    new = remember(cast.alice.id, NEW_EMPLOYER)["id"]
    [marked] = [m for m in recalled(cast.alice.id, "Who employs Cormac?") if m["id"] == old]
    assert marked["may_be_replaced_by"] == new

    linked = services.link(user_id=cast.alice.id, id=old, by=new)

    assert linked == {"id": old, "superseded_by": new}
    assert row(old).superseded_by == uuid.UUID(new)
    assert old not in ids(recalled(cast.alice.id, "Who employs Cormac?"))
    last = history(old)[-1]
    assert (last.action, decided(last)["decided_by"], str(last.superseded_by)) == (
        "superseded",
        "explicit",
        new,
    )
    assert services.replaced_by_each(user_id=cast.alice.id, ids=[new]) == {new: [old]}
    # Undone as any link is.
    services.restore(user_id=cast.alice.id, id=old)
    assert row(old).superseded_by is None


def test_a_link_between_existing_memories_is_checked_and_writes_nothing_when_wrong(
    cast, agents
) -> None:
    old = remember(cast.alice.id, EMPLOYER)["id"]
    new = remember(cast.alice.id, NEW_EMPLOYER)["id"]
    elsewhere = remember(cast.alice.id, NEW_EMPLOYER, namespace="work")["id"]
    agents_own = remember(cast.alice.id, NEW_EMPLOYER, agent_id=agents.research.id)["id"]
    charlies = remember(cast.charlie.id, NEW_EMPLOYER)["id"]
    remember(cast.alice.id, "Cormac left Marlowe Robotics in May.", replaces=new)

    with pytest.raises(NotFound):
        services.link(user_id=cast.alice.id, id=old, by=charlies)
    with pytest.raises(NotFound):
        services.link(user_id=cast.charlie.id, id=old, by=charlies)
    with pytest.raises(ValidationFailed):
        services.link(user_id=cast.alice.id, id=old, by=elsewhere)
    with pytest.raises(ValidationFailed):
        services.link(user_id=cast.alice.id, id=old, by=agents_own)
    with pytest.raises(ValidationFailed):
        services.link(user_id=cast.alice.id, id=old, by=old)
    with pytest.raises(ValidationFailed):
        services.link(user_id=cast.alice.id, id=old, by="not-an-id")
    with pytest.raises(Conflict):
        services.link(user_id=cast.alice.id, id=old, by=new)  # new is replaced itself
    with pytest.raises(NotFound):
        # An agent sees only its own memories: alice's are not its to link.
        services.link(user_id=cast.alice.id, agent_id=agents.research.id, id=old, by=agents_own)

    assert row(old).superseded_by is None
    assert [v.action for v in history(old)] == ["created"]


def test_as_of_answers_from_what_was_held_true_then(cast) -> None:
    old = remember(cast.alice.id, OLD)["id"]
    time.sleep(0.05)
    with connection.cursor() as cursor:
        cursor.execute("SELECT clock_timestamp()")
        (between,) = cursor.fetchone()
    time.sleep(0.05)
    new = remember(cast.alice.id, NEW, replaces=old)["id"]

    then = recalled(cast.alice.id, as_of=between.isoformat())
    now = recalled(cast.alice.id)

    assert ids(then) == [old]
    assert then[0]["superseded_by"] == new  # held then, replaced since: marked
    assert ids(now) == [new]
    with pytest.raises(ValidationFailed):
        recalled(cast.alice.id, as_of="last tuesday")


def test_forgetting_the_replacement_makes_the_older_memory_current(cast) -> None:
    old = remember(cast.alice.id, OLD)["id"]
    new = remember(cast.alice.id, NEW, replaces=old)["id"]

    services.forget_by_id(user_id=cast.alice.id, id=new)

    assert row(old).superseded_by is None
    assert row(old).superseded_at is None
    assert ids(recalled(cast.alice.id)) == [old]
    assert history(old)[-1].action == "restored"


@pytest.mark.parametrize("how", ["forget", "purge", "expiry"])
def test_a_chain_whose_middle_goes_passes_the_older_memory_on(cast, how) -> None:
    # A -> B -> C, B forgotten or expired and purged: A was made current again
    # beside C, an outdated value every search then returned as a fact.
    first = remember(cast.alice.id, OLD)["id"]
    middle = remember(cast.alice.id, NEW, replaces=first, ttl_seconds=60)["id"]
    last = remember(cast.alice.id, "The primary database moved to pg-main-3.", replaces=middle)
    taken = row(first).superseded_at

    if how == "expiry":
        done = services.clean_up(now=timezone.now() + timedelta(minutes=2))
        assert done is not None and done.expired_memories == 1
    else:
        services.forget(user_id=cast.alice.id, mode="by_id", id=middle, purge=how == "purge")

    assert row(first).superseded_by == uuid.UUID(last["id"])
    assert row(first).superseded_at == taken  # replaced since then, by its chain
    assert ids(recalled(cast.alice.id)) == [last["id"]]
    passed = history(first)[-1]
    assert (passed.action, passed.superseded_by) == ("superseded", uuid.UUID(last["id"]))
    assert decided(passed) == {
        "decided_by": "expiry" if how == "expiry" else "deletion",
        "reason": (
            "the memory between them expired; the chain goes on"
            if how == "expiry"
            else "the memory between them was deleted; the chain goes on"
        ),
    }
    # The next step's own history names what it replaces now (review133: it named
    # only the memory deleted, and nothing said it replaced the first).
    named = history(last["id"])[-1]
    assert (named.action, named.replaces) == ("updated", [uuid.UUID(first)])
    assert decided(named) == decided(passed)
    assert named.content == "The primary database moved to pg-main-3."
    # The end of a chain forgotten still frees what it replaced.
    services.forget(user_id=cast.alice.id, mode="by_id", id=last["id"])
    assert row(first).superseded_by is None


@pytest.mark.parametrize("how", ["forget", "expiry together", "expiry in turn"])
def test_a_chain_keeps_its_order_when_steps_inside_it_go(cast, how) -> None:
    # A -> B -> C -> D, B and D gone: A was passed on to D, the end, and D's
    # going then freed A beside C (or, with B and D in one batch, A was freed at
    # once): two current values for one slot. A passes on to C, the next step.
    user = cast.alice.id
    ttl = {"ttl_seconds": 60}
    first = remember(user, OLD)["id"]
    second = remember(user, NEW, replaces=first, **ttl)["id"]
    third = remember(user, "The primary database moved to pg-main-3.", replaces=second)["id"]
    later = {"expiry in turn": {"ttl_seconds": 600}, "expiry together": ttl}.get(how, {})
    fourth = remember(user, "The primary database is now pg-main-4.", replaces=third, **later)

    if how == "forget":
        services.forget(user_id=user, mode="by_id", id=second)
        assert row(first).superseded_by == uuid.UUID(third)
        services.forget(user_id=user, mode="by_id", id=fourth["id"])
    else:
        soon = timezone.now() + timedelta(minutes=2)
        assert services.clean_up(now=soon) is not None
        if how == "expiry in turn":
            assert row(first).superseded_by == uuid.UUID(third)
            assert services.clean_up(now=soon + timedelta(minutes=15)) is not None

    assert row(first).superseded_by == uuid.UUID(third)
    assert row(third).superseded_by is None
    assert ids(recalled(user)) == [third]


def test_forget_previews_follow_the_same_rule(cast) -> None:
    old = remember(cast.alice.id, OLD)["id"]
    new = remember(cast.alice.id, NEW, replaces=old)["id"]

    preview = services.forget(user_id=cast.alice.id, mode="by_query", query=QUESTION, threshold=0)
    wider = services.forget(
        user_id=cast.alice.id,
        mode="by_query",
        query=QUESTION,
        threshold=0,
        include_superseded=True,
    )

    assert [m["id"] for m in preview["matches"]] == [new]
    assert {m["id"] for m in wider["matches"]} == {old, new}
    # Marked as recall marks it: the replaced one looked current here.
    marks = {m["id"]: m.get("superseded_by") for m in wider["matches"]}
    assert marks == {old: new, new: None}


def test_lists_and_stats_show_or_hide_replaced_memories(cast) -> None:
    old = remember(cast.alice.id, OLD)["id"]
    new = remember(cast.alice.id, NEW, replaces=old)["id"]

    def listed(**kwargs) -> list[str]:
        return [m["id"] for m in services.list_memories(user_id=cast.alice.id, **kwargs)]

    assert listed() == [new]
    assert set(listed(superseded="include")) == {old, new}
    assert listed(superseded="only") == [old]
    [entry] = services.list_memories(user_id=cast.alice.id, superseded="only")
    assert entry["superseded_by"] == new
    with pytest.raises(ValidationFailed):
        listed(superseded="sometimes")
    stats = services.memory_stats(user_id=cast.alice.id)
    assert (stats["memories"], stats["superseded"]) == (2, 1)
    assert stats["namespaces"][0]["superseded"] == 1  # type: ignore[index]


def test_links_stay_inside_an_agent(cast, agents) -> None:
    def as_agent(agent, content, **kwargs):
        return services.remember(
            user_id=cast.alice.id, agent_id=agent.id, tier=Tier.PRO, content=content, **kwargs
        )

    theirs = as_agent(agents.writer, OLD)["id"]
    user_wide = remember(cast.alice.id, OLD)["id"]

    # An agent cannot name another agent's memory, nor the user-wide one.
    with pytest.raises(NotFound):
        as_agent(agents.research, NEW, replaces=theirs)
    with pytest.raises(NotFound):
        as_agent(agents.research, NEW, replaces=user_wide)
    # The user-wide path sees the agent's memory, but a link never crosses writers.
    with pytest.raises(ValidationFailed):
        remember(cast.alice.id, NEW, replaces=theirs)
    # Detection compares a writer's own memories only.
    mine = as_agent(agents.research, NEW)
    assert "replaces" not in mine
    assert row(theirs).superseded_by is None
    assert row(user_wide).superseded_by is None


def research_note(cast, agents, content, **kwargs) -> dict:
    """Store a note as Alice's research agent (seed 003's add); its result."""
    return dict(
        services.add(
            user_id=cast.alice.id,
            agent_id=agents.research.id,
            tier=Tier.PRO,
            content=content,
            **kwargs,
        )[0]
    )


def test_detection_links_notes_of_one_task_only(cast, agents) -> None:
    # A note filed under a task is lent to the agents that name the task; a
    # later note of the same writer outside the task replacing it hid it from
    # them, and they could not see what replaced it.
    def add(content, **kwargs):
        return research_note(cast, agents, content, **kwargs)

    shared = add(OLD, task_id="launch")["id"]
    own = add(NEW)
    assert "replaces" not in own
    assert row(shared).superseded_by is None
    seen = services.search_sources(
        user_id=cast.alice.id, agent_id=agents.writer.id, query=QUESTION, task_id="launch"
    )
    assert ids(seen) == [shared]

    # Within the task, as anywhere: a new value replaces the old one.
    update = add("Staging Postgres moved to pg-staging-9 yesterday.", task_id="launch")
    assert update["replaces"] == [shared]


def test_detection_links_notes_of_one_author_only(cast, agents) -> None:
    # Seed 003's author names a note's source: "Meeting notes by Dana" was
    # replaced by Erik's, and 204 of 210 writers' notes on one topic were
    # hidden, leaving memory_filters with 13 authors.
    def add(content, **kwargs):
        return research_note(cast, agents, content, **kwargs)

    danas = add(OLD, author="dana")["id"]
    eriks = add(NEW, author="erik")
    assert "replaces" not in eriks
    assert row(danas).superseded_by is None

    # One author's own new value replaces their old one, as before.
    update = add("Staging Postgres moved to pg-staging-9 yesterday.", author="dana")
    assert update["replaces"] == [danas]


def test_replaces_and_link_name_only_notes_of_the_same_task(cast, agents) -> None:
    # What detection and newer first never pair, a caller could name: a
    # conversation's message (it left its thread's listing) or a task's note
    # replaced from outside the task (it vanished for the task's agents).
    def add(content, **kwargs):
        return research_note(cast, agents, content, **kwargs)

    said = services.add(
        user_id=cast.alice.id,
        agent_id=agents.research.id,
        tier=Tier.PRO,
        messages=[{"role": "user", "content": OLD}],
    )[0]["id"]
    shared = add(OLD, task_id="launch")["id"]

    with pytest.raises(ValidationFailed, match="a conversation's message"):
        add(NEW, replaces=said)
    with pytest.raises(ValidationFailed, match="another task"):
        add(NEW, replaces=shared)
    own = add("Staging Postgres moved to pg-staging-9 yesterday.")["id"]
    # A task's note naming a note of none hears which it named.
    with pytest.raises(ValidationFailed, match="a note of no task"):
        add("Staging Postgres is on pg-staging-11.", task_id="launch", replaces=own)
    for old, new in ((shared, own), (said, own)):
        with pytest.raises(ValidationFailed):
            services.link(user_id=cast.alice.id, agent_id=agents.research.id, id=old, by=new)
    assert row(said).superseded_by is None and row(shared).superseded_by is None
    # Within the task, as anywhere.
    within = add(NEW, task_id="launch", replaces=shared)
    assert within["replaces"] == [shared]


def test_another_agents_note_lent_through_a_task_is_named_as_not_the_writers(cast, agents) -> None:
    # It was "No memory with id … to replace": the agent had just found it.
    shared = research_note(cast, agents, OLD, task_id="launch")["id"]
    seen = services.search_sources(
        user_id=cast.alice.id, agent_id=agents.writer.id, query=QUESTION, task_id="launch"
    )
    assert ids(seen) == [shared]

    def writers_note(replaces: str) -> None:
        services.add(
            user_id=cast.alice.id,
            agent_id=agents.writer.id,
            tier=Tier.PRO,
            content=NEW,
            task_id="launch",
            replaces=replaces,
        )

    with pytest.raises(ValidationFailed, match="written by the same writer"):
        writers_note(shared)
    assert row(shared).superseded_by is None
    # An id that names nothing it can see is still not found.
    with pytest.raises(NotFound):
        writers_note(str(uuid.uuid4()))


def test_a_tasks_note_is_found_among_many_closer_notes_of_another_task(cast) -> None:
    def add(content, task_id):
        return services.add(
            user_id=cast.alice.id, agent_id=None, tier=Tier.PRO, content=content, task_id=task_id
        )[0]

    for n in range(10):
        add(f"{NEW} Ticket {n} says so.", "other")
    old = add(OLD, "launch")["id"]

    new = add(NEW, "launch")

    assert new["replaces"] == [old]


def test_the_database_refuses_a_link_across_a_boundary(cast, agents) -> None:
    writer = services.remember(
        user_id=cast.alice.id, agent_id=agents.writer.id, tier=Tier.PRO, content=OLD
    )["id"]
    research = services.remember(
        user_id=cast.alice.id, agent_id=agents.research.id, tier=Tier.PRO, content=NEW
    )["id"]
    other_ns = remember(cast.alice.id, NEW, namespace="elsewhere")["id"]
    mine = remember(cast.alice.id, OLD)["id"]
    charlies = remember(cast.charlie.id, NEW)["id"]

    def link(user_id, agent_id, old, new) -> None:
        with tenancy.tenant(user_id, agent_id=agent_id), connection.cursor() as cursor:
            cursor.execute(
                "UPDATE memories SET superseded_by = %s, superseded_at = now() WHERE id = %s",
                [new, old],
            )

    # Another agent's memory is invisible to the trigger's lookup under RLS.
    with pytest.raises(DatabaseError):
        link(cast.alice.id, agents.writer.id, writer, research)
    # Across agents on the user-wide path, across namespaces, across tenants.
    with pytest.raises(DatabaseError):
        link(cast.alice.id, None, writer, research)
    with pytest.raises(DatabaseError):
        link(cast.alice.id, None, mine, other_ns)
    with pytest.raises(DatabaseError):
        link(cast.alice.id, None, mine, charlies)
    with pytest.raises(DatabaseError):
        link(cast.alice.id, None, mine, mine)
    assert all(row(m).superseded_by is None for m in (writer, mine))


def test_charlie_cannot_see_alices_links(cast) -> None:
    old = remember(cast.alice.id, OLD)["id"]
    remember(cast.alice.id, NEW, replaces=old)

    assert recalled(cast.charlie.id, include_superseded=True) == []
    assert services.list_memories(user_id=cast.charlie.id, superseded="include") == []
    with pytest.raises(NotFound):
        services.memory_history(user_id=cast.charlie.id, id=old)


@pytest.fixture
def chat(settings) -> Iterator[ChatStub]:
    stub = ChatStub()
    settings.OPENAI_BASE_URL = stub.url
    settings.OPENAI_API_KEY = "sk-test"
    settings.RECALL_CHAT_MODEL = "stub-model"
    settings.RECALL_SUPERSESSION = "llm"
    settings.RECALL_SUPERSESSION_TIMEOUT = 0.5
    yield stub
    stub.close()


AMBIGUOUS_OLD = "Jess prefers beach holidays."
AMBIGUOUS_NEW = "Jess is all about mountain hiking trips now."


def test_a_configured_model_settles_an_ambiguous_pair_and_says_so(cast, chat) -> None:
    chat.reply = '{"decisions": [{"n": 1, "verdict": "replace", "reason": "new preference"}]}'
    old = remember(cast.alice.id, AMBIGUOUS_OLD)["id"]
    new = remember(cast.alice.id, AMBIGUOUS_NEW)

    assert chat.requests, "the model was asked"
    assert new["replaces"] == [old]
    assert "may_replace" not in new  # settled: no longer the caller's question
    [superseded] = [v for v in history(old) if v.action == "superseded"]
    assert decided(superseded)["decided_by"] == "llm"
    assert decided(superseded)["model"] == "stub-model"


def test_a_slow_model_times_out_and_both_memories_stay(cast, chat) -> None:
    chat.reply = '{"decisions": [{"n": 1, "verdict": "replace", "reason": "late"}]}'
    chat.delay = 2.0
    old = remember(cast.alice.id, AMBIGUOUS_OLD)["id"]
    new = remember(cast.alice.id, AMBIGUOUS_NEW)

    # The model would have said "replace", too late: the write gave up on it.
    assert chat.requests
    assert "replaces" not in new
    assert row(old).superseded_by is None
    assert [hint["id"] for hint in new["may_replace"]] == [old]  # still the caller's to judge


def test_a_model_that_names_a_memory_forgotten_meanwhile_links_nothing(
    cast, chat, monkeypatch, caplog
) -> None:
    from memories.supersession import llm

    chat.reply = '{"decisions": [{"n": 1, "verdict": "replace", "reason": "new preference"}]}'
    old = remember(cast.alice.id, AMBIGUOUS_OLD)["id"]
    asked = llm.settle

    def forgotten_while_thinking(*args, **kwargs):
        services.forget(user_id=cast.alice.id, mode="by_id", id=old)
        return asked(*args, **kwargs)

    monkeypatch.setattr(llm, "settle", forgotten_while_thinking)
    with caplog.at_level("WARNING", logger="memories.services"):
        new = remember(cast.alice.id, AMBIGUOUS_NEW)

    assert chat.requests
    assert "replaces" not in new
    assert [m["id"] for m in services.list_memories(user_id=cast.alice.id)] == [new["id"]]
    # Left out before linking, not a link that failed and was logged.
    assert "linking what the model decided failed" not in caplog.text


def test_a_failure_to_link_what_the_model_decided_leaves_the_write_standing(
    cast, chat, monkeypatch, caplog
) -> None:
    from django.db import utils
    from psycopg import errors as pg

    from memories.services import superseding

    chat.reply = '{"decisions": [{"n": 1, "verdict": "replace", "reason": "new preference"}]}'
    old = remember(cast.alice.id, AMBIGUOUS_OLD)["id"]

    def lost(*args, **kwargs):
        error = utils.OperationalError("deadlock detected")
        error.__cause__ = pg.DeadlockDetected("deadlock detected")
        raise error

    monkeypatch.setattr(superseding, "apply", lost)
    with caplog.at_level("WARNING", logger="memories.services"):
        new = remember(cast.alice.id, AMBIGUOUS_NEW)

    assert new["deduped"] is False and "replaces" not in new
    assert [hint["id"] for hint in new["may_replace"]] == [old]  # the caller's to judge
    assert row(old).superseded_by is None
    assert "linking what the model decided failed" in caplog.text
    assert AMBIGUOUS_NEW not in caplog.text


def test_without_llm_mode_the_model_is_never_asked(cast, chat, settings) -> None:
    settings.RECALL_SUPERSESSION = "offline"
    chat.reply = '{"decisions": [{"n": 1, "verdict": "replace", "reason": "x"}]}'
    old = remember(cast.alice.id, AMBIGUOUS_OLD)["id"]
    remember(cast.alice.id, AMBIGUOUS_NEW)

    assert chat.requests == []
    assert row(old).superseded_by is None


def test_an_unsure_detector_names_the_likely_older_statement_for_the_caller_to_link(cast) -> None:
    old = remember(cast.alice.id, AMBIGUOUS_OLD)["id"]
    new = remember(cast.alice.id, AMBIGUOUS_NEW)

    # Kept: too little evidence to replace on its own, but named.
    assert "replaces" not in new
    assert new["may_replace"] == [{"id": old, "content": AMBIGUOUS_OLD}]
    assert row(old).superseded_by is None

    # The caller judges it the same fact: the same content, named, links it.
    again = remember(cast.alice.id, AMBIGUOUS_NEW, replaces=old)
    assert again == {"id": new["id"], "deduped": True, "replaces": [old]}
    assert row(old).superseded_by == uuid.UUID(new["id"])
    assert ids(recalled(cast.alice.id, query="What holidays does Jess like?")) == [new["id"]]


def test_a_slot_in_other_words_is_named_for_the_caller_to_link(cast) -> None:
    # No subject word in common, so never linked offline; but close, with an
    # address swapped for another: perhaps the same printer, renamed.
    old = remember(cast.alice.id, "The printer on floor two is at 192.168.3.9.")["id"]
    remember(cast.alice.id, "The team's standup is at 9:30.")
    new = remember(cast.alice.id, "Office HP LaserJet: 192.168.3.44.")

    assert "replaces" not in new
    assert [hint["id"] for hint in new["may_replace"]] == [old]
    assert row(old).superseded_by is None

    again = remember(cast.alice.id, "Office HP LaserJet: 192.168.3.44.", replaces=old)
    assert again["replaces"] == [old]
    assert row(old).superseded_by == uuid.UUID(new["id"])


def test_no_hint_for_a_look_alike_a_link_or_a_repeat(cast) -> None:
    remember(cast.alice.id, "My sister lives in Leeds.")
    look = remember(cast.alice.id, "My brother lives in York now.")
    old = remember(cast.alice.id, OLD)["id"]
    linked = remember(cast.alice.id, NEW)
    repeat = remember(cast.alice.id, AMBIGUOUS_OLD)
    repeated = remember(cast.alice.id, AMBIGUOUS_OLD)

    assert "may_replace" not in look  # sister / brother: two facts, surely
    assert linked["replaces"] == [old] and "may_replace" not in linked
    assert "may_replace" not in repeat and repeated["deduped"] and "may_replace" not in repeated


def test_detection_off_names_nothing(cast, settings) -> None:
    settings.RECALL_SUPERSESSION = "off"
    remember(cast.alice.id, AMBIGUOUS_OLD)
    assert "may_replace" not in remember(cast.alice.id, AMBIGUOUS_NEW)


def test_a_queued_write_keeps_no_hint_in_its_job(cast) -> None:
    remember(cast.alice.id, AMBIGUOUS_OLD)
    queued = remember(cast.alice.id, AMBIGUOUS_NEW, background=True)
    assert services.run_next_job()

    done = services.job_status(user_id=cast.alice.id, job_id=queued["job_id"])
    assert done["status"] == "done"
    # The job's result outlives the memories it names: ids only, no one's content.
    assert done["memories"] == [{"id": queued["memory_ids"][0], "deduped": False}]
    assert AMBIGUOUS_OLD not in str(done)


def test_what_a_deleted_memory_replaced_is_looked_up_by_an_index_of_its_own(cast) -> None:
    # The key's ON DELETE SET NULL looks rows up by superseded_by alone, which
    # (user_id, superseded_by) served only by being read whole: 7-8 ms a delete
    # at 500,000 memories.
    with tenancy.operator(), connection.cursor() as cursor:
        cursor.execute("SET enable_seqscan = off")
        try:
            cursor.execute(
                "EXPLAIN SELECT id FROM memories WHERE superseded_by = %s", [uuid.uuid4()]
            )
            plan = "\n".join(row[0] for row in cursor.fetchall())
        finally:
            cursor.execute("RESET enable_seqscan")
    assert "memories_replaced_by_idx" in plan, plan
