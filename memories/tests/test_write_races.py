"""Concurrent writes to one namespace on the real database: no call fails on a deadlock.

Every statement that writes memories also updates the namespace's search
statistics (migration 0006), after the memory rows it takes. Two shapes of
write used to take them the other way round, a deadlock (40P01) that
PostgreSQL settles by failing one call with ``internal_error``, as the soak
met once on a ``forget``:

* a write that replaces an older memory stored the new one (statistics) and
  then linked the older one (its row), while a ``forget`` or
  ``update_memory`` of the older memory takes its row, then the statistics;
* a conversation stored its messages one statement each, so it took the
  statistics again after another writer had started taking them.

Each test holds the first call at that point until the second is waiting on
a lock, then lets it go: both calls must finish, and the links stay whole.

The same order binds the writes that take many rows: ``recall import``
restoring links, a bulk delete (forget's confirm, ``forget_namespace``) and
the expiry purge. The first two lock their rows by id before writing; the
purge passes over a row a live write holds.
"""

from __future__ import annotations

import contextlib
import threading
import uuid
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection, connections, transaction
from django.utils import timezone

from accounts.models import User
from accounts.tiers import Tier
from core import tenancy
from memories import services
from memories.models import Memory, MemoryHistory
from memories.services import storing, transfer
from memories.validation import content_hash

OLD = "Staging Postgres runs on pg-staging-3."
NEW = "Staging Postgres was migrated to pg-staging-7 last week."
WIFI = "The office wifi password is harbour-lights-42."
# This test's connection taking a memory's row as a writer of it would.
HOLD = "SELECT id FROM memories WHERE id = %s FOR NO KEY UPDATE"
# How long a helper thread may take before the test gives up on it: a guard
# against a hang, never a measure of speed.
PATIENCE = 60.0


def remember(user_id: Any, content: str, **kwargs: Any) -> dict[str, Any]:
    return dict(services.remember(user_id=user_id, tier=Tier.PRO, content=content, **kwargs))


def backend_pid() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        return int(cursor.fetchone()[0])


def waits_for(pid: int, holder: int) -> bool:
    """Whether backend ``pid`` is waiting on a lock that backend ``holder`` holds."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT %s = ANY(pg_blocking_pids(%s))", [holder, pid])
        return bool(cursor.fetchone()[0])


class Background(threading.Thread):
    """One call on a thread of its own, with its own connection: its backend
    pid once it runs, then its result or the error it met."""

    def __init__(self, call: Callable[[], Any]) -> None:
        super().__init__()
        self.call = call
        self.pid: int | None = None
        self.result: Any = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.pid = backend_pid()
            self.result = self.call()
        except BaseException as exc:  # surfaced by outcome()
            self.error = exc
        finally:
            connections.close_all()

    def until_waiting(self) -> None:
        """Return once the call waits on a lock this test's connection holds, or has ended."""
        for _ in range(int(PATIENCE / 0.05)):
            if not self.is_alive() or (self.pid and waits_for(self.pid, backend_pid())):
                return
            threading.Event().wait(0.05)

    def outcome(self) -> Any:
        """The call's result, once it has finished; its error, raised."""
        self.join(PATIENCE)
        assert not self.is_alive(), "the call never finished"
        if self.error is not None:
            raise self.error
        return self.result


class Paused:
    """Hold a remember between storing its memory and linking what it replaces."""

    def __init__(self) -> None:
        self.inserted = threading.Event()
        self.resume = threading.Event()
        self.pid = 0
        self._original = storing._insert_new

    def __call__(self, *args: Any, **kwargs: Any) -> uuid.UUID:
        found = self._original(*args, **kwargs)
        self.pid = backend_pid()
        self.inserted.set()
        assert self.resume.wait(PATIENCE), "the test never let the write go on"
        return found


def race(
    monkeypatch: pytest.MonkeyPatch, write: Callable[[], Any], other: Callable[[], Any]
) -> tuple[Any, Any]:
    """Run ``write`` (a replacing remember) and ``other`` in the interleaving above.

    Returns both results; re-raises the first error either thread met.
    """
    paused = Paused()
    monkeypatch.setattr(storing, "_insert_new", paused)
    results: dict[str, Any] = {}
    errors: list[BaseException] = []
    other_pid: list[int] = []

    def run(name: str, call: Callable[[], Any]) -> None:
        try:
            if name == "other":
                other_pid.append(backend_pid())
            results[name] = call()
        except BaseException as exc:  # surfaced below
            errors.append(exc)
            paused.resume.set()
        finally:
            connections.close_all()

    writer = threading.Thread(target=run, args=("write", write))
    writer.start()
    assert paused.inserted.wait(PATIENCE), "the replacing write never stored its memory"
    contender = threading.Thread(target=run, args=("other", other))
    contender.start()
    # The other call is blocked by the paused write: it holds a lock it needs.
    for _ in range(int(PATIENCE / 0.05)):
        if errors or (other_pid and waits_for(other_pid[0], paused.pid)):
            break
        threading.Event().wait(0.05)
    paused.resume.set()
    writer.join(PATIENCE)
    contender.join(PATIENCE)
    assert not writer.is_alive() and not contender.is_alive(), "a call never finished"
    if errors:
        raise errors[0]
    return results["write"], results["other"]


def dangling_links(user_id: Any) -> list[uuid.UUID]:
    """Memories whose superseded_by names no memory, or that are replaced only half."""
    with tenancy.operator():
        ids = set(Memory.objects.filter(user_id=user_id).values_list("id", flat=True))
        rows = Memory.objects.filter(user_id=user_id).values_list(
            "id", "superseded_by", "superseded_at"
        )
        return [
            i
            for i, by, at in rows
            if (by is None) != (at is None) or (by is not None and by not in ids)
        ]


def actions(memory_id: str) -> list[str]:
    with tenancy.operator():
        return list(
            MemoryHistory.objects.filter(memory_id=memory_id)
            .order_by("version")
            .values_list("action", flat=True)
        )


