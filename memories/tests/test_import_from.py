"""`recall import --from FORMAT`: other servers' exports into a user's memories.

Every format is read from fixture files written to that project's documented
shape (fixtures/imports/, built by memories/tests/importing.py), imported
through the command an operator runs, and checked in the database through
the same services the tools use.
"""

from __future__ import annotations

import gzip
import io
import json
import zipfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from accounts import services as accounts_services
from core import context, tenancy
from memories import embeddings, services
from memories.importers import Source, run
from memories.importers.run import Options, run_import
from memories.models import Memory, MemoryHistory
from memories.tests.importing import FIXTURES, mcp_memory_service_db, openmemory_zip

# Imports store from a writer thread, on a connection of its own: the test's
# data must be committed for it to see.
pytestmark = pytest.mark.django_db(transaction=True)


def imported(email: str, fmt: str, path: Path | str, *args: str) -> str:
    out = io.StringIO()
    call_command(
        "import_from", "--from", fmt, email, str(path), *args, stdout=out, stderr=io.StringIO()
    )
    return out.getvalue()


def rows(user: Any, **filters: Any) -> list[dict[str, Any]]:
    with tenancy.tenant(user.id):
        found = (
            Memory.objects.filter(user_id=user.id, **filters)
            .order_by("created_at")
            .values(
                "id",
                "content",
                "namespace",
                "agent__name",
                "thread_id",
                "priority",
                "metadata",
                "created_at",
                "updated_at",
                "source_kind",
                "path",
                "embedding",
            )
        )
        return [dict(row) for row in found]


def by_content(user: Any) -> dict[str, dict[str, Any]]:
    return {row["content"]: row for row in rows(user)}


def our_vectors(texts: list[str]) -> np.ndarray:
    return embeddings.get_embedder().embed(texts)


# mem0 ---------------------------------------------------------------------------


def test_a_mem0_export_keeps_timestamps_identities_and_provenance(cast):
    out = imported("alice@example.com", "mem0", FIXTURES / "mem0.json")

    assert "Imported 3 of 5 records into alice@example.com" in out
    assert "0 skipped as duplicates, 2 refused" in out
    assert "record 4 (line 33): content must not be empty or only whitespace" in out
    assert "record 5 (line 41): created_at 'last tuesday' is not an ISO 8601 date" in out
    memories = by_content(cast.alice)
    milk = memories["Prefers oat milk in coffee"]
    assert milk["created_at"] == datetime(2024, 3, 2, 16, 15, tzinfo=UTC)
    assert milk["updated_at"] == datetime(2024, 5, 10, 19, 0, tzinfo=UTC)
    assert milk["metadata"] == {
        "category": "food",
        "imported_from": {
            "format": "mem0",
            "file": "mem0.json",
            "id": "0b6f3c3e-5a7e-4a55-9d6f-1c2f0a9e8b11",
            "user_id": "dana",
            "hash": "5d2f7a6c1b0e4d3a9f8e7d6c5b4a3928",
        },
    }
    # agent_id goes to the user's agent of that name, run_id to the thread.
    assert memories["Is training for a half marathon in October"]["agent__name"] == "coach"
    assert memories["Asked to be reminded about the dentist on Friday"]["thread_id"] == "session-42"
    assert milk["agent__name"] is None and milk["namespace"] == "dana"  # user_id


def test_the_history_records_the_import_with_its_source(cast):
    imported("alice@example.com", "mem0", FIXTURES / "mem0.json")
    memory = by_content(cast.alice)["Prefers oat milk in coffee"]

    with tenancy.tenant(cast.alice.id):
        [version] = MemoryHistory.objects.filter(memory_id=memory["id"]).values(
            "version", "action", "client", "metadata"
        )

    assert version["version"] == 1 and version["action"] == "created"
    assert version["client"] == "import"
    assert version["metadata"]["imported_from"]["format"] == "mem0"
    assert version["metadata"]["imported_from"]["file"] == "mem0.json"


def test_identities_go_where_the_ids_flag_says(cast):
    imported(
        "alice@example.com",
        "mem0",
        FIXTURES / "mem0.json",
        "--ids",
        "user_id=metadata,agent_id=metadata",
    )

    memories = by_content(cast.alice)
    assert {row["namespace"] for row in memories.values()} == {"default"}
    assert all(row["agent__name"] is None for row in memories.values())
    assert accounts_services.list_agents(user_id=cast.alice.id) == []


