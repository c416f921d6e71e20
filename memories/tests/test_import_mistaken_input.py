"""`recall import --from FORMAT` given input that looks right and means something else.

Each case is one outside reviewers found (review142): a date without its
dashes read as Unix seconds, an object stored as an agent's name, a CSV
without a content column that "succeeded" with every row refused, and a link
in a notes folder followed to a file outside it. Each must be read as what it
is, or refused in words naming it, never read silently as something else.
"""

from __future__ import annotations

import json
import zipfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from django.core.management.base import CommandError

from accounts import services as accounts_services
from memories.tests.test_import_from import by_content, imported, rows

pytestmark = pytest.mark.django_db(transaction=True)


def jsonl(path: Path, records: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(record) + "\n" for record in records))
    return path


# dates --------------------------------------------------------------------------


@pytest.mark.parametrize("stamp", ["20240101", 20240101, "20240229"])
def test_a_date_written_without_dashes_is_that_date_not_unix_seconds(cast, tmp_path, stamp):
    source = jsonl(tmp_path / "basic.jsonl", [{"content": "x", "created_at": stamp}])

    out = imported("alice@example.com", "jsonl", source)

    assert "Imported 1 of 1 records" in out
    day = 29 if stamp == "20240229" else 1
    month = 2 if stamp == "20240229" else 1
    assert by_content(cast.alice)["x"]["created_at"] == datetime(2024, month, day, tzinfo=UTC)


@pytest.mark.parametrize(
    ("stamp", "shown"),
    [("2024", "'2024'"), (2024, "2024"), ("202401", "'202401'"), ("20241301", "'20241301'")],
)
def test_a_short_number_is_refused_as_an_ambiguous_date(cast, tmp_path, stamp, shown):
    source = jsonl(
        tmp_path / "short.jsonl",
        [{"content": "short", "created_at": stamp}, {"content": "unix", "created_at": 1700000000}],
    )

    out = imported("alice@example.com", "jsonl", source)

    assert "Imported 1 of 2 records" in out
    assert f"line 1: created_at {shown} is an ambiguous date" in out
    assert by_content(cast.alice)["unix"]["created_at"] == datetime(
        2023, 11, 14, 22, 13, 20, tzinfo=UTC
    )


@pytest.mark.parametrize(
    ("stamp", "when"),
    [
        ("202401011230", datetime(2024, 1, 1, 12, 30, tzinfo=UTC)),
        (202401011230, datetime(2024, 1, 1, 12, 30, tzinfo=UTC)),
        ("20240101123045", datetime(2024, 1, 1, 12, 30, 45, tzinfo=UTC)),
        (20240229235959, datetime(2024, 2, 29, 23, 59, 59, tzinfo=UTC)),
        # Unix seconds and milliseconds stay what they were.
        (1700000000, datetime(2023, 11, 14, 22, 13, 20, tzinfo=UTC)),
        ("1700000000000", datetime(2023, 11, 14, 22, 13, 20, tzinfo=UTC)),
        (1700000000.5, datetime(2023, 11, 14, 22, 13, 20, 500000, tzinfo=UTC)),
    ],
)
def test_twelve_or_fourteen_digits_are_a_date_and_time_not_unix_milliseconds(
    cast, tmp_path, stamp, when
):
    source = jsonl(tmp_path / "long.jsonl", [{"content": "x", "created_at": stamp}])

    out = imported("alice@example.com", "jsonl", source)

    assert "Imported 1 of 1 records" in out
    assert by_content(cast.alice)["x"]["created_at"] == when


@pytest.mark.parametrize(
    ("stamp", "reason"),
    [
        # Digits as written: nine of them, and no Unix time is written with a leading zero.
        ("020240101", "'020240101' is an ambiguous date"),
        ("0202401011230", "'0202401011230' is an ambiguous date"),
        ("202413011230", "'202413011230' is an ambiguous date"),
        ("20240101123061", "'20240101123061' is an ambiguous date"),
        ("-20240101", "'-20240101' is a negative number: a time before 1970"),
        # Unix milliseconds of 2001 read as a date of the year 9783 (review152).
        ("978307200000", "'978307200000' is an ambiguous date"),
        (-1700000000, "-1700000000 is a negative number: a time before 1970"),
    ],
)
def test_digits_that_are_no_date_as_written_are_refused_saying_why(cast, tmp_path, stamp, reason):
    source = jsonl(
        tmp_path / "odd.jsonl",
        [{"content": "odd", "created_at": stamp}, {"content": "fine", "created_at": "20240101"}],
    )

    out = imported("alice@example.com", "jsonl", source)

    assert "Imported 1 of 2 records" in out
    assert f"line 1: created_at {reason}" in out
    assert set(by_content(cast.alice)) == {"fine"}


# identities and tags ------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value", "reason"),
    [
        ("agent", {"x": 1}, "agent must be text, not an object"),
        ("thread", [1, 2], "thread must be text, not a list"),
        ("tags", {"x": 1}, "tags must be a list or text, not an object"),
        ("tags", ["fine", {"x": 1}], "tags must be text, not an object"),
        ("id", {"a": 1}, "id must be text, not an object"),
        ("id", ["a"], "id must be text, not a list"),
    ],
)
def test_an_identity_or_tag_that_is_not_text_refuses_its_record(
    cast, tmp_path, field, value, reason
):
    source = jsonl(
        tmp_path / "odd.jsonl",
        [
            {"content": "odd", field: value},
            {"content": "numbered", "agent": 7, "thread": 8, "id": 9},
        ],
    )

    out = imported("alice@example.com", "jsonl", source)

    assert "Imported 1 of 2 records" in out
    assert f"line 1: {reason}" in out
    # Numbers are text, as mem0's reader takes them.
    numbered = by_content(cast.alice)["numbered"]
    assert (numbered["agent__name"], numbered["thread_id"]) == ("7", "8")
    assert numbered["metadata"]["imported_from"]["id"] == "9"
    names = {agent.name for agent in accounts_services.list_agents(user_id=cast.alice.id)}
    assert "{'x': 1}" not in names