@pytest.mark.django_db(transaction=True)
def test_forgetting_a_memory_while_a_write_replaces_it_answers_both(cast, monkeypatch) -> None:
    old = remember(cast.alice.id, OLD)["id"]

    written, forgotten = race(
        monkeypatch,
        lambda: remember(cast.alice.id, NEW),
        lambda: services.forget(user_id=cast.alice.id, mode="by_id", id=old),
    )

    assert forgotten == {"success": True}
    # The write linked the old memory first; the forget then deleted it.
    assert written["replaces"] == [old]
    with tenancy.operator():
        assert not Memory.objects.filter(id=old).exists()
        current = Memory.objects.get(id=written["id"])
    assert current.superseded_by is None
    assert actions(old) == ["created", "superseded", "deleted"]
    assert dangling_links(cast.alice.id) == []


@pytest.mark.django_db(transaction=True)
def test_updating_a_memory_while_a_write_replaces_it_answers_both(cast, monkeypatch) -> None:
    old = remember(cast.alice.id, OLD)["id"]

    written, updated = race(
        monkeypatch,
        lambda: remember(cast.alice.id, NEW),
        lambda: services.update_memory(user_id=cast.alice.id, id=old, metadata={"host": "3"}),
    )

    assert updated == {"success": True}
    assert written["replaces"] == [old]
    with tenancy.operator():
        older = Memory.objects.get(id=old)
    assert str(older.superseded_by) == written["id"]
    assert older.metadata == {"host": "3"}
    assert actions(old) == ["created", "superseded", "updated"]
    assert dangling_links(cast.alice.id) == []


@pytest.mark.django_db(transaction=True)
def test_forgetting_a_named_replacement_target_while_it_is_linked_answers_both(
    cast, monkeypatch
) -> None:
    old = remember(cast.alice.id, "The office wifi password is tulip-42.")["id"]

    written, forgotten = race(
        monkeypatch,
        lambda: remember(cast.alice.id, "New office wifi password: orchid-77.", replaces=old),
        lambda: services.forget(user_id=cast.alice.id, mode="by_id", id=old),
    )

    assert forgotten == {"success": True}
    assert written["replaces"] == [old]
    with tenancy.operator():
        assert not Memory.objects.filter(id=old).exists()
    assert dangling_links(cast.alice.id) == []


class PausedAfterInsert:
    """Hold the thread that runs it after its first INSERT INTO memories (a Django execute
    wrapper, so it holds whatever code issues the statement)."""

    def __init__(self) -> None:
        self.inserted = threading.Event()
        self.resume = threading.Event()
        self.pid = 0

    def __call__(
        self, execute: Callable[..., Any], sql: str, params: Any, many: bool, context: Any
    ) -> Any:
        done = execute(sql, params, many, context)
        if sql.startswith("INSERT INTO memories") and not self.inserted.is_set():
            with context["connection"].cursor() as cursor:
                cursor.execute("SELECT pg_backend_pid()")
                self.pid = int(cursor.fetchone()[0])
            self.inserted.set()
            assert self.resume.wait(PATIENCE), "the test never let the write go on"
        return done


TURNS = [{"role": "user", "content": "zulu zulu"}, {"role": "user", "content": "alpha alpha"}]


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("other", ["forget", "remember"])
def test_a_conversation_and_another_write_to_its_namespace_both_finish(cast, other) -> None:
    # Word order matters: the conversation's first message takes "zulu", the
    # other call takes "alpha" and then waits for "zulu", and the
    # conversation's second message needs "alpha".
    present = remember(cast.alice.id, "alpha zulu")["id"]
    paused = PausedAfterInsert()
    results: dict[str, Any] = {}
    errors: list[BaseException] = []
    other_pid: list[int] = []

    def converse() -> None:
        try:
            with connection.execute_wrapper(paused):
                results["conversation"] = services.remember(
                    user_id=cast.alice.id, tier=Tier.PRO, messages=TURNS
                )
        except BaseException as exc:  # surfaced below
            errors.append(exc)
            paused.inserted.set()
        finally:
            connections.close_all()

    def write() -> None:
        try:
            other_pid.append(backend_pid())
            if other == "forget":
                results[other] = services.forget(user_id=cast.alice.id, mode="by_id", id=present)
            else:
                results[other] = remember(cast.alice.id, "alpha and zulu, again")
        except BaseException as exc:  # surfaced below
            errors.append(exc)
        finally:
            connections.close_all()

    first = threading.Thread(target=converse)
    first.start()
    assert paused.inserted.wait(PATIENCE), "the conversation never stored a message"
    second = threading.Thread(target=write)
    second.start()
    for _ in range(int(PATIENCE / 0.05)):
        if errors or (other_pid and waits_for(other_pid[0], paused.pid)):
            break
        threading.Event().wait(0.05)
    paused.resume.set()
    first.join(PATIENCE)
    second.join(PATIENCE)
    assert not first.is_alive() and not second.is_alive(), "a call never finished"

    assert errors == []
    assert results["conversation"]["count"] == 2
    assert all(not m["deduped"] for m in results["conversation"]["memories"])
    with tenancy.operator():
        stored = set(Memory.objects.filter(user_id=cast.alice.id).values_list("content", flat=True))
    expected = {"zulu zulu", "alpha alpha"}
    if other == "forget":
        assert results[other] == {"success": True}
        assert stored == expected
    else:
        assert not results[other]["deduped"]
        assert stored == expected | {"alpha zulu", "alpha and zulu, again"}