def test_a_second_run_imports_nothing_and_embeds_nothing(cast):
    imported("alice@example.com", "mem0", FIXTURES / "mem0.json")

    again = imported("alice@example.com", "mem0", FIXTURES / "mem0.json")

    assert "Imported 0 of 5 records" in again
    assert "3 skipped as duplicates, 2 refused; 0 vectors reused, 0 embedded" in again
    assert len(rows(cast.alice)) == 3


def test_a_dry_run_reports_and_stores_nothing(cast):
    out = imported("alice@example.com", "mem0", FIXTURES / "mem0.json", "--dry-run")

    assert "Would import 3 of 5 records" in out
    assert rows(cast.alice) == []
    assert accounts_services.list_agents(user_id=cast.alice.id) == []


def test_a_malformed_file_stops_naming_the_file_and_line(cast):
    with pytest.raises(CommandError, match=r"mem0_malformed\.json, line 3: not valid JSON"):
        imported("alice@example.com", "mem0", FIXTURES / "mem0_malformed.json")

    assert rows(cast.alice) == []


def test_an_unknown_user_is_refused(cast):
    with pytest.raises(CommandError, match=r"No user with email nobody@example\.com"):
        imported("nobody@example.com", "mem0", FIXTURES / "mem0.json")


def test_a_batch_that_fails_leaves_none_of_its_memories(cast, monkeypatch):
    monkeypatch.setattr(run, "BATCH", 2)
    batches = []

    def fail_on_the_second(report: run.Report) -> None:
        batches.append(report.imported)
        if len(batches) == 2:
            raise RuntimeError("the database went away mid-batch")

    with pytest.raises(RuntimeError), context.acting_as("import"):
        run_import(
            user_id=cast.alice.id,
            source=Source.at(FIXTURES / "mem0.json"),
            options=Options(format="mem0"),
            checkpoint=fail_on_the_second,
        )

    # The first batch (two memories) committed; the second rolled back whole.
    assert len(rows(cast.alice)) == 2


def test_an_interrupted_import_resumes_when_run_again(cast, monkeypatch):
    monkeypatch.setattr(run, "BATCH", 1)

    def interrupt(report: run.Report) -> None:
        if report.imported:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt), context.acting_as("import"):
        run_import(
            user_id=cast.alice.id,
            source=Source.at(FIXTURES / "mem0.json"),
            options=Options(format="mem0"),
            progress=interrupt,
        )
    # The batch being written when it stopped is finished, none after it.
    done = len(rows(cast.alice))
    assert 1 <= done <= 2

    out = imported("alice@example.com", "mem0", FIXTURES / "mem0.json")

    assert f"Imported {3 - done} of 5 records" in out
    assert f"{done} skipped as duplicates" in out
    assert "0 vectors reused, 1 embedded" in out or done == 1
    assert len(rows(cast.alice)) == 3


def test_ctrl_c_during_the_command_says_what_stayed_and_exits_130(cast, monkeypatch):
    # It printed a KeyboardInterrupt traceback from inside the model, and no count.
    from memories.management.commands import import_from

    monkeypatch.setattr(run, "BATCH", 1)
    shown = import_from.Command._progress

    def interrupted(self: Any, report: run.Report) -> None:
        shown(self, report)
        if report.imported:
            raise KeyboardInterrupt

    monkeypatch.setattr(import_from.Command, "_progress", interrupted)
    err = io.StringIO()
    with pytest.raises(SystemExit) as stopped:
        call_command(
            "import_from",
            "--from",
            "mem0",
            "alice@example.com",
            str(FIXTURES / "mem0.json"),
            stdout=io.StringIO(),
            stderr=err,
        )

    stored = len(rows(cast.alice))
    assert stopped.value.code == 130
    assert f"Interrupted: {stored} memories stored by then stay" in err.getvalue()
    assert "Run the same command again" in err.getvalue()
    assert "Traceback" not in err.getvalue()


def test_charlie_never_sees_alices_imports(cast):
    imported("alice@example.com", "mem0", FIXTURES / "mem0.json")

    assert rows(cast.charlie) == []
    assert services.recall(user_id=cast.charlie.id, query="oat milk coffee", threshold=0) == []
    with tenancy.tenant(cast.charlie.id):
        assert not Memory.objects.filter(content__contains="oat milk").exists()
    # Alice's copies are no duplicates of Charlie's: he gets his own.
    out = imported("charlie@example.com", "mem0", FIXTURES / "mem0.json")
    assert "Imported 3 of 5 records into charlie@example.com" in out
    assert len(rows(cast.alice)) == 3


