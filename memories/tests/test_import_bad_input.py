"""`recall import --from FORMAT` given hostile, damaged or mistaken input.

Each case was found by feeding the importers files they were not written
for: it must stop with a message naming the file, or refuse (or trim) the one
record, never crash nor "succeed" with nothing.
"""

from __future__ import annotations

import gzip
import json
import zipfile
from pathlib import Path
from typing import Any

import pytest
from django.core.management.base import CommandError

from memories.tests.test_import_from import by_content, imported, rows

pytestmark = pytest.mark.django_db(transaction=True)


def deep(levels: int) -> Any:
    value: Any = "bottom"
    for _ in range(levels):
        value = [value]
    return value


def mem0_file(path: Path, extra: dict[str, Any]) -> Path:
    path.write_text(
        json.dumps(
            [{"id": "a", "memory": "fine record"}, {"id": "b", "memory": "odd record"} | extra]
        )
    )
    return path


def letta_file(path: Path, extra: dict[str, Any]) -> Path:
    passages = [{"id": "a", "text": "fine record"}, {"id": "b", "text": "odd record"} | extra]
    path.write_text(json.dumps({"agents": [], "passages": passages}))
    return path


def openmemory_file(path: Path, extra: dict[str, Any]) -> Path:
    lines = [{"id": "a", "content": "fine record"}, {"id": "b", "content": "odd record"} | extra]
    packed = gzip.compress("".join(json.dumps(line) + "\n" for line in lines).encode())
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("memories.jsonl.gz", packed)
    return path


# An extra field each format keeps under imported_from.
WRITERS = {
    "mem0": (mem0_file, "m.json", "weird"),
    "letta": (letta_file, "l.af", "tags"),
    "openmemory": (openmemory_file, "o.zip", "categories"),
}


@pytest.mark.parametrize("fmt", list(WRITERS))
def test_an_extra_field_nested_hundreds_deep_is_left_out_and_the_memory_kept(cast, tmp_path, fmt):
    # 600 levels exhausted the recursion limit while it was made JSON: the
    # whole import stopped with a RecursionError.
    write, name, field = WRITERS[fmt]
    path = write(tmp_path / name, {field: deep(600)})

    out = imported("alice@example.com", fmt, path)

    assert "Imported 2 of 2 records" in out
    odd = by_content(cast.alice)["odd record"]["metadata"]["imported_from"]
    assert odd["dropped"] == [field] and field not in odd


@pytest.mark.parametrize(
    ("value", "kept"),
    [(deep(30), {"small": 1}), ("x" * 20_000, {"small": 1})],
    ids=["30 deep", "20 KB"],
)
def test_an_extra_field_too_large_to_keep_costs_only_its_copy(cast, tmp_path, value, kept):
    # The memory was refused, and the reason blamed "metadata", which was fine.
    path = mem0_file(tmp_path / "m.json", {"weird": value, "metadata": {"topic": "x"}} | kept)

    out = imported("alice@example.com", "mem0", path)

    assert "Imported 2 of 2 records" in out and "0 refused" in out
    odd = by_content(cast.alice)["odd record"]["metadata"]
    assert odd["topic"] == "x"
    assert odd["imported_from"]["dropped"] == ["weird"]
    assert odd["imported_from"]["small"] == 1 and "weird" not in odd["imported_from"]


@pytest.mark.parametrize(
    ("extra", "listed"),
    [
        # A field whose name alone is past the limit: the list of what was
        # left out took the metadata over it again, and the memory was refused.
        ({"k" * 20_000: 1}, ["k" * 64]),
        # Thousands of small fields: dropped largest first, each sized once
        # (sizing the whole after every drop took minutes), and listed in part.
        ({f"f{n:05}": "v" * 10 for n in range(5_000)}, None),
    ],
    ids=["a long name", "thousands of fields"],
)
def test_what_is_left_out_never_costs_the_memory(cast, tmp_path, extra, listed):
    path = mem0_file(tmp_path / "m.json", extra)

    out = imported("alice@example.com", "mem0", path)

    assert "Imported 2 of 2 records" in out and "0 refused" in out
    dropped = by_content(cast.alice)["odd record"]["metadata"]["imported_from"]["dropped"]
    if listed is not None:
        assert dropped == listed
    else:
        assert len(dropped) == 11 and dropped[-1].endswith("more")