@pytest.mark.django_db(transaction=True)
def test_an_import_restoring_links_and_a_live_write_to_a_linked_memory_both_finish(
    cast, monkeypatch
) -> None:
    # The import links its memories in one transaction. A live writer holds
    # the second link's older memory, then writes another memory of the
    # namespace (its generation and statistics). Linking row by row took the
    # generation with the first link and then waited for that row: a deadlock.
    first = remember(cast.alice.id, OLD)["id"]
    remember(cast.alice.id, NEW, replaces=first)
    second = remember(cast.alice.id, WIFI)["id"]
    remember(cast.alice.id, "New office wifi password: copper-kettle-17.", replaces=second)
    remember(cast.alice.id, "The dentist is Dr. Okafor on Mill Lane.")
    records = list(services.export_memories(user_id=cast.alice.id))

    original = transfer._import_links
    ready, go = threading.Event(), threading.Event()

    def paused(*args: Any) -> None:
        ready.set()
        assert go.wait(PATIENCE), "the test never let the import go on"
        original(*args)

    monkeypatch.setattr(transfer, "_import_links", paused)

    def run() -> Any:
        try:
            return services.import_memories(user_id=cast.charlie.id, records=records)
        finally:
            ready.set()  # also when it failed before its links

    importer = Background(run)
    importer.start()
    assert ready.wait(PATIENCE), "the import never came to its links"
    assert importer.error is None, importer.error
    with tenancy.operator():
        held = Memory.objects.get(user_id=cast.charlie.id, content__startswith="The office wifi").id
        other = Memory.objects.get(user_id=cast.charlie.id, content__startswith="The dentist").id
    with tenancy.tenant(cast.charlie.id), connection.cursor() as cursor:
        cursor.execute(HOLD, [held])
        go.set()
        importer.until_waiting()
        cursor.execute("UPDATE memories SET priority = 'high' WHERE id = %s", [other])
    report = importer.outcome()

    assert (report.linked, report.unlinked) == (2, 0)
    with tenancy.operator():
        linked = Memory.objects.filter(user_id=cast.charlie.id, superseded_by__isnull=False)
        assert sorted(m.content for m in linked) == sorted([OLD, WIFI])
        assert Memory.objects.get(id=other).priority == "high"
    assert dangling_links(cast.charlie.id) == []


@pytest.mark.django_db(transaction=True)
def test_an_import_drops_a_link_whose_memory_was_forgotten_before_it_linked(
    cast, monkeypatch
) -> None:
    first = remember(cast.alice.id, OLD)["id"]
    remember(cast.alice.id, NEW, replaces=first)
    records = list(services.export_memories(user_id=cast.alice.id))
    original = transfer._import_links

    def forget_first(user_id: Any, *args: Any) -> None:
        # A live forget of the replacing memory, between storing and linking.
        with tenancy.operator():
            gone = Memory.objects.get(user_id=user_id, content=NEW).id
        services.forget(user_id=user_id, mode="by_id", id=str(gone))
        original(user_id, *args)

    monkeypatch.setattr(transfer, "_import_links", forget_first)

    report = services.import_memories(user_id=cast.charlie.id, records=records)

    assert (report.imported, report.linked, report.unlinked) == (2, 0, 1)
    with tenancy.operator():
        kept = Memory.objects.get(user_id=cast.charlie.id)
    assert (kept.content, kept.superseded_by) == (OLD, None)


# Two ids at the ends of the order, so that the first stored is the last by id.
HIGH = uuid.UUID("ffffffff-ffff-4fff-bfff-ffffffffffff")
LOW = uuid.UUID("00000000-0000-4000-8000-000000000000")
MID = uuid.UUID("80000000-0000-4000-8000-000000000000")


@pytest.mark.django_db(transaction=True)
def test_forgetting_a_namespace_while_a_write_holds_two_of_its_memories_answers_both(cast) -> None:
    # A write that replaces two memories locks them by id (superseding.lock).
    # Deleting a namespace took its rows in the order it found them, here the
    # one stored first, the higher id: each then waited for the other.
    # HIGH goes to the text found first, by storage and by the namespace's
    # index (content hash order).
    texts = sorted([OLD, WIFI], key=content_hash)
    with ids_in_turn(HIGH, LOW):
        for text in texts:
            remember(cast.alice.id, text)
    done = crossing(
        cast.alice.id,
        lambda: services.forget_namespace(user_id=cast.alice.id, namespace="default"),
        LOW,
        HOLD,
        HIGH,
    )
    assert done["deleted_count"] == 2


def expire(memory_id: Any) -> Any:
    """Make a memory expired, not yet purged: it still holds its place. Returns its id."""
    with tenancy.operator(), connection.cursor() as cursor:
        cursor.execute(
            "UPDATE memories SET expires_at = now() - interval '1 s' WHERE id = %s", [memory_id]
        )
    return memory_id


@contextlib.contextmanager
def ids_in_turn(*chosen: uuid.UUID) -> Any:
    """The memories stored in the block get ``chosen`` ids, in turn: a test's rows in an order."""
    ids = iter(chosen)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(storing.uuid, "uuid4", lambda: next(ids))
        yield


def crossing(user_id: Any, call: Callable[[], Any], held: Any, then: str, row: Any) -> Any:
    """Run ``call`` while this test's connection holds memory ``held`` as a writer of
    two rows would; once the call waits for it, run ``then`` on ``row`` (the second
    row this connection takes) and commit. Returns the call's outcome."""
    background = Background(call)
    with tenancy.tenant(user_id), connection.cursor() as cursor:
        cursor.execute(HOLD, [held])
        background.start()
        background.until_waiting()
        cursor.execute(then, [row])
    return background.outcome()


def purge_while_held(user_id: Any, held: str, later: Any) -> tuple[bool, Any]:
    """Run the expiry purge (as at ``later``) while this test's connection holds the
    memory ``held`` as a live write would; whether the purge waited, and its outcome."""
    purge = Background(lambda: services.clean_up(now=later))
    with tenancy.tenant(user_id), connection.cursor() as cursor:
        cursor.execute(HOLD, [held])
        purge.start()
        purge.until_waiting()
        waited = purge.is_alive()
    return waited, purge.outcome()