def test_the_command_line_routes_import_from(cast):
    from recall import cli

    out = io.StringIO()
    import contextlib

    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        cli.main(["import", "--from", "mem0", "alice@example.com", str(FIXTURES / "mem0.json")])

    assert "Imported 3 of 5 records" in out.getvalue()


# OpenMemory ------------------------------------------------------------------------


@pytest.mark.parametrize("with_lines", [True, False], ids=["jsonl.gz", "memories.json"])
def test_an_openmemory_export_zip_imports_and_refuses_deleted_memories(cast, tmp_path, with_lines):
    archive = openmemory_zip(tmp_path / "memories_export_sam.zip", with_lines=with_lines)

    out = imported("alice@example.com", "openmemory", archive, "--ids", "app=namespace")

    assert "Imported 2 of 3 records" in out and "deleted in OpenMemory" in out
    memories = by_content(cast.alice)
    tabs = memories["Uses tabs, not spaces, in Go code"]
    assert tabs["namespace"] == "cursor"
    assert tabs["created_at"] == datetime(2025, 1, 6, 11, tzinfo=UTC)
    assert tabs["metadata"]["source_app"] == "cursor"
    assert tabs["metadata"]["imported_from"]["categories"] == ["preferences"]
    staging = memories["The staging database is called orders-stg"]
    assert staging["metadata"]["imported_from"]["state"] == "archived"


def damaged_gzip(path: Path) -> Path:
    import zipfile

    good = gzip.compress((FIXTURES / "openmemory" / "memories.jsonl").read_bytes())
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("memories.jsonl.gz", good[:20] + b"\xff" * 40 + good[60:])
    return path


def damaged_member(path: Path) -> Path:
    import zipfile

    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED) as archive:
        archive.write(FIXTURES / "openmemory" / "memories.json", "memories.json")
    data = bytearray(path.read_bytes())
    data[data.index(b"Uses tabs")] ^= 0x20  # one byte of the member: its CRC no longer holds
    path.write_bytes(bytes(data))
    return path


def latin1_member(path: Path) -> Path:
    import zipfile

    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("memories.json", '{"memories": [{"content": "café"}]}'.encode("latin-1"))
    return path


@pytest.mark.parametrize(
    ("make", "reason"),
    [
        (damaged_gzip, "the gzip stream is damaged"),
        (damaged_member, "the archive is damaged"),
        (latin1_member, "not UTF-8 text"),
    ],
    ids=["gzip", "crc", "latin-1"],
)
def test_a_damaged_openmemory_archive_is_refused_by_name(cast, tmp_path, make, reason):
    # Each was a traceback from the command, and "failed on our side" on the dashboard.
    archive = make(tmp_path / "export.zip")

    with pytest.raises(CommandError, match=reason):
        imported("alice@example.com", "openmemory", archive)
    assert rows(cast.alice) == []


def zeros_in_gzip(path: Path, megabytes: int) -> Path:
    packed = io.BytesIO()
    with gzip.GzipFile(fileobj=packed, mode="wb") as out:
        for _ in range(megabytes):
            out.write(b"\0" * (1024 * 1024))
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("memories.jsonl.gz", packed.getvalue())
    return path


def zeros_in_notes(path: Path, megabytes: int) -> Path:
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for n in range(megabytes):
            archive.writestr(f"notes/n{n}.md", b" " * (1024 * 1024))
    return path


@pytest.mark.parametrize(
    ("fmt", "make"),
    [("openmemory", zeros_in_gzip), ("basic-memory", zeros_in_notes)],
    ids=["openmemory", "basic-memory"],
)
def test_an_archive_that_unpacks_far_past_its_size_is_refused(
    cast, tmp_path, monkeypatch, fmt, make
):
    # 600 KB that unpacked to 600 MB of nothing held an import worker (and the
    # background adds it also runs) for minutes.
    from memories.importers import unpacking

    monkeypatch.setattr(unpacking, "FLOOR", 2 * 1024 * 1024)
    archive = make(tmp_path / "export.zip", 40)

    with pytest.raises(CommandError, match="unpacks to more than"):
        imported("alice@example.com", fmt, archive)
    assert rows(cast.alice) == []


# mcp-memory-service -----------------------------------------------------------------


def fixture_rows() -> list[dict[str, Any]]:
    import json

    return json.loads((FIXTURES / "mcp_memory_service.json").read_text())