def test_the_sources_own_metadata_too_deep_is_still_refused_as_metadata(cast, tmp_path):
    path = mem0_file(tmp_path / "m.json", {"metadata": {"a": deep(30)}})

    out = imported("alice@example.com", "mem0", path)

    assert "Imported 1 of 2 records" in out
    assert "record 2 (line 1): metadata must not nest deeper than 8 levels" in out


def test_frontmatter_nested_hundreds_deep_refuses_only_its_note(cast, tmp_path):
    # PyYAML itself ran out of recursion: the import stopped.
    (tmp_path / "deep.md").write_text("---\na: " + "[" * 2000 + "]" * 2000 + "\n---\nDeep.\n")
    (tmp_path / "fine.md").write_text("---\ntitle: Fine\n---\nThe user likes tea.\n")

    out = imported("alice@example.com", "basic-memory", tmp_path)

    assert "deep.md: the frontmatter nests too deeply" in out
    assert [row["content"] for row in rows(cast.alice)] == ["The user likes tea."]


def zipped(path: Path, name: str, data: bytes, method: int = zipfile.ZIP_DEFLATED) -> Path:
    with zipfile.ZipFile(path, "w", compression=method) as archive:
        archive.writestr(name, data)
    return path


def bad_deflate(path: Path, name: str, data: bytes) -> Path:
    zipped(path, name, data * 50)
    raw = bytearray(path.read_bytes())
    start = 30 + len(name)  # the member's packed data, after its local header
    raw[start + 2 : start + 12] = b"\xff" * 10
    path.write_bytes(bytes(raw))
    return path


def bad_crc(path: Path, name: str, data: bytes) -> Path:
    zipped(path, name, data, zipfile.ZIP_STORED)
    raw = bytearray(path.read_bytes())
    raw[30 + len(name)] ^= 0x20  # the first byte of the member: its CRC no longer holds
    path.write_bytes(bytes(raw))
    return path


def bad_header(path: Path, name: str, data: bytes) -> Path:
    zipped(path, name, data)
    raw = bytearray(path.read_bytes())
    raw[0:4] = b"XXXX"  # the member's local header, which the central directory points to
    path.write_bytes(bytes(raw))
    return path


NOTE = b"---\ntitle: A note\n---\nThe user likes tea, and more tea, and then some.\n"
MEMORIES = json.dumps({"memories": [{"id": "a", "content": "fine record"}] * 20}).encode()
LINES = gzip.compress(b'{"id": "a", "content": "fine record"}\n' * 20)


@pytest.mark.parametrize("damage", [bad_deflate, bad_crc, bad_header])
@pytest.mark.parametrize(
    ("fmt", "member", "data"),
    [
        ("basic-memory", "notes/a.md", NOTE),
        ("openmemory", "memories.json", MEMORIES),
        ("openmemory", "memories.jsonl.gz", LINES),
    ],
    ids=["basic-memory", "openmemory-json", "openmemory-lines"],
)
def test_a_damaged_archive_member_is_refused_by_name(cast, tmp_path, damage, fmt, member, data):
    # basic-memory stopped with zipfile.BadZipFile or zlib.error from the command.
    archive = damage(tmp_path / "export.zip", member, data)

    with pytest.raises(CommandError, match=rf"export\.zip:{member}: the archive is damaged"):
        imported("alice@example.com", fmt, archive)
    assert rows(cast.alice) == []


LETTA_AGENT = {"agents": [{"id": "agent-1", "name": "companion"}], "blocks": [], "metadata": {}}
MEM0_RESULTS = {"results": [{"id": "a", "memory": "Likes tea"}], "count": 1}
MEM0_ONE = {"id": "a", "memory": "Likes tea", "user_id": "dana"}
MEM0_SAYS = r"no `results` or `memories` array; is this a mem0 export\?"
LETTA_SAYS = (
    r"no `agents`, `blocks`, `core_memory`, `passages` or `archival_memory` array;"
    r" is this a Letta agent file\?"
)


