"""`recall import --from FORMAT`: records that are odd but not broken, found by a hostile review.

Each must come out as the README says: imported (with what could not be kept
named), or refused with a reason in words, never a codec's or numpy's own
text, and never counted or embedded twice.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from django.core.management.base import CommandError

from core.timestamps import iso
from memories.tests.test_import_from import by_content, imported, rows

pytestmark = pytest.mark.django_db(transaction=True)


def mem0_lines(path: Path, records: list[dict[str, Any]]) -> Path:
    # ensure_ascii keeps a lone surrogate as its \\ud800 escape, as a file would.
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_the_same_memory_across_batches_is_counted_and_embedded_once(cast, tmp_path):
    same = [{"id": str(n), "memory": "The user drinks green tea"} for n in range(600)]
    path = mem0_lines(tmp_path / "dups.jsonl", same)

    dry = imported("alice@example.com", "mem0", path, "--dry-run")
    real = imported("alice@example.com", "mem0", path)

    assert "Would import 1 of 600 records" in dry and "599 skipped as duplicates" in dry
    assert "Imported 1 of 600 records" in real and "599 skipped as duplicates" in real
    assert "0 vectors reused, 1 embedded" in real
    assert len(rows(cast.alice)) == 1


def test_an_id_that_is_not_storable_text_is_left_out_and_named(cast, tmp_path):
    path = mem0_lines(tmp_path / "surr.jsonl", [{"id": "a\udc00b", "memory": "Likes rain"}])

    out = imported("alice@example.com", "mem0", path)

    assert "Imported 1 of 1" in out and "codec" not in out
    source = by_content(cast.alice)["Likes rain"]["metadata"]["imported_from"]
    assert "id" not in source and source["dropped"] == ["id"]


def test_an_id_of_20000_characters_is_kept_cut_with_a_digest(cast, tmp_path):
    long_a, long_b = "a" * 20_000, "a" * 19_999 + "b"
    path = mem0_lines(
        tmp_path / "long.jsonl",
        [{"id": long_a, "memory": "First of two"}, {"id": long_b, "memory": "Second of two"}],
    )

    out = imported("alice@example.com", "mem0", path)

    assert "Imported 2 of 2" in out
    memories = by_content(cast.alice)
    first = memories["First of two"]["metadata"]["imported_from"]["id"]
    second = memories["Second of two"]["metadata"]["imported_from"]["id"]
    assert first.startswith("a" * 160 + "…sha256:") and len(first) < 200
    assert first != second


def test_identities_alike_at_the_start_keep_namespaces_of_their_own(cast, tmp_path):
    stem = "u" * 100
    path = mem0_lines(
        tmp_path / "users.jsonl",
        [
            {"memory": "One user's note", "user_id": stem + "1"},
            {"memory": "Another user's note", "user_id": stem + "2"},
            {"memory": "A spaced user's note", "user_id": "dana smith"},
            {"memory": "A dashed user's note", "user_id": "dana-smith"},
        ],
    )

    out = imported("alice@example.com", "mem0", path)

    assert "Imported 4 of 4" in out
    spaces = {content: row["namespace"] for content, row in by_content(cast.alice).items()}
    assert all(len(space) <= 64 for space in spaces.values())
    assert spaces["One user's note"].startswith("u" * 47 + "-")
    assert spaces["One user's note"] != spaces["Another user's note"]
    # One that fits keeps the namespace it always had, so an import run again
    # after an upgrade finds what it stored: "dana smith" is dana-smith, as before.
    assert spaces["A dashed user's note"] == spaces["A spaced user's note"] == "dana-smith"


def test_an_identity_that_is_an_object_refuses_its_record_in_words(cast, tmp_path):
    path = mem0_lines(
        tmp_path / "obj.jsonl",
        [{"memory": "Odd owner", "user_id": {"x": 1}}, {"memory": "Fine", "user_id": "dana"}],
    )

    out = imported("alice@example.com", "mem0", path)

    assert "Imported 1 of 2" in out
    assert "line 1: user_id must be text, not an object" in out


@pytest.mark.parametrize(
    ("value", "shown"),
    [(1e39, "none is a usable vector, embedded again"), (1e38, "do not match ours")],
    ids=["past-float32", "near-its-limit"],
)
def test_vectors_too_large_to_measure_are_embedded_again_without_a_warning(
    cast, tmp_path, recwarn, value, shown
):
    config = {"embedding_model": "all-MiniLM-L6-v2", "embedding_dim": 384}
    passages = [
        {"id": str(n), "text": f"Passage {n}", "embedding": [value] * 384}
        | {"embedding_config": config}
        for n in range(3)
    ]
    path = tmp_path / "big.af"
    path.write_text(json.dumps({"agents": [], "passages": passages}))

    out = imported("alice@example.com", "letta", path)

    assert shown in out and "nan" not in out
    assert "0 vectors reused, 3 embedded" in out
    assert not [w for w in recwarn if issubclass(w.category, RuntimeWarning)]


@pytest.mark.parametrize(
    ("document", "said"),
    [
        ({"agents": [{"name": "x"}], "blocks": {"a": 1}}, "line 1: `blocks` is an object"),
        (
            {"agents": [{"name": "x", "block_ids": "notalist"}], "blocks": []},
            "line 1: an agent's `block_ids` is text, not an array",
        ),
    ],
    ids=["blocks", "block_ids"],
)
def test_a_letta_file_whose_arrays_are_not_arrays_stops_naming_the_field(
    cast, tmp_path, document, said
):
    path = tmp_path / "agent.af"
    path.write_text(json.dumps(document))

    with pytest.raises(CommandError, match=f"agent.af, {said}"):
        imported("alice@example.com", "letta", path)


@pytest.mark.parametrize(
    ("stamp", "said"),
    [
        # ms: became the year 385; a negative number is refused before it is read (review149).
        (-50_000_000_000, "-50000000000 is a negative number: a time before 1970, not when"),
        ("0001-01-02T00:00:00Z", "0001-01-02T00:00:00.000Z is not when"),
        ("1969-12-31T23:59:59Z", "1969-12-31T23:59:59.000Z is not when"),
        ("9999-12-31T00:00:00Z", "9999-12-31T00:00:00.000Z is not when"),
        (99_999_999_999, "5138-11-16T09:46:39.000Z is not when"),  # 11 digits: seconds
    ],
)
def test_a_time_no_memory_was_written_at_is_refused_naming_the_rule(cast, tmp_path, stamp, said):
    path = mem0_lines(
        tmp_path / "when.jsonl",
        [{"memory": "Odd time", "created_at": stamp}, {"memory": "Fine", "created_at": 0}],
    )

    out = imported("alice@example.com", "mem0", path)

    assert "Imported 1 of 2" in out
    assert f"line 1: created_at {said} a memory was written" in out
    assert by_content(cast.alice)["Fine"]["created_at"] == datetime(1970, 1, 1, tzinfo=UTC)


def test_an_update_before_the_creation_is_refused(cast, tmp_path):
    path = mem0_lines(
        tmp_path / "order.jsonl",
        [{"memory": "Backwards", "created_at": "2025-02-01", "updated_at": "2025-01-01"}],
    )

    assert "line 1: updated_at is before created_at" in imported("alice@example.com", "mem0", path)
    assert rows(cast.alice) == []


@pytest.mark.parametrize(
    ("moment", "written"),
    [
        (datetime(1, 1, 2, tzinfo=UTC), "0001-01-02T00:00:00.000Z"),
        (datetime(385, 7, 25, 7, 6, 40, tzinfo=UTC), "0385-07-25T07:06:40.000Z"),
        (datetime(2026, 3, 1, 9, 30, 0, 250_000, tzinfo=UTC), "2026-03-01T09:30:00.250Z"),
    ],
)
def test_a_year_is_always_written_in_four_digits(moment, written):
    assert iso(moment) == written
    assert datetime.fromisoformat(iso(moment)) == moment.replace(
        microsecond=moment.microsecond // 1000 * 1000
    )