def test_mcp_memory_service_vectors_are_reused_when_they_agree_with_ours(cast, tmp_path):
    db = mcp_memory_service_db(tmp_path / "sqlite_vec.db", fixture_rows(), our_vectors)

    out = imported("alice@example.com", "mcp-memory-service", db)

    assert "Imported 3 of 4 records" in out and "3 vectors reused, 0 embedded" in out
    assert "deleted in mcp-memory-service" in out
    assert "median similarity 1.000" in out and ": reused" in out
    memories = by_content(cast.alice)
    build = memories["The build server restarts every Sunday at 03:00 UTC"]
    assert build["created_at"] == datetime.fromtimestamp(1717236000.5, tz=UTC)
    assert build["metadata"]["project"] == "ci"
    assert build["metadata"]["imported_from"]["tags"] == ["ops", "schedule"]
    assert build["metadata"]["imported_from"]["memory_type"] == "fact"
    assert np.allclose(build["embedding"], our_vectors([build["content"]])[0], atol=1e-6)


def test_mcp_memory_service_vectors_that_disagree_are_embedded_again(cast, tmp_path):
    rng = np.random.default_rng(7)

    def strangers(texts: list[str]) -> np.ndarray:
        return rng.standard_normal((len(texts), 384)).astype(np.float32)

    db = mcp_memory_service_db(tmp_path / "sqlite_vec.db", fixture_rows(), strangers)

    out = imported("alice@example.com", "mcp-memory-service", db)

    assert "0 vectors reused, 3 embedded" in out
    assert "do not match ours, embedded again" in out
    found = services.recall(
        user_id=cast.alice.id, query="When does the build server restart?", limit=1
    )
    assert found[0]["content"].startswith("The build server restarts")


def test_mcp_memory_service_vectors_of_another_model_are_not_compared(cast, tmp_path):
    db = mcp_memory_service_db(tmp_path / "sqlite_vec.db", fixture_rows(), our_vectors)

    out = imported("alice@example.com", "mcp-memory-service", db, "--source-model", "bge-small-en")

    assert "bge-small-en, 384 dimensions: not all-MiniLM-L6-v2, embedded again" in out
    assert "0 vectors reused, 3 embedded" in out


def test_a_file_that_is_not_an_mcp_memory_service_database_is_refused(cast, tmp_path):
    bogus = tmp_path / "notes.db"
    bogus.write_text("just text")

    with pytest.raises(
        CommandError, match=r"notes\.db: not an SQLite database|notes\.db: the database"
    ):
        imported("alice@example.com", "mcp-memory-service", bogus)


# basic-memory ---------------------------------------------------------------------


def test_a_basic_memory_folder_imports_notes_as_document_chunks(cast):
    out = imported("alice@example.com", "basic-memory", FIXTURES / "basic-memory")

    assert "broken-frontmatter.md: the frontmatter is not valid YAML at line 3" in out
    # The title, a heading alone, is folded into the section it opens (chunking).
    observations = next(row for row in rows(cast.alice) if "## Observations" in row["content"])
    assert observations["source_kind"] == "document"
    assert observations["path"] == "coffee-brewing-methods.md"
    assert observations["created_at"] == datetime(2024, 2, 10, 8, tzinfo=UTC)
    meta = observations["metadata"]
    assert (meta["title"], meta["permalink"], meta["heading"], meta["chunk"]) == (
        "Coffee Brewing Methods",
        "coffee-brewing-methods",
        "Observations",
        0,
    )
    assert meta["imported_from"]["frontmatter"]["tags"] == ["coffee", "brewing"]
    spec = next(row for row in rows(cast.alice) if row["path"] == "projects/search-design.md")
    assert spec["metadata"]["imported_from"]["frontmatter"]["status"] == "draft"
    found = services.recall(user_id=cast.alice.id, query="how hot should the water be for coffee?")
    assert "94°C" in found[0]["content"]


def test_a_zipped_basic_memory_folder_imports_the_same(cast, tmp_path):
    import zipfile

    archive = tmp_path / "notes.zip"
    with zipfile.ZipFile(archive, "w") as out:
        for note in (FIXTURES / "basic-memory").rglob("*.md"):
            out.write(note, f"notes/{note.relative_to(FIXTURES / 'basic-memory').as_posix()}")

    report = imported("alice@example.com", "basic-memory", archive)

    assert "Imported 5 of 6 records" in report  # the title is folded into its section
    assert {row["path"] for row in rows(cast.alice)} == {
        "notes/coffee-brewing-methods.md",
        "notes/no-frontmatter.md",
        "notes/projects/search-design.md",
    }