@pytest.mark.parametrize(
    ("fmt", "document", "said"),
    [
        ("mem0", LETTA_AGENT, MEM0_SAYS),
        ("mem0", MEM0_ONE, MEM0_SAYS),
        ("letta", MEM0_RESULTS, LETTA_SAYS),
    ],
    ids=["letta-as-mem0", "one-memory-as-mem0", "mem0-as-letta"],
)
def test_a_file_of_another_shape_stops_naming_what_was_expected(
    cast, tmp_path, fmt, document, said
):
    # Each "succeeded": Imported 0 of 0 records.
    path = tmp_path / "x.json"
    path.write_text(json.dumps(document))

    with pytest.raises(CommandError, match=rf"x\.json: {said}"):
        imported("alice@example.com", fmt, path)


def test_an_openmemory_json_without_memories_stops_naming_it(cast, tmp_path):
    archive = zipped(tmp_path / "export.zip", "memories.json", json.dumps(MEM0_RESULTS).encode())

    with pytest.raises(CommandError, match=r"export\.zip:memories\.json: no `memories` array"):
        imported("alice@example.com", "openmemory", archive)


@pytest.mark.parametrize(
    ("fmt", "document"),
    [
        ("mem0", {"results": [], "count": 0}),
        ("mem0", []),
        ("letta", {"agents": [], "blocks": []}),
        ("letta", []),
    ],
)
def test_an_export_that_is_empty_is_still_zero_records(cast, tmp_path, fmt, document):
    path = tmp_path / "x.json"
    path.write_text(json.dumps(document))

    assert "Imported 0 of 0 records" in imported("alice@example.com", fmt, path)


@pytest.mark.parametrize(
    ("fmt", "name", "line"), [("csv", "big.csv", 3), ("jsonl", "big.jsonl", 2)]
)
def test_a_field_past_128_kb_refuses_only_its_record(cast, tmp_path, fmt, name, line):
    # The csv module's default limit (131,072) stopped the whole CSV import;
    # JSON Lines refused the one record. Both now refuse it alone.
    big = "x" * 140_000
    path = tmp_path / name
    if fmt == "csv":
        path.write_text(f"content\nfirst\n{big}\nlast\n")
    else:
        path.write_text("".join(json.dumps({"content": c}) + "\n" for c in ("first", big, "last")))

    out = imported("alice@example.com", fmt, path)

    assert "Imported 2 of 3 records" in out
    assert f"line {line}: content is 140,000 characters; the maximum is 50,000" in out
    assert set(by_content(cast.alice)) == {"first", "last"}


def test_a_json_file_cut_inside_a_string_is_reported_in_a_whole_sentence(cast, tmp_path):
    # It said "not valid JSON (Unterminated string starting).", cut short.
    path = tmp_path / "cut.json"
    path.write_text('[{"id": "1", "memory": "cut off')

    with pytest.raises(CommandError) as raised:
        imported("alice@example.com", "mem0", path)

    assert str(raised.value) == "cut.json, line 1: not valid JSON (a string with no closing quote)."


def test_a_note_whose_frontmatter_holds_a_date_that_does_not_exist_is_refused_in_a_sentence(
    cast, tmp_path
):
    # It said only "month must be in 1..12": Python's words, no frontmatter named.
    folder = tmp_path / "notes"
    folder.mkdir()
    (folder / "date.md").write_text("---\ncreated: 2024-13-45\n---\nThe note's text.\n")
    (folder / "fine.md").write_text("---\ncreated: 2024-02-01\n---\nAnother note.\n")

    out = imported("alice@example.com", "basic-memory", folder)

    assert "date.md: the frontmatter holds a value that cannot be read (month must be in" in out
    assert set(by_content(cast.alice)) == {"Another note."}


def test_a_raw_nul_in_json_is_reported_in_a_whole_sentence(cast, tmp_path):
    # It said "not valid JSON (Invalid control character at).", cut short.
    path = tmp_path / "nul.json"
    path.write_bytes(b'[{"id": "1", "memory": "raw\x00nul"}]')

    with pytest.raises(CommandError) as raised:
        imported("alice@example.com", "mem0", path)

    assert str(raised.value) == (
        "nul.json, line 1: not valid JSON"
        " (a control character, such as NUL or a tab, not escaped in a string)."
    )
