"""`recall export` and `recall import`: a round trip into a fresh database.

The export comes from the test database through the command; the import
goes into a brand-new embedded PostgreSQL in a temporary data directory,
through `python -m recall`, exactly as an operator would move a user.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import uuid
import warnings
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection

from accounts.tiers import Tier
from core import context, tenancy
from memories import embeddings, services
from memories.models import Memory, MemoryHistory

pytestmark = pytest.mark.slow

QUERIES = ["What does the user drink?", "Where is the trip?", "deadline", "Who is the dentist?"]

# Run in the fresh database: export the user again, and answer QUERIES.
PROBE = """
import json, sys
import django
django.setup()
from accounts import services as accounts
from memories import services
user = accounts.find_user(email=sys.argv[1])
print(json.dumps({
    "export": list(services.export_memories(user_id=user.id)),
    "recall": {
        q: services.recall(user_id=user.id, query=q, namespace=ns, threshold=0)
        for q in json.loads(sys.argv[2]) for ns in ("default", "travel")
    },
}))
"""


def recall_command(*args: str, data_dir: Path, stdin: str | None = None):
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    env["RECALL_DATA_DIR"] = str(data_dir)
    done = subprocess.run(
        [sys.executable, *args],
        cwd=settings.BASE_DIR,
        env=env,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def alices_memories(cast, agent=None) -> None:
    alice = cast.alice.id
    with context.acting_as("mcp", cast.alice_key.key.id):
        tea = services.remember(
            user_id=alice,
            tier=Tier.PRO,
            content="The user drinks green tea.",
            priority="high",
            metadata={"source": "chat"},
        )["id"]
        services.update_memory(user_id=alice, id=tea, content="The user drinks green tea daily.")
        # A chain (issue 22): the older memory is kept, replaced by the later one.
        dentist = services.remember(
            user_id=alice, tier=Tier.PRO, content="The user's dentist is Dr Okafor."
        )["id"]
        services.remember(
            user_id=alice,
            tier=Tier.PRO,
            content="The user switched dentist to Dr Lindqvist.",
            replaces=dentist,
        )
        services.remember(
            user_id=alice,
            tier=Tier.PRO,
            content="The report deadline is Friday.",
            expires_at="2099-06-30T12:00:00Z",
        )
        services.remember(
            user_id=alice,
            tier=Tier.PRO,
            namespace="travel",
            messages=[
                {"role": "user", "content": "I'm going to Kyoto in April."},
                {"role": "assistant", "content": "Book early for the blossoms."},
            ],
            thread_id="kyoto",
        )
    if agent is not None:
        # An agent's note, with seed 003's source: the import finds (or makes)
        # the user's agent of the same name.
        services.add_note(
            user_id=alice,
            tier=Tier.PRO,
            agent_id=agent.id,
            content="The research agent prefers primary sources.",
            author="research",
            task_id="lit-review",
        )
    services.remember(user_id=cast.charlie.id, tier=Tier.PRO, content="Charlie's own memory.")


def export(email: str, *args: str) -> str:
    out, err = io.StringIO(), io.StringIO()
    call_command("export_memories", email, *args, stdout=out, stderr=err)
    return out.getvalue()


class Closed(io.StringIO):
    """An output whose reader went away after ``room`` lines (`recall export | head -1`)."""

    def __init__(self, room: int, error: OSError) -> None:
        super().__init__()
        self.room, self.error = room, error

    def write(self, text: str) -> int:
        if self.room <= 0:
            raise self.error
        self.room -= 1
        return super().write(text)


@pytest.mark.parametrize(
    ("error", "said"),
    [
        (BrokenPipeError(32, "Broken pipe"), "the reader closed it"),
        (OSError(28, "No space left on device"), "No space left on device"),
    ],
)
def test_an_export_whose_output_fails_says_so_not_a_traceback(cast, error, said):
    for n in range(3):
        services.remember(user_id=cast.alice.id, tier=Tier.PRO, content=f"Fact {n} of three.")

    with pytest.raises(CommandError) as stopped:
        call_command("export_memories", "alice@example.com", stdout=Closed(1, error))

    assert (
        str(stopped.value) == f"Cannot write the export ({said}); it failed after at most 1 memory."
    )


@pytest.mark.django_db(transaction=True)
def test_a_round_trip_into_a_fresh_database_keeps_memories_history_and_recall(
    cast, agents, tmp_path
):
    alices_memories(cast, agent=agents.research)
    exported = export("alice@example.com")
    records = [json.loads(line) for line in exported.splitlines()]
    assert len(records) == 7
    old = next(r for r in records if "Okafor" in r["content"])
    new = next(r for r in records if "Lindqvist" in r["content"])
    assert old["superseded_by"] == new["id"]
    assert [v["action"] for v in old["history"]] == ["created", "superseded"]
    assert new["history"][0]["replaces"] == [old["id"]]
    assert "Charlie" not in exported
    note = next(r for r in records if r["agent"] == "research")
    assert (note["source_kind"], note["author"], note["task_id"]) == (
        "note",
        "research",
        "lit-review",
    )
    tea = next(r for r in records if "tea" in r["content"])
    assert [v["action"] for v in tea["history"]] == ["created", "updated"]
    before = {
        q: services.recall(user_id=cast.alice.id, query=q, namespace=ns, threshold=0)
        for q in QUERIES
        for ns in ("default", "travel")
    }

    fresh = tmp_path / "fresh"
    file = tmp_path / "alice.jsonl"
    file.write_text(exported, encoding="utf-8")
    recall_command("-m", "recall", "manage", "migrate", "--verbosity", "0", data_dir=fresh)
    recall_command("-m", "recall", "create-user", "alice@example.com", data_dir=fresh)
    imported = recall_command(
        "-m", "recall", "import", "alice@example.com", str(file), data_dir=fresh
    )
    probe = recall_command("-c", PROBE, "alice@example.com", json.dumps(QUERIES), data_dir=fresh)

    assert "Imported 7 of 7 memories" in imported.stdout
    assert "1 replacements linked, 0 already linked (0 to memories not imported" in imported.stdout
    after = json.loads(probe.stdout)
    assert sorted(after["export"], key=lambda r: r["id"]) == sorted(records, key=lambda r: r["id"])
    assert after["recall"] == before


def import_file(email: str, path: Path) -> str:
    """Run `recall import EMAIL FILE` in this process; return what it printed."""
    out = io.StringIO()
    call_command("import_memories", email, str(path), stdout=out, stderr=io.StringIO())
    return out.getvalue()


def test_an_import_skips_what_is_already_there_and_reports_it(cast, tmp_path):
    alices_memories(cast)
    file = tmp_path / "alice.jsonl"
    file.write_text(export("alice@example.com", "--namespace", "travel"), encoding="utf-8")

    first = import_file("charlie@example.com", file)
    second = import_file("charlie@example.com", file)

    lines = [first.strip(), second.strip()]
    assert lines[0].startswith("Imported 2 of 2 memories into charlie@example.com: 0 already there")
    assert lines[1].startswith("Imported 0 of 2 memories into charlie@example.com: 2 already there")
    thread = services.list_memories(user_id=cast.charlie.id, namespace="travel", thread_id="kyoto")
    assert [m["content"] for m in thread] == [
        "I'm going to Kyoto in April.",
        "Book early for the blossoms.",
    ]
    # Alice still has hers: the ids were taken, so Charlie's copies got new ones.
    assert services.count_namespace(user_id=cast.alice.id, namespace="travel") == 2


def test_an_import_run_again_reports_its_links_as_already_there_not_as_made(cast, tmp_path):
    # review145: the second run stored nothing and still said "1 replacements
    # linked", as though it had linked something.
    alices_memories(cast)
    file = tmp_path / "alice.jsonl"
    file.write_text(export("alice@example.com", "--namespace", "default"), encoding="utf-8")

    first = import_file("charlie@example.com", file)
    second = import_file("charlie@example.com", file)

    assert "0 already there" in first and "1 replacements linked, 0 already linked" in first
    assert second.startswith("Imported 0 of 4 memories into charlie@example.com: 4 already there")
    assert "0 replacements linked, 1 already linked" in second


def test_what_a_gone_memory_replaced_is_still_replaced_as_of_then_after_a_round_trip(
    cast, tmp_path
):
    # A replaced by B, B forgotten since: at a moment between, A was not what
    # was held true. The imported history lost B's id (no imported memory
    # holds it) and so answered with A, unmarked, where the source answers
    # nothing.
    def remember(content: str, replaces: str | None = None) -> str:
        return services.remember(
            user_id=cast.alice.id,
            tier=Tier.PRO,
            content=content,
            namespace="gym",
            replaces=replaces,
        )["id"]

    old = remember("The gym is on Elm Street.")
    new = remember("The gym moved to Oak Street.", old)
    with connection.cursor() as cursor:
        cursor.execute("SELECT clock_timestamp()")
        then = cursor.fetchone()[0].isoformat()
    services.forget(user_id=cast.alice.id, mode="by_id", id=new)
    file = tmp_path / "gym.jsonl"
    file.write_text(export("alice@example.com", "--namespace", "gym"), encoding="utf-8")
    import_file("charlie@example.com", file)

    def held(user_id: uuid.UUID) -> list[str]:
        found = services.recall(
            user_id=user_id, query="gym street", namespace="gym", threshold=0, as_of=then
        )
        return [m["content"] for m in found]

    assert held(cast.alice.id) == []
    assert held(cast.charlie.id) == []
    now = services.recall(user_id=cast.charlie.id, query="gym street", namespace="gym")
    assert [m["content"] for m in now] == ["The gym is on Elm Street."]


def test_an_id_named_twice_in_a_file_stops_the_import_at_the_second(cast, tmp_path):
    # Taken in, the second record got the first's vector, and a link from either
    # landed on the other's memory: an export names each memory once.
    same, when = "22222222-2222-4222-8222-222222222222", "2025-01-01T00:00:00Z"
    file = tmp_path / "twice.jsonl"
    file.write_text(
        "".join(
            json.dumps({"id": same, "content": text, "created_at": when}) + "\n"
            for text in (
                "Bananas are a yellow tropical fruit rich in potassium",
                "The Kubernetes cluster runs on three control plane nodes",
            )
        ),
        encoding="utf-8",
    )

    with pytest.raises(CommandError, match=f"line 2: id {same} is named by an earlier record"):
        import_file("charlie@example.com", file)
    assert list(services.export_memories(user_id=cast.charlie.id)) == []


def test_vectors_in_the_file_are_reused_when_the_model_matches(cast, tmp_path):
    alices_memories(cast)
    file = tmp_path / "alice.jsonl"
    file.write_text(export("alice@example.com", "--embeddings"), encoding="utf-8")
    first = json.loads(file.read_text().splitlines()[0])
    assert len(first["embedding"]) == 384

    assert "0 embedded again" in import_file("charlie@example.com", file)


@pytest.mark.parametrize(
    ("embedding", "outcome"),
    [
        # No direction: every search of its namespace put it first, score null.
        (lambda n: [0.0] * n, "1 embedded again"),
        (lambda n: [0.5] * (n - 1), "1 embedded again"),
        # Past float32: inf, and numpy's overflow warning printed with a source line.
        (lambda n: [1e39] * n, "1 embedded again"),
        (lambda n: ["a", "b"], "line 1: embedding must be a list of numbers."),
        (lambda n: [[1, 2], [3]], "line 1: embedding must be a list of numbers."),
        (lambda n: {"a": 1}, "line 1: embedding must be a list of numbers."),
        (lambda n: [True] * n, "line 1: embedding must be a list of numbers."),
    ],
    ids=["zeros", "short", "past-float32", "strings", "ragged", "object", "booleans"],
)
def test_a_vector_that_cannot_be_ranked_is_not_reused(cast, tmp_path, embedding, outcome):
    embedder = embeddings.get_embedder()
    record = {
        "content": "The user keeps bees.",
        "created_at": "2026-01-01T00:00:00Z",
        "embedding_model": embedder.model_id,
        "embedding": embedding(embedder.dimensions),
    }
    file = tmp_path / "vector.jsonl"
    file.write_text(json.dumps(record) + "\n")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", RuntimeWarning)
            said = import_file("alice@example.com", file)
    except CommandError as error:
        said = str(error)

    assert outcome in said
    if "embedded again" in outcome:
        [found] = services.recall(user_id=cast.alice.id, query="bees", mode="semantic")
        assert found["score"] > 0.5


def test_a_file_that_is_not_utf8_is_refused_and_a_byte_order_mark_is_not_content(cast, tmp_path):
    latin = tmp_path / "latin.jsonl"
    latin.write_bytes(b'{"content": "caf\xe9", "created_at": "2026-01-01T00:00:00Z"}\n')
    marked = tmp_path / "marked.jsonl"
    marked.write_bytes(b'\xef\xbb\xbf{"content": "tea", "created_at": "2026-01-01T00:00:00Z"}\n')

    with pytest.raises(CommandError, match="the file is not UTF-8 text, at line 1"):
        import_file("alice@example.com", latin)
    assert "Imported 1 of 1 memories" in import_file("alice@example.com", marked)
    # Read from standard input (not opened as utf-8-sig), it was "line 1 is not valid JSON".
    piped = io.StringIO('\ufeff{"content": "coffee", "created_at": "2026-01-01T00:00:00Z"}\n')
    out = io.StringIO()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sys, "stdin", piped)
        call_command("import_memories", "alice@example.com", "-", stdout=out, stderr=io.StringIO())
    assert "Imported 1 of 1 memories" in out.getvalue()


def linked_then_filler(filler: int) -> tuple[uuid.UUID, uuid.UUID, list[dict[str, Any]]]:
    """Records of an export: a fact, the one that replaced it, then ``filler`` more."""
    old, new = uuid.uuid4(), uuid.uuid4()
    at = "2026-01-02T00:00:00Z"
    records: list[dict[str, Any]] = [
        {
            "id": str(old),
            "content": "Staging runs on pg-1.",
            "created_at": "2026-01-01T00:00:00Z",
            "superseded_by": str(new),
            "superseded_at": at,
        },
        {"id": str(new), "content": "Staging moved to pg-2.", "created_at": at},
    ]
    records += [{"content": f"Filler fact number {n}.", "created_at": at} for n in range(filler)]
    return old, new, records


def test_an_import_stopped_by_a_bad_line_links_what_it_stored(cast, tmp_path):
    # The batches before the bad line were kept, but not their links: a fact
    # the file marked replaced was current beside what replaced it.
    old, new, records = linked_then_filler(150)
    file = tmp_path / "cut.jsonl"
    file.write_text("".join(json.dumps(r) + "\n" for r in records) + '{"content": "cut\n')

    err = io.StringIO()
    with pytest.raises(CommandError) as stopped:
        call_command("import_memories", "alice@example.com", str(file), stderr=err)

    assert str(stopped.value).startswith("line 153 is not valid JSON. The 100 memories before it")
    # The progress line is ended, so the error is not printed at its end.
    assert "imported 100" in err.getvalue() and err.getvalue().endswith("\n")
    assert "(1 replacements linked among them)" in str(stopped.value)
    with tenancy.operator():
        assert Memory.objects.get(id=old).superseded_by == new
    # Imported again once mended: nothing twice, and the link made no version.
    file.write_text("".join(json.dumps(r) + "\n" for r in records))
    assert "Imported 52 of 152 memories" in import_file("alice@example.com", file)
    with tenancy.operator():
        assert Memory.objects.get(id=old).version == 1
        assert not MemoryHistory.objects.filter(memory_id=old, action="superseded").exists()


def test_ctrl_c_during_an_import_says_what_stayed_and_exits_130(cast, tmp_path, monkeypatch):
    # It printed a traceback, after the progress line, with no count.
    from memories.management.commands import import_memories

    shown = import_memories.Command._progress

    def interrupted(self: Any, report: Any) -> None:
        shown(self, report)
        raise KeyboardInterrupt

    monkeypatch.setattr(import_memories.Command, "_progress", interrupted)
    old, new, records = linked_then_filler(148)
    file = tmp_path / "long.jsonl"
    file.write_text("".join(json.dumps(r) + "\n" for r in records))
    err = io.StringIO()
    with pytest.raises(SystemExit) as stopped:
        call_command("import_memories", "alice@example.com", str(file), stderr=err)

    assert stopped.value.code == 130
    assert "\nInterrupted: 100 memories stored by then stay." in err.getvalue()
    with tenancy.tenant(cast.alice.id):
        assert Memory.objects.filter(user=cast.alice).count() == 100
        # What the file marks replaced is not left current beside what replaced it.
        assert Memory.objects.get(id=old).superseded_by == new


def test_a_bad_line_stops_the_import_naming_it(cast, tmp_path):
    file = tmp_path / "bad.jsonl"
    file.write_text('{"content": "fine", "created_at": "2026-01-01T00:00:00Z"}\nnot json\n')

    with pytest.raises(CommandError, match="line 2 is not valid JSON"):
        import_file("alice@example.com", file)


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("content", "nul\x00", "content must not contain NUL characters"),
        ("thread_id", "t\ud800", "thread_id must be valid Unicode text"),
        ("task_id", "t" * 201, "task_id is at most 200 characters"),
        ("agent", "research\u202e", "agent must not hold control or text-direction characters"),
        ("metadata", {"k\x00": 1}, "metadata must not contain NUL characters"),
    ],
)
def test_a_string_the_database_cannot_store_stops_the_import_naming_its_line(
    cast, tmp_path, field, value, message
):
    good = {"content": "fine", "created_at": "2026-01-01T00:00:00Z"}
    file = tmp_path / "bad.jsonl"
    # Blank lines are skipped: the refusal names the file's line, not the record's count.
    file.write_text("\n" + json.dumps(good) + "\n\n" + json.dumps({**good, field: value}) + "\n")

    with pytest.raises(CommandError, match=f"line 4: {message}"):
        import_file("alice@example.com", file)
    assert list(services.export_memories(user_id=cast.alice.id)) == []  # record 1 neither