# a CSV without a content column --------------------------------------------------


@pytest.mark.parametrize(
    ("name", "text", "hint"),
    [
        ("notes.csv", "note,when\nhello,2024-01-01\n", ""),
        ("semi.csv", "content;when\nhello;2024-01-01\n", "separated by ';'"),
        ("lines.csv", '{"content": "hello", "agent": "x"}\n', "--from jsonl"),
    ],
)
def test_a_csv_without_a_content_column_stops_at_its_header(cast, tmp_path, name, text, hint):
    path = tmp_path / name
    path.write_text(text)

    with pytest.raises(CommandError) as caught:
        imported("alice@example.com", "csv", path)

    message = str(caught.value)
    assert f"{name}: no content column" in message
    assert "content, text or memory" in message and "--map content=COLUMN" in message
    assert hint in message
    assert rows(cast.alice) == []


def test_a_mapped_content_column_is_not_asked_for_again(cast, tmp_path):
    path = tmp_path / "notes.csv"
    path.write_text("note,when\nhello,2024-01-01\n")

    out = imported("alice@example.com", "csv", path, "--map", "content=note")

    assert "Imported 1 of 1 records" in out


def test_json_lines_where_no_record_has_content_stop_naming_the_fields_looked_for(cast, tmp_path):
    source = jsonl(tmp_path / "body.jsonl", [{"body": "one"}, {"body": "two"}])

    with pytest.raises(CommandError) as caught:
        imported("alice@example.com", "jsonl", source)

    message = str(caught.value)
    assert "body.jsonl: no record has content" in message
    assert "content, text or memory" in message and "--map content=FIELD" in message
    assert rows(cast.alice) == []


# links out of a notes folder ----------------------------------------------------


def test_a_link_out_of_the_notes_folder_is_refused_and_not_read(cast, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "id_rsa.md").write_text("PRIVATE KEY outside the folder\n")
    notes = tmp_path / "notes"
    (notes / "real").mkdir(parents=True)
    (notes / "real" / "fine.md").write_text("A fine note inside the folder.\n")
    (notes / "key.md").symlink_to(outside / "id_rsa.md")
    (notes / "away").symlink_to(outside, target_is_directory=True)
    (notes / "again.md").symlink_to(notes / "real" / "fine.md")

    out = imported("alice@example.com", "basic-memory", notes)

    assert "key.md: a link to outside the folder; not read" in out
    assert "away: a link to outside the folder; not read" in out
    contents = {row["content"] for row in rows(cast.alice)}
    assert not any("PRIVATE KEY" in text for text in contents)
    # A link that stays inside is read, once, under its own path.
    assert {row["path"] for row in rows(cast.alice)} == {"real/fine.md", "again.md"}


def test_a_folder_swapped_for_a_link_after_the_check_is_not_read_through(
    cast, tmp_path, monkeypatch
):
    """review152: the path was checked, then read by its name: a folder of it swapped
    for a link in between (by anyone who may write to the folder as it is imported)
    led the read outside."""
    import shutil

    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "note.md").write_text("PRIVATE KEY outside the folder\n")
    notes = tmp_path / "notes"
    (notes / "sub").mkdir(parents=True)
    (notes / "sub" / "note.md").write_text("A fine note inside the folder.\n")
    checked = Path.is_file

    def swapped_after_the_check(path: Path) -> bool:
        answer = checked(path)
        if path.name == "note.md" and not (notes / "sub").is_symlink():
            shutil.rmtree(notes / "sub")
            (notes / "sub").symlink_to(outside, target_is_directory=True)
        return answer

    monkeypatch.setattr(Path, "is_file", swapped_after_the_check)

    out = imported("alice@example.com", "basic-memory", notes)

    assert "sub/note.md: a link that leads nowhere; not read" in out
    assert not any("PRIVATE KEY" in row["content"] for row in rows(cast.alice))


def test_a_link_in_a_zipped_notes_folder_is_refused_not_followed(cast, tmp_path):
    path = tmp_path / "notes.zip"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("notes/fine.md", "A fine note.\n")
        link = zipfile.ZipInfo("notes/key.md")
        link.external_attr = (0o120777 << 16) | 0x20
        link.create_system = 3  # unix
        archive.writestr(link, "/etc/passwd")

    out = imported("alice@example.com", "basic-memory", path)

    assert "notes/key.md: a symbolic link; not read" in out
    assert {row["content"] for row in rows(cast.alice)} == {"A fine note."}


def test_a_link_that_leads_nowhere_or_into_a_hidden_folder_is_refused(cast, tmp_path):
    notes = tmp_path / "notes"
    (notes / ".git").mkdir(parents=True)
    (notes / ".git" / "config").write_text("[remote] url = https://token@example.com\n")
    (notes / ".hidden.md").write_text("A hidden note.\n")
    (notes / "fine.md").write_text("A fine note.\n")
    (notes / "dangling.md").symlink_to(notes / "missing.md")
    (notes / "gitcfg.md").symlink_to(notes / ".git" / "config")
    (notes / "secret.md").symlink_to(notes / ".hidden.md")

    out = imported("alice@example.com", "basic-memory", notes)

    assert "dangling.md: a link that leads nowhere; not read" in out
    assert "gitcfg.md: a link into a hidden file or folder; not read" in out
    assert "secret.md: a link into a hidden file or folder; not read" in out
    assert {row["content"] for row in rows(cast.alice)} == {"A fine note."}