@pytest.mark.django_db(transaction=True)
def test_the_expiry_purge_passes_over_a_memory_a_live_write_holds(cast) -> None:
    # The purge spans every user's namespaces: waiting on a live write's row
    # would put it in that write's lock order. It leaves the row for its next run.
    held = remember(cast.alice.id, OLD, ttl_seconds=60)["id"]
    remember(cast.alice.id, WIFI, ttl_seconds=60)
    later = timezone.now() + timedelta(minutes=2)
    waited, done = purge_while_held(cast.alice.id, held, later)

    assert not waited, "the purge waited for a row a live write holds"
    assert done.expired_memories == 1
    with tenancy.operator():
        assert [str(i) for i in Memory.objects.values_list("id", flat=True)] == [held]
    again = services.clean_up(now=later)
    assert again is not None and again.expired_memories == 1


@pytest.mark.django_db(transaction=True)
def test_the_expiry_purge_passes_over_an_expired_memory_whose_replaced_one_a_write_holds(
    cast,
) -> None:
    # Deleting the expired memory clears the link of the one it replaced
    # (the key's cascade), which a restatement holding that pair has locked:
    # the purge waited there, inside a lock order of its own.
    old = remember(cast.alice.id, OLD)["id"]
    expiring = remember(cast.alice.id, NEW, replaces=old, ttl_seconds=60)["id"]
    later = timezone.now() + timedelta(minutes=2)
    waited, done = purge_while_held(cast.alice.id, old, later)

    assert not waited, "the purge waited for a replaced memory a live write holds"
    assert done.expired_memories == 0
    with tenancy.operator():
        assert Memory.objects.filter(id=expiring).exists()
    again = services.clean_up(now=later)
    assert again is not None and again.expired_memories == 1
    with tenancy.operator():
        assert [str(i) for i in Memory.objects.values_list("id", flat=True)] == [old]
        assert Memory.objects.get(id=old).superseded_by is None
    assert dangling_links(cast.alice.id) == []


@pytest.mark.django_db(transaction=True)
def test_the_expiry_purge_keeps_a_chains_middle_while_a_live_write_holds_its_end(cast) -> None:
    # A -> B -> C, B expired: A passes on to C, which the purge must lock. Held
    # by a live write, the purge leaves B for its next run rather than wait, or
    # free A beside C by deleting B alone.
    first = remember(cast.alice.id, OLD)["id"]
    middle = remember(cast.alice.id, NEW, replaces=first, ttl_seconds=60)["id"]
    last = remember(cast.alice.id, "Staging Postgres moved to pg-staging-9.", replaces=middle)
    later = timezone.now() + timedelta(minutes=2)
    waited, done = purge_while_held(cast.alice.id, last["id"], later)

    assert not waited, "the purge waited for the end of a chain a live write holds"
    assert done.expired_memories == 0
    with tenancy.operator():
        assert Memory.objects.get(id=first).superseded_by == uuid.UUID(middle)
    again = services.clean_up(now=later)
    assert again is not None and again.expired_memories == 1
    with tenancy.operator():
        assert Memory.objects.get(id=first).superseded_by == uuid.UUID(last["id"])
    assert dangling_links(cast.alice.id) == []


def writing_both(user: Any, x1: Any, x2: Any, other: Background) -> None:
    """Write x1 (namespace n1) and then x2 (n2) in one transaction, as a live writer of
    both would, starting ``other`` between the two once it waits on n1's generation."""
    with tenancy.tenant(user), connection.cursor() as cursor:
        cursor.execute(
            "SELECT id FROM memories WHERE id = ANY(%s::uuid[]) ORDER BY id FOR NO KEY UPDATE",
            [[x1, x2]],
        )
        cursor.execute("UPDATE memories SET priority = priority WHERE id = %s", [x1])
        other.start()
        other.until_waiting()  # on n1's generation
        cursor.execute("UPDATE memories SET priority = priority WHERE id = %s", [x2])


@pytest.mark.django_db(transaction=True)
def test_the_expiry_purge_takes_namespaces_in_order_so_a_writer_of_two_goes_on(cast) -> None:
    # Each statement that writes memories takes its namespace's generation. The
    # purge passed a chain on in n2, then deleted in n1, while a writer of one
    # memory in each held n1's and wanted n2's: a deadlock, one of them failed.
    user = cast.alice.id
    first = remember(user, "The queue broker is rabbit-1.", namespace="n2")["id"]
    middle = remember(user, "The queue broker moved to rabbit-2.", namespace="n2", replaces=first)
    last = remember(
        user, "The queue broker is now rabbit-3.", namespace="n2", replaces=middle["id"]
    )
    expire(middle["id"])
    expire(remember(user, "Temporary note: the printer is jammed.", namespace="n1")["id"])
    x1 = remember(user, "Lunch is at noon.", namespace="n1")["id"]
    x2 = remember(user, "The wiki lives at wiki.corp.", namespace="n2")["id"]
    purge = Background(lambda: services.clean_up(now=timezone.now() + timedelta(seconds=5)))
    writing_both(user, x1, x2, purge)

    assert purge.outcome().expired_memories == 2
    with tenancy.operator():
        assert Memory.objects.get(id=first).superseded_by == uuid.UUID(last["id"])
    assert dangling_links(user) == []