def test_yaml_aliases_in_a_note_are_refused_before_they_expand(cast, tmp_path):
    # 327 bytes of nested aliases took 67 s and 2.4 GB before the depth check
    # refused them; one referring to itself crashed the import.
    laughs = "\n".join(
        [f"l0: &l0 [{', '.join(['x'] * 9)}]"]
        + [f"l{n}: &l{n} [{', '.join([f'*l{n - 1}'] * 9)}]" for n in range(1, 9)]
    )
    (tmp_path / "laughs.md").write_text(f"---\n{laughs}\n---\nA note.\n")
    (tmp_path / "loop.md").write_text("---\nloop: &a [*a]\n---\nAnother note.\n")
    (tmp_path / "fine.md").write_text("---\ntitle: Fine\n---\nThe user likes tea.\n")

    out = imported("alice@example.com", "basic-memory", tmp_path)

    assert "laughs.md: the frontmatter uses a YAML alias (*name) at line 3" in out
    assert "loop.md: the frontmatter uses a YAML alias (*name) at line 2" in out
    assert [row["content"] for row in rows(cast.alice)] == ["The user likes tea."]


# Letta ------------------------------------------------------------------------------


def test_a_letta_agent_file_imports_core_blocks_and_passages(cast):
    out = imported("alice@example.com", "letta", FIXTURES / "letta.af")

    assert "Imported 5 of 5 records" in out
    memories = by_content(cast.alice)
    human = memories["Name: Ana. Lives in Lisbon. Likes hiking."]
    assert (human["priority"], human["agent__name"]) == ("high", "companion")
    assert human["metadata"]["imported_from"]["label"] == "human"
    shared = memories["The household budget review is on the 1st of each month."]
    assert shared["agent__name"] is None  # two agents share it: the user's
    assert shared["metadata"]["imported_from"]["agents"] == ["companion", "planner"]
    peanuts = memories["Ana is allergic to peanuts"]
    assert (peanuts["priority"], peanuts["agent__name"]) == ("medium", "companion")
    assert peanuts["created_at"] == datetime(2025, 4, 5, 12, tzinfo=UTC)
    assert peanuts["metadata"]["confidence"] == "high"


def test_vectors_of_one_model_at_two_widths_are_decided_apart(cast, tmp_path):
    # The sample took every vector of the model, whatever its width: np.stack raised.
    model = embeddings.get_embedder()
    [ours] = model.embed(["Bananas are yellow"])
    passages = [
        {"id": "p1", "text": "Bananas are yellow", "created_at": "2025-01-01T00:00:00Z",
         "embedding": [float(x) for x in ours],
         "embedding_config": {"embedding_model": "all-MiniLM-L6-v2", "embedding_dim": 384}},
        {"id": "p2", "text": "Kiwis are green", "created_at": "2025-01-01T00:00:00Z",
         "embedding": [0.1] * 10,
         "embedding_config": {"embedding_model": "all-MiniLM-L6-v2", "embedding_dim": 10}},
    ]  # fmt: skip
    source = tmp_path / "mixed.json"
    source.write_text(json.dumps(passages))

    out = imported("alice@example.com", "letta", source)

    assert "Imported 2 of 2 records" in out
    assert "all-MiniLM-L6-v2, 10 dimensions" in out and "embedded again" in out
    assert set(by_content(cast.alice)) == {"Bananas are yellow", "Kiwis are green"}


def test_a_first_generation_letta_agent_file_imports_its_core_memory(cast):
    out = imported("alice@example.com", "letta", FIXTURES / "letta_v1.af")

    assert "Imported 2 of 2 records" in out
    jo = by_content(cast.alice)["The user is Jo, a marine biologist."]
    assert (jo["agent__name"], jo["priority"]) == ("field-notes", "high")
    assert jo["created_at"] == datetime(2025, 1, 2, 8, tzinfo=UTC)


# generic ----------------------------------------------------------------------------


def test_a_csv_imports_with_a_column_mapping(cast):
    out = imported(
        "alice@example.com",
        "csv",
        FIXTURES / "generic.csv",
        "--map",
        "content=note,created_at=when,namespace=project,metadata.origin=origin",
    )

    assert "Imported 2 of 3 records" in out
    assert "line 4: content must not be empty" in out
    invoice = by_content(cast.alice)["Ship the invoice export before the audit"]
    assert invoice["namespace"] == "finance"
    assert invoice["created_at"] == datetime(2024, 9, 1, 10, tzinfo=UTC)
    assert invoice["metadata"]["origin"] == "email"
    assert invoice["metadata"]["imported_from"]["fields"] == {"score": "3"}


