"""basic-memory: a folder of its Markdown notes (a directory, a .zip of one, or one .md file).

A note is YAML frontmatter between ``---`` fences (``title``, ``type``,
``tags``, ``permalink`` and any custom fields), then Markdown whose
observations (``- [category] text #tag``) and relations
(``- relates_to [[Other note]]``) are ordinary lines of it. The body is cut
into chunks exactly as a document given to ``memory_add`` is
(memories/chunking.py): each chunk is one memory under the note's path, with
the title, the permalink, the heading it sits under and its place in the
note as metadata, and the whole frontmatter under ``imported_from``.

The creation time is the frontmatter's ``created`` (or ``date``), else the
file's modification time; basic-memory itself keeps no other.
"""

from __future__ import annotations

import os
import stat
import zipfile
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath
from typing import Any

import yaml

from core.errors import ValidationFailed
from memories import chunking
from memories.importers import unpacking
from memories.importers.base import Record, Refused, Stream
from memories.importers.sources import Source

FORMAT = "basic-memory"
SUFFIXES = (".md", ".markdown")
# A note larger than this is not a note; reading it whole must stay cheap.
NOTE_MAX_BYTES = 8 * 1024 * 1024


# A note as found: its path in the folder, when it was last changed, its bytes.
Found = tuple[str, datetime, bytes]
OUTSIDE = "a link to outside the folder; not read"
HIDDEN = "a link into a hidden file or folder; not read"
NOWHERE = "a link that leads nowhere; not read"


def read(source: Source, **_: Any) -> Stream:
    for found in _notes(source):
        if isinstance(found, Refused):
            yield found
        else:
            yield from note(*found)


def _notes(source: Source) -> Iterator[Found | Refused]:
    path = source.path
    if path.is_dir():
        yield from _folder(path)
    elif source.suffix == ".zip" or zipfile.is_zipfile(path):
        yield from _zipped(source)
    elif source.suffix in SUFFIXES:
        yield source.label, _stamp(path.stat().st_mtime), path.read_bytes()
    else:
        raise ValidationFailed(
            f"{source.label}: give basic-memory's folder, a .zip of it, or one .md note."
        )


def _folder(root: Path) -> Iterator[Found | Refused]:
    """Yield the folder's notes in the order of their paths, hidden folders left out.

    A link (to a note or a folder) that leads outside the folder is refused
    by its path in the folder, and nothing of it is read: a received folder's
    ``notes/x.md -> ~/.ssh/id_rsa`` stored the key as a memory. So is a link
    into a hidden file or folder (``gitcfg.md -> .git/config``), left out as
    what it leads to is, and a link that leads nowhere (to a missing file, or
    round a loop), which was dropped without a word. A note linked from
    inside is read under the link's path too; a folder linked from inside is
    not walked, its notes being read where they are. A hard link is a file
    like any other, not to be told from one, and is read.
    """
    home = root.resolve()
    found: list[tuple[str, Path]] = []
    for folder, dirs, files in os.walk(root):  # links to folders are listed, not walked
        here = Path(folder)
        dirs[:] = [name for name in dirs if not name.startswith(".")]
        found += [(name, here / name) for name in dirs if (here / name).is_symlink()]
        found += [
            (name, here / name)
            for name in files
            if not name.startswith(".") and Path(name).suffix.lower() in SUFFIXES
        ]
    for relative, file in sorted((p.relative_to(root).as_posix(), p) for _, p in found):
        followed = _followed(relative, file, home)
        if followed is not None:
            yield followed


def _followed(relative: str, file: Path, home: Path) -> Found | Refused | None:
    """The note at ``relative`` (through its link, if it is one), refused, or None: a folder."""
    try:
        real = file.resolve(strict=True)
    except (OSError, RuntimeError):  # a missing target, or a loop of links
        return Refused(relative, NOWHERE)
    if not real.is_relative_to(home):
        return Refused(relative, OUTSIDE)
    if any(part.startswith(".") for part in real.relative_to(home).parts):
        return Refused(relative, HIDDEN)
    if not (real.is_file() and Path(relative).suffix.lower() in SUFFIXES):
        return None
    try:
        mtime, data = _read_inside(home, real.relative_to(home).parts)
    except OSError:
        # A part of its path became a link, or the file went, between the look
        # and the read: what it leads to now is not read (review152).
        return Refused(relative, NOWHERE)
    return relative, _stamp(mtime), data