@pytest.mark.django_db(transaction=True)
def test_an_import_and_a_live_write_of_the_same_content_keep_one_memory(cast, monkeypatch) -> None:
    # The live write has stored the memory but not committed: the import
    # does not see it, and its insert waits on the dedup index. Once the
    # write commits, the import's insert conflicts; it must count a repeat,
    # not fail the batch.
    remember(cast.alice.id, OLD)
    remember(cast.alice.id, "The dentist is Dr. Okafor on Mill Lane.")
    records = list(services.export_memories(user_id=cast.alice.id))

    written, report = race(
        monkeypatch,
        lambda: remember(cast.charlie.id, OLD),
        lambda: services.import_memories(user_id=cast.charlie.id, records=records),
    )

    assert not written["deduped"]
    assert (report.imported, report.deduplicated) == (1, 1)
    with tenancy.operator():
        rows = Memory.objects.filter(user_id=cast.charlie.id)
        assert sorted(m.content for m in rows) == sorted(
            [OLD, "The dentist is Dr. Okafor on Mill Lane."]
        )
        assert rows.get(content=OLD).id == uuid.UUID(written["id"])
        # No history is left behind for the record that was not stored.
        histories = set(
            MemoryHistory.objects.filter(user_id=cast.charlie.id).values_list(
                "memory_id", flat=True
            )
        )
    assert histories == {m.id for m in rows}


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("how", ["by_id", "namespace"])
def test_forgetting_a_replacing_memory_while_a_write_holds_the_pair_answers_both(cast, how) -> None:
    # A restatement (or a link) locks the replaced memory and the one that
    # replaced it, in id order. Deleting the replacing memory also clears the
    # older one's link (the key's cascade): a delete that took its own row
    # first and the older one in the cascade waited on the write while the
    # write waited on it. LOW is the older memory, so the write takes it first.
    with ids_in_turn(LOW, HIGH):
        remember(cast.alice.id, OLD)
        remember(cast.alice.id, NEW, replaces=str(LOW))

    def call() -> Any:
        if how == "by_id":
            return services.forget(user_id=cast.alice.id, mode="by_id", id=str(HIGH))
        return services.forget_namespace(user_id=cast.alice.id, namespace="default")

    done = crossing(cast.alice.id, call, LOW, HOLD, HIGH)

    if how == "by_id":
        assert done == {"success": True}
        with tenancy.operator():
            older = Memory.objects.get(id=LOW)
        assert (older.superseded_by, older.superseded_at) == (None, None)
        assert actions(str(LOW)) == ["created", "superseded", "restored"]
    else:
        assert done["deleted_count"] == 2
    assert dangling_links(cast.alice.id) == []


@pytest.mark.django_db(transaction=True)
def test_a_fact_stated_again_naming_a_replacement_and_an_update_of_it_both_finish(cast) -> None:
    # Stated again, the memory is made current (an update: the namespace's
    # generation) and the memory named in ``replaces`` was locked after it;
    # an update of that memory holds its row and then needs the generation.
    old = remember(cast.alice.id, OLD)["id"]
    new = remember(cast.alice.id, NEW, replaces=old)["id"]
    named = remember(cast.alice.id, WIFI)["id"]
    done = crossing(
        cast.alice.id,
        lambda: remember(cast.alice.id, OLD, replaces=named),
        named,
        "UPDATE memories SET priority = 'high' WHERE id = %s",
        named,
    )

    assert done["id"] == old and sorted(done["replaces"]) == sorted([named, new])
    with tenancy.operator():
        assert Memory.objects.get(id=old).superseded_by is None
        assert str(Memory.objects.get(id=named).superseded_by) == old
        assert Memory.objects.get(id=named).priority == "high"
    assert dangling_links(cast.alice.id) == []


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("found", ["at its first look", "only at its insert"])
def test_a_current_fact_stated_again_naming_a_replacement_locks_both_in_id_order(
    cast, monkeypatch, found
) -> None:
    # Content already stored (LOW), and current, named as the replacement
    # of another memory (HIGH). The write locked HIGH, and then LOW when it
    # recorded the link on it: out of id order, and after a write. A writer
    # of both in id order (a delete, a link) holding LOW and asking for HIGH
    # closed a cycle, and PostgreSQL failed one of them. When another call
    # stores the content after the write's first look (here: that look
    # finds nothing), the insert found LOW and linked to it unlocked; the
    # write now starts again and finds it. Two unrelated facts, so that
    # detection links neither to the other.
    with ids_in_turn(LOW, HIGH):
        remember(cast.alice.id, OLD)
        remember(cast.alice.id, WIFI)
    if found == "only at its insert":
        looks = iter([False])
        real = storing._held_by_place
        monkeypatch.setattr(
            storing, "_held_by_place", lambda *a: real(*a) if next(looks, True) else {}
        )
    done = crossing(
        cast.alice.id, lambda: remember(cast.alice.id, OLD, replaces=str(HIGH)), LOW, HOLD, HIGH
    )

    assert done == {"id": str(LOW), "deduped": True, "replaces": [str(HIGH)]}
    with tenancy.operator():
        assert Memory.objects.get(id=HIGH).superseded_by == LOW
    assert actions(str(HIGH)) == ["created", "superseded"]
    assert dangling_links(cast.alice.id) == []


@pytest.mark.django_db(transaction=True)
def test_deleting_an_agent_while_a_write_holds_two_of_its_memories_answers_both(
    cast, agents
) -> None:
    # The agent's memories went with it through the foreign key's cascade,
    # in the order the scan met them (HIGH first), not by id.
    from accounts import services as accounts

    with ids_in_turn(HIGH, LOW):
        agent = agents.research.id
        for text in sorted([OLD, WIFI], key=content_hash):
            remember(cast.alice.id, text, agent_id=agent)
    crossing(
        cast.alice.id,
        lambda: accounts.delete_agent(user_id=cast.alice.id, agent_id=agent),
        LOW,
        HOLD,
        HIGH,
    )
    with tenancy.operator():
        assert not Memory.objects.filter(agent_id=agent).exists()


USERS = "/admin/accounts/user/"


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("bulk", [False, True], ids=["delete page", "delete_selected action"])
def test_deleting_a_user_in_the_admin_while_a_write_holds_two_of_their_memories_answers_both(
    cast, admin_client, bulk
) -> None:
    # Django's collector deleted the user's memories in the order its scan
    # met them (HIGH first), not by id: the admin's delete held HIGH and
    # waited for LOW while the write held LOW and asked for HIGH.
    with ids_in_turn(HIGH, LOW):
        for text in sorted([OLD, WIFI], key=content_hash):
            remember(cast.alice.id, text)
    action = {"action": "delete_selected", "_selected_action": [cast.alice.id], "post": "yes"}
    deletion = (USERS, action) if bulk else (f"{USERS}{cast.alice.id}/delete/", {"post": "yes"})
    response = crossing(
        cast.alice.id,
        lambda: admin_client.post(*deletion),
        LOW,
        HOLD,
        HIGH,
    )
    assert response.status_code == 302
    with tenancy.operator():
        assert not Memory.objects.filter(user_id=cast.alice.id).exists()
        assert not User.objects.filter(id=cast.alice.id).exists()