def test_jsonl_imports_with_dotted_fields_and_refuses_a_bad_date(cast):
    out = imported(
        "alice@example.com",
        "jsonl",
        FIXTURES / "generic.jsonl",
        "--map",
        "content=data.text,created_at=ts,tags=labels",
    )

    assert "Imported 2 of 3 records" in out
    assert "line 4: created_at 'not a date' is not an ISO 8601 date" in out
    vpn = by_content(cast.alice)["The VPN certificate expires in March"]
    assert vpn["created_at"] == datetime(2025, 1, 1, tzinfo=UTC)
    assert vpn["metadata"]["imported_from"]["tags"] == ["it", "security"]
    assert vpn["metadata"]["imported_from"]["fields"] == {"kind": "reminder"}


@pytest.mark.parametrize(
    "stamp", ["0001-01-01T00:00:00+05:00", "9999-12-31T23:59:59-05:00", "0001-01-01T00:00:00"]
)
def test_a_time_a_timestamp_cannot_hold_is_refused_and_the_rest_is_readable(cast, tmp_path, stamp):
    # Stored, its UTC value was past year 1 or 9999: every later read of the
    # user's memories (export, recall, list, stats) failed with internal_error.
    source = tmp_path / "edges.jsonl"
    source.write_text(
        json.dumps({"content": "Out of time", "created_at": stamp})
        + "\n"
        + json.dumps({"content": "In time", "created_at": "2025-01-01T00:00:00Z"})
        + "\n"
    )

    out = imported("alice@example.com", "jsonl", source)

    assert "Imported 1 of 2 records" in out
    assert "line 1: created_at is out of range" in out
    assert set(by_content(cast.alice)) == {"In time"}
    assert [m["content"] for m in services.export_memories(user_id=cast.alice.id)] == ["In time"]


def test_a_mapping_naming_a_missing_column_is_refused(cast):
    with pytest.raises(CommandError, match="--map names columns the header lacks: text"):
        imported("alice@example.com", "csv", FIXTURES / "generic.csv", "--map", "content=text")


def test_the_commands_writers_store_every_batch_once(cast, monkeypatch):
    monkeypatch.setattr(run, "BATCH", 1)  # five batches between two writer threads

    out = imported("alice@example.com", "letta", FIXTURES / "letta.af")
    again = imported("alice@example.com", "letta", FIXTURES / "letta.af")

    assert "Imported 5 of 5 records" in out
    assert "Imported 0 of 5 records" in again and "5 skipped as duplicates" in again
    assert len(rows(cast.alice)) == 5


@pytest.mark.parametrize(
    ("fmt", "name", "data", "said"),
    [
        ("mem0", "m.jsonl", b'{"memory": "ok"}\n{"memory": "caf\xe9"}\n', "at line 1 or a little"),
        ("csv", "m.csv", b"content\nok\ncaf\xe9\n", "at line 1 or a little"),
    ],
)
def test_text_that_is_not_utf8_is_refused_near_its_line(cast, tmp_path, fmt, name, data, said):
    # It said "after line 0", a line no file has.
    path = tmp_path / name
    path.write_bytes(data)

    with pytest.raises(CommandError, match=f"not UTF-8 text, {said}"):
        imported("alice@example.com", fmt, path)


def test_a_csv_quote_left_open_stops_the_import_at_its_line(cast, tmp_path):
    # Not strict, the reader took the rest of the file as one field and imported it.
    path = tmp_path / "open.csv"
    path.write_text('content,created_at\n"first ok",2025-01-01\n"never closed,2025-01-01\nmore\n')

    with pytest.raises(CommandError, match=r"open\.csv, line 3: unexpected end of data"):
        imported("alice@example.com", "csv", path)


def test_a_csv_field_past_the_limit_is_refused_at_its_own_line(cast, tmp_path, monkeypatch):
    # The reader counts a line once it parsed it, so the message named the line before.
    from memories.importers import generic

    monkeypatch.setattr(generic, "FIELD_MAX_CHARS", 150_000)
    path = tmp_path / "big.csv"
    path.write_text("content\nfirst\nsecond\n" + "x" * 160_000 + "\nlast\n")

    with pytest.raises(CommandError, match=r"big\.csv, line 4: field larger than field limit"):
        imported("alice@example.com", "csv", path)
