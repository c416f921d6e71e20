"""Readers for other memory servers' exports and storage, one module per format.

Each reader takes a ``sources.Source`` and yields ``base.Record`` or
``base.Refused`` values as a stream (see base.py); ``run.run_import`` turns
them into Recall's memories through the memories services, in batches. The formats,
what maps to what, and the ``imported_from`` metadata key are described in
the README's "Moving from another memory server".
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from memories.importers import basic_memory, generic, letta, mcp_memory_service, mem0, openmemory
from memories.importers.base import IMPORTED_FROM, Stream
from memories.importers.sources import Source

Reader = Callable[..., Stream]

READERS: dict[str, Reader] = {
    "mem0": mem0.read,
    "openmemory": openmemory.read,
    "mcp-memory-service": mcp_memory_service.read,
    "basic-memory": basic_memory.read,
    "letta": letta.read,
    "jsonl": generic.read_jsonl,
    "csv": generic.read_csv,
}
FORMATS = tuple(READERS)

__all__ = ["FORMATS", "IMPORTED_FROM", "READERS", "Source", "read"]


def read(fmt: str, source: Source, **options: Any) -> Stream:
    return READERS[fmt](source, **options)