@pytest.mark.django_db(transaction=True)
def test_an_edit_to_an_expired_copys_content_and_another_edit_of_the_memory_both_finish(
    cast, monkeypatch
) -> None:
    # The edit's first update fails on the dedup index (an expired copy
    # holds the content's place), and rolling it back released the memory's
    # row. The copy's delete then took the namespace's generation, and the
    # update again needed the row, which the other edit had taken meanwhile
    # and held while it waited for the generation.
    from memories.services import changes

    target = remember(cast.alice.id, NEW)["id"]
    expired = expire(remember(cast.alice.id, WIFI, ttl_seconds=60)["id"])
    dropped, resume = threading.Event(), threading.Event()
    pids: list[int] = []
    real = changes.drop_expired_copy

    def pausing(*args: Any) -> None:
        real(*args)
        pids.append(backend_pid())
        dropped.set()
        assert resume.wait(PATIENCE), "the test never let the edit go on"

    monkeypatch.setattr(changes, "drop_expired_copy", pausing)
    edit = Background(
        lambda: services.update_memory(user_id=cast.alice.id, id=target, content=WIFI)
    )
    other = Background(
        lambda: services.update_memory(user_id=cast.alice.id, id=target, priority="high")
    )
    edit.start()
    assert dropped.wait(PATIENCE), "the edit never dropped the expired copy"
    other.start()
    for _ in range(int(PATIENCE / 0.05)):
        if not other.is_alive() or (other.pid and waits_for(other.pid, pids[0])):
            break
        threading.Event().wait(0.05)
    resume.set()

    assert edit.outcome() == {"success": True}
    assert other.outcome() == {"success": True}
    with tenancy.operator():
        memory = Memory.objects.get(id=target)
        assert (memory.content, memory.priority) == (WIFI, "high")
        assert not Memory.objects.filter(id=expired).exists()


@pytest.mark.django_db(transaction=True)
def test_a_write_whose_place_an_expired_copy_holds_takes_no_row_after_its_named_one(cast) -> None:
    # The write locked the memory it names (HIGH), and its insert then met
    # the expired copy (LOW) and deleted it in the same transaction: a row
    # taken after another, out of id order. The copy now goes first, in a
    # transaction of its own, and the write starts again.
    with ids_in_turn(LOW, HIGH):
        expire(remember(cast.alice.id, OLD, ttl_seconds=60)["id"])
        remember(cast.alice.id, WIFI)

    done = crossing(
        cast.alice.id, lambda: remember(cast.alice.id, OLD, replaces=str(HIGH)), LOW, HOLD, HIGH
    )

    assert not done["deduped"] and done["replaces"] == [str(HIGH)]
    with tenancy.operator():
        assert not Memory.objects.filter(id=LOW).exists()
        assert str(Memory.objects.get(id=HIGH).superseded_by) == done["id"]


@pytest.mark.django_db(transaction=True)
def test_an_edit_to_an_expired_copys_content_and_a_delete_of_both_both_finish(
    cast, monkeypatch
) -> None:
    # The edit locked its memory (HIGH) and then, in a statement of its own,
    # the expired copy (LOW) it deletes: out of id order, against a delete
    # of the namespace that takes both by id.
    from core.errors import NotFound
    from memories.services import changes

    with ids_in_turn(LOW, HIGH):
        expire(remember(cast.alice.id, WIFI, ttl_seconds=60)["id"])
        target = remember(cast.alice.id, NEW)["id"]
    reached, resume = threading.Event(), threading.Event()
    pids: list[int] = []
    real = changes.drop_expired_copy

    def pausing(*args: Any) -> None:
        pids.append(backend_pid())
        reached.set()
        assert resume.wait(PATIENCE), "the test never let the edit go on"
        real(*args)

    monkeypatch.setattr(changes, "drop_expired_copy", pausing)
    edit = Background(
        lambda: services.update_memory(user_id=cast.alice.id, id=target, content=WIFI)
    )
    deleter = Background(
        lambda: services.forget_namespace(user_id=cast.alice.id, namespace="default")
    )
    edit.start()
    assert reached.wait(PATIENCE), "the edit never came to the expired copy"
    deleter.start()
    for _ in range(int(PATIENCE / 0.05)):
        if not deleter.is_alive() or (deleter.pid and waits_for(deleter.pid, pids[0])):
            break
        threading.Event().wait(0.05)
    resume.set()

    # Both go; only the memory that had not expired is counted.
    assert deleter.outcome()["deleted_count"] == 1
    with pytest.raises(NotFound):
        edit.outcome()
    with tenancy.operator():
        assert not Memory.objects.filter(user_id=cast.alice.id).exists()


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("expired_copy", [False, True])
def test_a_live_write_of_a_later_record_while_an_import_batch_runs_keeps_one_memory(
    cast, monkeypatch, expired_copy
) -> None:
    # The batch inserted its records one statement each: after the first it
    # held the namespace's generation, and a live write of the second
    # record's content (its row stored, waiting for the generation) then
    # held the place the batch's next insert waited on. Deleting an expired
    # copy of a record's content in the batch's transaction did the same.
    from memories.services import transfer

    dentist = "The dentist is Dr. Okafor on Mill Lane."
    remember(cast.alice.id, OLD)
    remember(cast.alice.id, dentist)
    records = list(services.export_memories(user_id=cast.alice.id))
    second = str(records[1]["content"])
    if expired_copy:
        expire(remember(cast.charlie.id, str(records[0]["content"]), ttl_seconds=60)["id"])
    looked, resume = threading.Event(), threading.Event()
    pids: list[int] = []
    real = transfer.holder

    def pausing(place: Any, digest: str) -> Any:
        if digest == content_hash(second) and not looked.is_set():
            pids.append(backend_pid())
            looked.set()
            assert resume.wait(PATIENCE), "the test never let the import go on"
        return real(place, digest)

    monkeypatch.setattr(transfer, "holder", pausing)
    importer = Background(
        lambda: services.import_memories(user_id=cast.charlie.id, records=records)
    )
    importer.start()
    assert looked.wait(PATIENCE), "the import never came to its second record"
    live = Background(lambda: remember(cast.charlie.id, second))
    live.start()
    for _ in range(int(PATIENCE / 0.05)):
        if not live.is_alive() or (live.pid and waits_for(live.pid, pids[0])):
            break
        threading.Event().wait(0.05)
    resume.set()

    assert not live.outcome()["deduped"]
    report = importer.outcome()
    assert (report.imported, report.deduplicated) == (1, 1)
    with tenancy.operator():
        contents = Memory.objects.filter(user_id=cast.charlie.id).values_list("content", flat=True)
        assert sorted(contents) == sorted([OLD, dentist])


