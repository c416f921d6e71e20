"""`recall import --from FORMAT` given input that looks right and means something else.

Each case is one outside reviewers found (review142): a date without its
dashes read as Unix seconds, an object stored as an agent's name, a CSV
without a content column that "succeeded" with every row refused, and a link
in a notes folder followed to a file outside it. Each must be read as what it
is, or refused in words naming it, never read silently as something else.
"""

from __future__ import annotations

import zipfile

import pytest

from memories.tests.test_import_from import imported, rows

pytestmark = pytest.mark.django_db(transaction=True)


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
