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
    """A binary stream that takes what is read from it out of a ``Budget``."""

    def __init__(self, inner: Readable, budget: Budget) -> None:
        self._inner = inner
        self._budget = budget

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        data = self._inner.read(len(buffer))
        self._budget.take(len(data))
        buffer[: len(data)] = data
        return len(data)


def metered(inner: Readable, budget: Budget) -> io.BufferedReader:
    """``inner`` read through ``budget``, buffered."""
    return io.BufferedReader(Metered(inner, budget))
