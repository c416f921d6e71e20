"""The importers read files as streams: a JSON document a value at a time, vec0 chunks in place."""

from __future__ import annotations

import io
import json
import random
import sqlite3
import struct

import numpy as np
import pytest

from core.errors import ValidationFailed
from memories.importers import Source, jsonstream, read
from memories.tests.importing import mcp_memory_service_db


def items(text: str, arrays: frozenset[str] = frozenset({"results"})) -> list[tuple]:
    return list(jsonstream.Events(io.StringIO(text), "f.json").items(arrays))


def random_value(rng: random.Random, depth: int = 0):
    kind = rng.choice(["str", "num", "int", "list", "dict", "lit"] if depth < 3 else ["str", "num"])
    if kind == "str":
        return "".join(rng.choice('ab"\\ é\n\t{}[],:x') for _ in range(rng.randint(0, 12)))
    if kind == "num":
        return rng.uniform(-1e6, 1e6)
    if kind == "int":
        return rng.randint(-(10**12), 10**12)
    if kind == "lit":
        return rng.choice([True, False, None])
    if kind == "list":
        return [random_value(rng, depth + 1) for _ in range(rng.randint(0, 4))]
    return {f"k{n}": random_value(rng, depth + 1) for n in range(rng.randint(0, 4))}


@pytest.mark.parametrize("read_chars", [1, 3, 7, 64])
def test_values_cut_anywhere_by_the_reads_come_out_whole(monkeypatch, read_chars):
    monkeypatch.setattr(jsonstream, "READ_CHARS", read_chars)
    rng = random.Random(read_chars)
    records = [random_value(rng) for _ in range(60)]
    document = json.dumps(
        {"count": 60, "results": records, "next": None}, indent=rng.choice([None, 2])
    )

    found = items(document)

    assert [value for key, index, value, _ in found if key == "results"] == records
    assert [(key, value) for key, index, value, _ in found if index is None] == [
        ("count", 60),
        ("next", None),
    ]


def test_a_large_document_is_never_held_whole(monkeypatch):
    monkeypatch.setattr(jsonstream, "READ_CHARS", 4096)
    record = {"id": "x" * 36, "memory": "y" * 200, "metadata": {"n": 1}}
    document = json.dumps({"results": [record] * 20_000})  # about 5 MB
    events = jsonstream.Events(io.StringIO(document), "f.json")
    largest = 0
    count = 0
    for _ in events.items(frozenset({"results"})):
        largest = max(largest, len(events.buf))
        count += 1

    assert count == 20_000
    assert largest < 16 * 1024  # a read or two, never the 5 MB


def test_a_fault_names_its_line_even_deep_in_a_large_file(monkeypatch):
    monkeypatch.setattr(jsonstream, "READ_CHARS", 4096)
    lines = ['{"results": ['] + ['  {"memory": "fine"},'] * 5_000 + ['  {"memory": "bad" "x": 1},']
    lines += ['  {"memory": "fine"}'] * 10 + ["]}"]

    with pytest.raises(ValidationFailed, match=r"f\.json, line 5002: not valid JSON"):
        items("\n".join(lines))


@pytest.mark.parametrize(
    "text, message",
    [
        ("", "expected a JSON array or object, found nothing"),
        ('"just a string"', "expected a JSON array or object"),
        ('{"results": [1, 2]} extra', "unexpected text after the JSON document"),
        ('{"results": [1, 2}', "line 1: expected ',' or ']'"),
        ('{"results": [{"a": "unterminated', "line 1: not valid JSON"),
        # Python's limit on an integer's digits raised a bare ValueError: a traceback.
        ('{"results": [{"n": ' + "9" * 5000 + "}]}", "a number too long to read"),
    ],
)
def test_documents_that_are_not_json_are_refused_clearly(text, message):
    with pytest.raises(ValidationFailed, match=message):
        items(text)


def test_a_vec0_slot_is_taken_only_when_valid_and_naming_its_row(tmp_path):
    rows = [{"content": f"memory {n}", "created_at": 1.7e9 + n} for n in range(5)]
    vectors = np.eye(5, 384, dtype=np.float32)
    db = mcp_memory_service_db(tmp_path / "m.db", rows, lambda texts: vectors[: len(texts)])
    with sqlite3.connect(db) as conn:
        validity, rowids = conn.execute(
            "SELECT validity, rowids FROM memory_embeddings_chunks"
        ).fetchone()
        validity = bytearray(validity)
        validity[0] &= ~(1 << 1)  # slot 1 (memory 2) deleted
        rowids = bytearray(rowids)
        struct.pack_into("<q", rowids, 3 * 8, 999)  # slot 3 names another row
        conn.execute(
            "UPDATE memory_embeddings_chunks SET validity = ?, rowids = ?",
            (bytes(validity), bytes(rowids)),
        )

    found = list(read("mcp-memory-service", Source.at(db)))

    assert [r.content for r in found] == [f"memory {n}" for n in range(5)]
    taken = [r.vector is not None for r in found]
    assert taken == [True, False, True, False, True]
    assert np.array_equal(found[4].vector, vectors[4])
    assert found[0].vector_model == "all-MiniLM-L6-v2"


@pytest.mark.parametrize(
    "change",
    [
        "UPDATE memory_embeddings_chunks SET validity = CAST(validity AS TEXT)",
        "UPDATE memory_embeddings_rowids SET chunk_offset = 'x' || chunk_offset",
    ],
    ids=["validity-as-text", "offset-as-text"],
)
def test_a_vec0_table_holding_text_where_numbers_and_blobs_belong_yields_no_vector(
    tmp_path, change
):
    # SQLite keeps any type a row is given: bytes() and < on text raised a traceback.
    db = mcp_memory_service_db(
        tmp_path / "m.db", [{"content": "memory"}], lambda texts: np.eye(1, 384, dtype=np.float32)
    )
    with sqlite3.connect(db) as conn:
        conn.execute(change)

    [record] = list(read("mcp-memory-service", Source.at(db)))

    assert record.content == "memory" and record.vector is None


def test_a_database_without_vectors_yields_records_to_embed(tmp_path):
    db = mcp_memory_service_db(tmp_path / "m.db", [{"content": "plain"}], None)

    [record] = list(read("mcp-memory-service", Source.at(db)))

    assert record.content == "plain" and record.vector is None