@pytest.mark.django_db(transaction=True)
def test_a_fact_stated_again_while_its_chain_moves_on_takes_no_row_late(cast) -> None:
    # "pg-3" (MID), replaced by "pg-7" (HIGH), stated again: the write locks
    # MID and HIGH, the chain's end. Meanwhile another write makes LOW
    # replace HIGH. The write walked the chain again and locked LOW in a
    # second statement, after MID: a writer of LOW and MID in id order,
    # holding LOW, then waited on it while it waited on LOW.
    from memories.services import superseding

    with ids_in_turn(MID, HIGH, LOW):
        remember(cast.alice.id, OLD)
        remember(cast.alice.id, NEW, replaces=str(MID))
        remember(cast.alice.id, WIFI)
    has_low = threading.Event()

    def other_write() -> None:
        with tenancy.tenant(cast.alice.id), connection.cursor() as cursor:
            cursor.execute(HOLD, [LOW])
            has_low.set()
            cursor.execute(HOLD, [MID])

    writer = Background(lambda: remember(cast.alice.id, OLD))
    other = Background(other_write)
    with tenancy.tenant(cast.alice.id), connection.cursor() as cursor:
        cursor.execute(HOLD, [HIGH])
        writer.start()
        writer.until_waiting()
        # LOW replaces HIGH; LOW's own row is left alone (no version of its own).
        superseding.apply(
            cast.alice.id,
            LOW,
            [superseding.Link(HIGH, {"decided_by": "explicit"})],
            stored_before=False,
        )
        other.start()
        assert has_low.wait(PATIENCE), "the other write never took its first row"
        for _ in range(int(PATIENCE / 0.05)):
            if not other.is_alive() or (writer.pid and waits_for(other.pid or 0, writer.pid)):
                break
            threading.Event().wait(0.05)
    done = writer.outcome()
    other.outcome()

    assert done == {"id": str(MID), "deduped": True, "replaces": [str(LOW)]}
    with tenancy.operator():
        assert Memory.objects.get(id=MID).superseded_by is None
        assert Memory.objects.get(id=LOW).superseded_by == MID
        assert Memory.objects.get(id=HIGH).superseded_by == LOW
    assert dangling_links(cast.alice.id) == []


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("meanwhile", ["restored", "forgotten"])
def test_an_undo_waits_for_a_concurrent_undo_or_forget_and_reports_what_it_found(
    cast, meanwhile
) -> None:
    # Read without a lock, two undos of one replacement both reported
    # success, and an undo of a memory forgotten meanwhile met no row to
    # update: a TypeError, ``internal_error`` to the caller. The undo now
    # locks the memory first and answers from what the other call left.
    from core.errors import Conflict, NotFound

    old = remember(cast.alice.id, OLD)["id"]
    remember(cast.alice.id, NEW, replaces=old)
    undo = Background(lambda: services.restore(user_id=cast.alice.id, id=old))
    with tenancy.tenant(cast.alice.id), connection.cursor() as cursor:
        if meanwhile == "restored":
            cursor.execute("UPDATE memories SET superseded_by = NULL WHERE id = %s", [old])
        else:
            cursor.execute("DELETE FROM memories WHERE id = %s", [old])
        undo.start()
        undo.until_waiting()
        waited = undo.is_alive()

    assert waited, "the undo did not wait for the memory's row"
    with pytest.raises(Conflict if meanwhile == "restored" else NotFound):
        undo.outcome()
    if meanwhile == "restored":
        assert actions(old) == ["created", "superseded", "restored"]


@pytest.mark.django_db(transaction=True)
def test_a_queued_replacement_takes_the_quota_before_the_row_it_names(cast) -> None:
    # A free-tier write takes the user's quota lock and then the rows it
    # links (``store``). Queuing one that names ``replaces`` took the named
    # row first and the quota after it: with a direct write of the same pair
    # between the two, each waited on the other and PostgreSQL failed one.
    old = remember(cast.alice.id, OLD)["id"]
    queued = Background(
        lambda: services.remember(
            user_id=cast.alice.id, tier=Tier.FREE, content=NEW, replaces=old, background=True
        )
    )
    quota = "SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))"
    with tenancy.tenant(cast.alice.id), connection.cursor() as cursor:
        cursor.execute(quota, [str(cast.alice.id)])
        queued.start()
        queued.until_waiting()
        cursor.execute(HOLD, [old])
    done = queued.outcome()

    assert done["status"] == "queued" and len(done["memory_ids"]) == 1


