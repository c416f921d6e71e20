"""A bound on what an archive may unpack to, so that a small upload cannot be a large import.

A zip or gzip of zeros packs a thousand to one: a 600 KB upload held an
import worker (which also runs background adds) for minutes while it unpacked
600 MB that held nothing. Real exports of text pack five to twenty to one. An
import may unpack ``RATIO`` times its archive's size, and never less than
``FLOOR``; past that it stops, naming the archive.
"""

from __future__ import annotations

import io
import os
import zipfile
import zlib
from pathlib import Path
from typing import Any, Protocol

from core.errors import ValidationFailed

RATIO = 100
FLOOR = 64 * 1024 * 1024


class Budget:
    """How many unpacked bytes an archive may still yield."""

    def __init__(self, archive: Path | str, label: str) -> None:
        packed = os.path.getsize(archive)
        self.limit = max(FLOOR, RATIO * packed)
        self.left = self.limit
        self.label = label

    def take(self, count: int) -> None:
        self.left -= count
        if self.left < 0:
            raise ValidationFailed(
                f"{self.label}: unpacks to more than {self.limit // (1024 * 1024)} MB, over"
                f" {RATIO} times its packed size; an export of text packs far less tightly."
                " Unpack it and import what it holds."
            )


class Readable(Protocol):
    def read(self, size: int = ..., /) -> bytes: ...


class Metered(io.RawIOBase):
    """A binary stream that takes what is read from it out of a ``Budget``.

    Given a ``label``, it is a zip member's, and damage found while reading
    it (a bad CRC, deflate data that does not inflate) is refused naming it.
    """

    def __init__(self, inner: Readable, budget: Budget | None, label: str | None = None) -> None:
        self._inner = inner
        self._budget = budget
        self._label = label

    def readable(self) -> bool:
        return True

    def close(self) -> None:
        # A member's stream is ours to close: the archive's file stays open
        # while any member's is.
        if self._label is not None and not self.closed:
            close = getattr(self._inner, "close", None)
            if close is not None:
                close()
        super().close()

    def readinto(self, buffer: Any) -> int:
        if self._label is None:
            data = self._inner.read(len(buffer))
        else:
            try:
                data = self._inner.read(len(buffer))
            except (zipfile.BadZipFile, zlib.error, EOFError, OSError):
                raise damaged(self._label) from None
        if self._budget is not None:
            self._budget.take(len(data))
        buffer[: len(data)] = data
        return len(data)


def metered(inner: Readable, budget: Budget) -> io.BufferedReader:
    """``inner`` read through ``budget``, buffered."""
    return io.BufferedReader(Metered(inner, budget))


def member(
    archive: zipfile.ZipFile, name: str | zipfile.ZipInfo, budget: Budget, *, count: bool = True
) -> io.BufferedReader:
    """Open a zip archive's member, read through ``budget``; damage in it is refused by name.

    ``count=False`` when what is read is unpacked further (a gzip inside):
    the caller counts what that unpacks to instead.

    Without this, a damaged member stopped an import with zipfile's or zlib's
    own exception, named by neither archive nor member.
    """
    label = f"{budget.label}:{name.filename if isinstance(name, zipfile.ZipInfo) else name}"
    try:
        raw = archive.open(name)
    except (zipfile.BadZipFile, zlib.error, EOFError, OSError):
        raise damaged(label) from None
    return io.BufferedReader(Metered(raw, budget if count else None, label))


def damaged(label: str) -> ValidationFailed:
    return ValidationFailed(f"{label}: the archive is damaged.")
