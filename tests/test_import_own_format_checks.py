"""`recall import`: Recall's own export checked against itself, and old dates round-tripped.

A record's history is that memory's own: a file whose history disagrees with
its record (edited by hand, or not ours) stops the import at its line
rather than storing a memory whose versions say something else.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from core import tenancy
from memories import services
from memories.models import Memory, MemoryHistory
from tests.test_export_import import export, import_file

pytestmark = pytest.mark.django_db(transaction=True)

WHEN = "2025-01-01T00:00:00.000Z"


def record(**changes: Any) -> dict[str, Any]:
    version = {
        "version": 1,
        "action": "created",
        "content": "The user drinks green tea.",
        "metadata": {},
        "namespace": "default",
        "priority": "medium",
        "timestamp": WHEN,
    }
    base = {
        "id": "33333333-3333-4333-8333-333333333333",
        "namespace": "default",
        "content": "The user drinks green tea.",
        "version": 1,
        "created_at": WHEN,
        "updated_at": WHEN,
        "history": [version],
    }
    history = changes.pop("history_changes", None)
    if history is not None:
        version.update(history)
        base["history"] = [{k: v for k, v in version.items() if v is not None}]
    return {**base, **changes}


def write(path: Path, *records: dict[str, Any]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


def test_an_old_date_survives_an_export_and_an_import(cast, tmp_path):
    first = write(tmp_path / "old.jsonl", record(created_at="1970-01-02T03:04:05.006Z"))
    import_file("alice@example.com", first)

    exported = export("alice@example.com")
    [line] = [json.loads(text) for text in exported.splitlines()]
    assert line["created_at"] == "1970-01-02T03:04:05.006Z"
    again = write(tmp_path / "again.jsonl", line)
    assert "imported 1" in import_file("charlie@example.com", again).lower()

    with tenancy.operator():
        kept = Memory.objects.get(user_id=cast.charlie.id)
    assert kept.created_at == datetime(1970, 1, 2, 3, 4, 5, 6000, tzinfo=UTC)


@pytest.mark.parametrize(
    ("changes", "said"),
    [
        (
            {"created_at": "9999-12-31T00:00:00Z", "history": []},
            "created_at 9999-12-31T00:00:00.000Z is not when a memory was written",
        ),
        (
            {"history_changes": {"namespace": "elsewhere"}},
            "a history entry is in namespace 'elsewhere', the memory in 'default'",
        ),
        (
            {"history_changes": {"version": 7}},
            "history version 7 is later than the memory's version 1",
        ),
        (
            {"history_changes": {"content": "The user drinks coffee."}},
            "history version 1 holds other content than the memory",
        ),
    ],
    ids=["far-future", "namespace", "version", "content"],
)
def test_a_record_that_disagrees_with_itself_stops_the_import_naming_its_line(
    cast, tmp_path, changes, said
):
    fine = record(id="44444444-4444-4444-8444-444444444444", content="Fine.", history=[])
    path = write(tmp_path / "odd.jsonl", fine, record(**changes))

    with pytest.raises(CommandError, match=f"line 2: {said}"):
        import_file("alice@example.com", path)
    assert list(services.export_memories(user_id=cast.alice.id)) == []


def test_a_history_entry_without_a_namespace_is_in_its_memorys(cast, tmp_path):
    path = write(
        tmp_path / "ns.jsonl",
        record(namespace="travel", history_changes={"namespace": None}),
    )

    import_file("alice@example.com", path)

    with tenancy.operator():
        [version] = MemoryHistory.objects.filter(user_id=cast.alice.id)
        memory = Memory.objects.get(user_id=cast.alice.id)
    assert (version.namespace, memory.namespace, memory.version) == ("travel", "travel", 1)


def test_an_invisible_memory_an_older_release_stored_restores(cast, tmp_path):
    # remember now refuses content of invisible characters alone; a backup made
    # before that refused its whole record.
    invisible = "\u200b"
    path = write(
        tmp_path / "blank.jsonl",
        record(content=invisible, history_changes={"content": invisible}),
    )

    import_file("alice@example.com", path)

    with tenancy.operator():
        [memory] = Memory.objects.filter(user_id=cast.alice.id)
    assert memory.content == invisible


def test_a_link_between_notes_of_two_tasks_is_not_made(cast, tmp_path):
    old_id, new_id = "55555555-5555-4555-8555-555555555555", "66666666-6666-4666-8666-666666666666"
    old = record(
        id=old_id,
        content="The deploy runs at noon.",
        history=[],
        superseded_by=new_id,
        superseded_at="2025-02-01T00:00:00Z",
    )
    new = record(id=new_id, content="The deploy runs at one.", history=[], task_id="release-7")
    path = write(tmp_path / "tasks.jsonl", old, new)

    out = import_file("alice@example.com", path)

    assert "0 replacements linked" in out and "1 not kept" in out
    with tenancy.operator():
        assert not Memory.objects.filter(user_id=cast.alice.id, superseded_by__isnull=False)


def test_a_memory_dated_before_the_year_1000_exports_as_iso_and_restores(cast, tmp_path):
    # Such dates came in before imports were held to 1970 onwards: the export
    # wrote "385-07-25...", which the import then could not even read. What
    # Recall stored, its own file restores.
    import_file("alice@example.com", write(tmp_path / "one.jsonl", record(history=[])))
    with tenancy.operator():
        Memory.objects.filter(user_id=cast.alice.id).update(
            created_at=datetime(385, 7, 25, 7, 6, 40, tzinfo=UTC)
        )

    [line] = [json.loads(text) for text in export("alice@example.com").splitlines()]

    assert line["created_at"] == "0385-07-25T07:06:40.000Z"
    assert (
        "imported 1"
        in import_file("charlie@example.com", write(tmp_path / "old.jsonl", line)).lower()
    )
    with tenancy.operator():
        kept = Memory.objects.get(user_id=cast.charlie.id)
    assert kept.created_at == datetime(385, 7, 25, 7, 6, 40, tzinfo=UTC)


def test_an_export_of_what_a_foreign_import_stored_restores(cast, tmp_path):
    """A source that gave only updated_at, or a time later today: what such an import
    stored (its history stamped at the import, before that created_at), Recall's own
    export of it must restore."""
    later = datetime.now(UTC).replace(microsecond=0) + timedelta(hours=20)
    source = tmp_path / "source.jsonl"
    source.write_text(
        json.dumps(
            {"content": "Only its update time was given.", "updated_at": "2024-01-01T00:00:00Z"}
        )
        + "\n"
        + json.dumps({"content": "Written later today.", "created_at": later.isoformat()})
        + "\n",
        encoding="utf-8",
    )
    call_command("import_from", "--from", "jsonl", "alice@example.com", str(source))

    exported = write(
        tmp_path / "backup.jsonl",
        *[json.loads(text) for text in export("alice@example.com").splitlines()],
    )

    assert "imported 2" in import_file("charlie@example.com", exported).lower()
    with tenancy.operator():
        given = Memory.objects.get(user_id=cast.charlie.id, content__startswith="Only")
    assert given.created_at == given.updated_at == datetime(2024, 1, 1, tzinfo=UTC)