@pytest.mark.django_db(transaction=True)
def test_an_admin_delete_across_namespaces_takes_them_in_order_so_a_writer_of_two_goes_on(
    cast,
) -> None:
    # As the purge (above): the admin's bulk delete passed a chain on in n2,
    # then deleted in n1 and n2 in one statement, while a writer of one memory
    # in each held n1's generation and wanted n2's.
    user = cast.alice.id
    first = remember(user, "The queue broker is rabbit-1.", namespace="n2")["id"]
    middle = remember(user, "The queue broker moved to rabbit-2.", namespace="n2", replaces=first)
    last = remember(
        user, "The queue broker is now rabbit-3.", namespace="n2", replaces=middle["id"]
    )
    note = remember(user, "Temporary note: the printer is jammed.", namespace="n1")["id"]
    x1 = remember(user, "Lunch is at noon.", namespace="n1")["id"]
    x2 = remember(user, "The wiki lives at wiki.corp.", namespace="n2")["id"]

    def delete() -> int:
        with tenancy.operator(), transaction.atomic():
            return services.delete_as_operator([uuid.UUID(middle["id"]), uuid.UUID(note)])

    admin = Background(delete)
    writing_both(user, x1, x2, admin)

    assert admin.outcome() == 2
    with tenancy.operator():
        assert Memory.objects.get(id=first).superseded_by == uuid.UUID(last["id"])
    assert dangling_links(user) == []


@pytest.mark.django_db(transaction=True)
def test_turns_sent_to_one_thread_at_once_each_get_a_place_of_their_own(cast) -> None:
    # Each call places its turns after the thread's last: two calls at once
    # read the same last turn, and both would go in at the same place.
    user = cast.alice.id
    services.remember(
        user_id=user, tier=Tier.PRO, messages=[{"role": "user", "content": "Hi."}], thread_id="t"
    )
    lines = [f"Turn number {n} of the conversation." for n in range(6)]
    start = threading.Barrier(len(lines))

    def send(line: str) -> Callable[[], Any]:
        def call() -> Any:
            start.wait(PATIENCE)
            return services.remember(
                user_id=user,
                tier=Tier.PRO,
                messages=[{"role": "user", "content": line}],
                thread_id="t",
            )

        return call

    calls = [Background(send(line)) for line in lines]
    for call in calls:
        call.start()
    for call in calls:
        call.outcome()

    read = services.list_memories(user_id=user, thread_id="t", limit=100)
    assert [m["position"] for m in read] == list(range(len(lines) + 1))
    assert sorted(m["content"] for m in read[1:]) == sorted(lines)


@pytest.mark.django_db(transaction=True)
def test_a_write_whose_old_value_another_write_replaced_meanwhile_replaces_that_one(
    cast, monkeypatch
) -> None:
    # Two new values of one fact stored at once: both found the old value,
    # one linked it, and the other dropped its link and stayed current
    # beside it (3 rounds in 10 on a server). Stored one after the other,
    # the later replaces the earlier: a chain with one current end.
    from memories.services import superseding

    old = remember(cast.alice.id, OLD)["id"]
    looked = superseding.nearest
    other: list[dict[str, Any]] = []

    def nearest_then_another_write_commits(*args: Any, **kwargs: Any) -> Any:
        found = looked(*args, **kwargs)
        if not other:  # the first look only; the other write's own looks go by
            other.append({})
            meanwhile = Background(lambda: remember(cast.alice.id, NEW))
            meanwhile.start()
            other[0] = meanwhile.outcome()
        return found

    monkeypatch.setattr(superseding, "nearest", nearest_then_another_write_commits)
    later = remember(cast.alice.id, "Staging Postgres now runs on pg-staging-9.")

    assert other[0]["replaces"] == [old]
    assert later["replaces"] == [other[0]["id"]]
    with tenancy.operator():
        current = Memory.objects.filter(user_id=cast.alice.id, superseded_by__isnull=True)
        assert list(current.values_list("id", flat=True)) == [uuid.UUID(later["id"])]
    assert dangling_links(cast.alice.id) == []


@pytest.mark.django_db(transaction=True)
def test_two_facts_each_stated_again_over_the_other_at_once_lose_a_race_not_an_error(
    cast, monkeypatch
) -> None:
    """review133: A's text stated again replacing B, while B's text is stated again
    replacing A. The second waited on the first's locks, then linked A to B, which the
    first had just replaced: the trigger refused it, and the call answered internal_error.
    """
    from core import errors
    from memories.services import naming

    kim_text, teal_text = "Zeta service owner is Kim.", "The Omega widget colour is teal."
    kim = remember(cast.alice.id, kim_text)["id"]
    teal = remember(cast.alice.id, teal_text)["id"]
    original = naming.check_replaces
    first: list[dict[str, Any]] = []
    main = threading.current_thread()

    def other_call_first(*args: Any, **kwargs: Any) -> bool:
        if not first and threading.current_thread() is main:
            # The other call runs whole between this one's checks and its locks.
            other = Background(lambda: remember(cast.alice.id, kim_text, replaces=teal))
            other.start()
            first.append(other.outcome())
        return bool(original(*args, **kwargs))

    monkeypatch.setattr(naming, "check_replaces", other_call_first)
    with pytest.raises(errors.LostRace) as lost:
        remember(cast.alice.id, teal_text, replaces=kim)

    # The tools run such a call again, once; a call that loses again answers conflict.
    assert errors.is_contention(lost.value)
    assert errors.from_exception(lost.value).code == "conflict"
    assert first[0]["replaces"] == [teal]
    with tenancy.operator():
        assert Memory.objects.get(id=kim).superseded_by is None
        assert Memory.objects.get(id=teal).superseded_by == uuid.UUID(kim)
    assert dangling_links(cast.alice.id) == []
    # Run again, it states teal again over kim: one chain, the newest statement current.
    again = remember(cast.alice.id, teal_text, replaces=kim)
    assert again["id"] == teal
    with tenancy.operator():
        assert Memory.objects.get(id=teal).superseded_by is None
        assert Memory.objects.get(id=kim).superseded_by == uuid.UUID(teal)
    assert dangling_links(cast.alice.id) == []