def _read_inside(home: Path, parts: tuple[str, ...]) -> tuple[float, bytes]:
    """Read the note at ``parts`` under ``home``, following no link on the way.

    Each folder of its path and the note itself are opened one within the
    other with ``O_NOFOLLOW``, so a link put in the place of any of them after
    the path was checked fails the read (``OSError``) rather than leading
    outside. At most ``NOTE_MAX_BYTES`` and one more are read: a note larger
    than that (or grown since it was looked at) is read as empty, and refused.
    """
    nofollow = os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    folder = os.open(home, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for part in parts[:-1]:
            inner = os.open(part, nofollow | os.O_DIRECTORY, dir_fd=folder)
            os.close(folder)
            folder = inner
        note = os.open(parts[-1], nofollow, dir_fd=folder)
    finally:
        os.close(folder)
    with os.fdopen(note, "rb") as opened:
        facts = os.fstat(opened.fileno())
        if not stat.S_ISREG(facts.st_mode):
            raise OSError("not a file")
        data = opened.read(NOTE_MAX_BYTES + 1)
    return facts.st_mtime, b"" if len(data) > NOTE_MAX_BYTES else data


def _zipped(source: Source) -> Iterator[Found | Refused]:
    """Yield a zipped folder's notes; a member that is a symbolic link is refused, not followed."""
    try:
        archive = zipfile.ZipFile(source.path)
    except (zipfile.BadZipFile, OSError):
        raise ValidationFailed(f"{source.label}: not a zip archive.") from None
    budget = unpacking.Budget(source.path, source.label)
    with archive:
        infos = sorted(
            (i for i in archive.infolist() if not i.is_dir() and _is_note(i.filename)),
            key=lambda i: i.filename,
        )
        for info in infos:
            if stat.S_ISLNK(info.external_attr >> 16):
                # Its data is the path it points to: neither a note nor to be read.
                yield Refused(info.filename, "a symbolic link; not read")
                continue
            data = b""
            if info.file_size <= NOTE_MAX_BYTES:
                with unpacking.member(archive, info, budget) as stream:
                    data = stream.read()
            yield info.filename, datetime(*info.date_time, tzinfo=UTC), data


def _is_note(name: str) -> bool:
    parts = PurePosixPath(name).parts
    return PurePosixPath(name).suffix.lower() in SUFFIXES and not any(
        part.startswith(".") or part == "__MACOSX" for part in parts
    )


def _stamp(seconds: float) -> datetime:
    return datetime.fromtimestamp(seconds, tz=UTC)


def note(relative: str, mtime: datetime, data: bytes) -> Iterator[Record | Refused]:
    if not data:
        yield Refused(relative, f"empty, or larger than {NOTE_MAX_BYTES // (1024 * 1024)} MB")
        return
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError:
        yield Refused(relative, "not UTF-8 text")
        return
    try:
        front, body = split(text)
    except ValueError as error:
        yield Refused(relative, str(error))
        return
    chunks = chunking.chunk(body.replace("\r\n", "\n"))
    if not chunks:
        yield Refused(relative, "no text besides the frontmatter")
        return
    title = str(front.get("title") or Path(relative).stem)
    permalink = front.get("permalink")
    created = front.get("created", front.get("date", front.get("created_at"))) or mtime
    updated = front.get("modified", front.get("updated", front.get("updated_at"))) or mtime
    for chunk in chunks:
        metadata: dict[str, Any] = {"title": title, "chunk": chunk.position}
        if permalink:
            metadata["permalink"] = str(permalink)
        if chunk.heading:
            metadata["heading"] = chunk.heading
        # Made JSON when the record is stored, where a part that cannot be is left out.
        extra: dict[str, Any] = {"frontmatter": front} if front else {}
        yield Record(
            content=chunk.text,
            where=f"{relative}, chunk {chunk.position + 1}",
            source_id=f"{permalink or relative}#{chunk.position}",
            created_at=created,
            updated_at=updated,
            metadata=metadata,
            extra=extra,
            kind="document",
            path=relative,
        )


class _AliasRefused(yaml.composer.ComposerError):
    pass


class _NoAliases(yaml.SafeLoader):
    """YAML without anchors' aliases: a note's frontmatter has no use for them, and a
    few hundred bytes of nested aliases expand to gigabytes, or refer to themselves."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise _AliasRefused(None, None, "an alias", event.start_mark)
        return super().compose_node(parent, index)


def split(text: str) -> tuple[dict[str, Any], str]:
    """Return a note's frontmatter (a dict, maybe empty) and its body."""
    lines = text.split("\n")
    if not lines or lines[0].strip() != "---":
        return {}, text
    for end in range(1, len(lines)):
        if lines[end].strip() in ("---", "..."):
            break
    else:
        raise ValueError("the frontmatter's closing --- is missing")
    try:
        front = yaml.load("\n".join(lines[1:end]), Loader=_NoAliases)  # noqa: S506 (safe)
    except RecursionError:
        raise ValueError("the frontmatter nests too deeply") from None
    except (ValueError, OverflowError) as error:
        # A value YAML cannot make what it says it is: a date of 2024-13-45, !!int abc.
        raise ValueError(f"the frontmatter holds a value that cannot be read ({error})") from None
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f" at line {mark.line + 2}" if mark is not None else ""
        if isinstance(error, _AliasRefused):
            refused = f"the frontmatter uses a YAML alias (*name){where}: none is accepted"
            raise ValueError(refused) from None
        raise ValueError(f"the frontmatter is not valid YAML{where}") from None
    if front is None:
        front = {}
    if not isinstance(front, dict):
        raise ValueError("the frontmatter is not a YAML mapping")
    return front, "\n".join(lines[end + 1 :])
