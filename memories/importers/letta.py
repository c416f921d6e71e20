"""Letta: an agent file (``.af``), and lists of archival passages.

Two generations of agent file are read:

* the current one (letta/schemas/agent_file.py): ``{"agents": [...],
  "blocks": [...], "groups", "files", "sources", "tools", "mcp_servers",
  "metadata", "created_at"}``, where each agent names its core memory
  blocks by ``block_ids``;
* the first one (one agent): ``{"name", "core_memory": [{"label", "value",
  "limit", "created_at", ...}], "messages", "tools", ...}``.

Core memory blocks (``human``, ``persona``, ...) are always in a Letta
agent's context, so each becomes one memory of priority ``high``, labelled
in ``imported_from``. Agent files do not carry archival memory yet; its
passages, as Letta's API lists them (``[{"id", "text", "created_at",
"tags", "metadata", "embedding", "embedding_config"}, ...]``), are read
from a ``passages`` (or ``archival_memory``) array at the top level or in an
agent, or from a file that is such a list, one memory each.

An agent's memories go where the mapping says: by default to the user's
agent of the same name (created when missing). A block shared by several
agents is the user's, not one agent's.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from core.errors import ValidationFailed
from memories.importers.base import Record, Refused, Stream, identities, place
from memories.importers.sources import Source, documents, not_array

FORMAT = "letta"
IDENTITIES = {"agent": "agent"}
PASSAGES = ("passages", "archival_memory")
# messages are read one by one and passed over, never held whole.
ARRAYS = frozenset({"agents", "blocks", "core_memory", "messages", *PASSAGES})
# An agent file holds one of these; messages alone are not memories.
HOLDS = ("agents", "blocks", "core_memory", *PASSAGES)


def read(source: Source, *, ids: str | None = None, **_: Any) -> Stream:  # noqa: C901
    mapping = identities(ids, IDENTITIES, flag="--ids")
    names: dict[str, str] = {}  # agent id -> name
    owners: dict[str, list[str]] = {}  # block id -> agent names
    blocks: list[tuple[dict[str, Any], str]] = []
    first_name: str | None = None
    created: Any = None
    for key, index, value, line in documents(
        source, ARRAYS, needs=HOLDS, what="a Letta agent file"
    ):
        where = f"{key or 'record'} {index + 1 if index is not None else ''} (line {line})"
        if key is None:  # a bare list of passages
            yield _passage(value, where, mapping, names)
        elif key == "agents" and index is not None:
            if not isinstance(value, dict):
                yield Refused(where, "not a JSON object")
                continue
            name = str(value.get("name") or value.get("id") or f"agent {index + 1}")
            names[str(value.get("id"))] = name
            for block_id in _listed(value, "block_ids", source.label, line):
                owners.setdefault(str(block_id), []).append(name)
            for inner in PASSAGES:
                for n, passage in enumerate(_listed(value, inner, source.label, line)):
                    yield _passage(passage, f"{name}'s passage {n + 1}", mapping, names, name)
        elif key in ("blocks", "core_memory") and index is not None:
            blocks.append((value, where))
        elif key in PASSAGES and index is not None:
            # Streamed, so it goes to its agent if the file listed that agent
            # before it. Holding passages back until the end would hold every
            # vector of an API export of passages (whose agents are never in
            # the file) in memory.
            yield _passage(value, where, mapping, names)
        elif key == "name" and isinstance(value, str):
            first_name = value
        elif key == "created_at":
            created = value
    # Blocks last: agents may be named after them in the file.
    for value, where in blocks:
        yield _block(value, where, mapping, owners, first_name, created)


def _listed(agent: dict[str, Any], field: str, label: str, line: int) -> list[Any]:
    """Return an agent's ``field``, an array; one that is not stops the import, named."""
    found = agent.get(field)
    if found is None:
        return []
    if not isinstance(found, list):
        raise ValidationFailed(not_array(label, line, f"an agent's `{field}`", found))
    return found


def _block(
    value: Any,
    where: str,
    mapping: dict[str, str],
    owners: dict[str, list[str]],
    agent: str | None,
    created: Any,
) -> Record | Refused:
    if not isinstance(value, dict):
        return Refused(where, "not a JSON object")
    label = str(value.get("label") or "block")
    where = f"block {label} ({where})"
    agents = owners.get(str(value.get("id")), [agent] if agent else [])
    record = Record(
        content=value.get("value"),
        where=where,
        source_id=str(value.get("id") or label),
        created_at=value.get("created_at") or created,
        updated_at=value.get("updated_at"),
        metadata=value.get("metadata")
        if value.get("metadata") is not None
        else value.get("metadata_"),
        priority="high",
    )
    record.extra.update({"memory": "core", "label": label})
    for field in ("description", "limit", "read_only"):
        if value.get(field) is not None:
            record.extra[field] = value[field]
    if len(agents) == 1:
        place(record, {"agent": agents[0]}, mapping)
    elif agents:
        record.extra["agents"] = agents
    return record


def _passage(
    value: Any, where: str, mapping: dict[str, str], names: dict[str, str], agent: str | None = None
) -> Record | Refused:
    if not isinstance(value, dict):
        return Refused(where, "not a JSON object")
    if value.get("is_deleted"):
        return Refused(where, "deleted in Letta")
    record = Record(
        content=value.get("text"),
        where=where,
        source_id=str(value["id"]) if value.get("id") is not None else None,
        created_at=value.get("created_at"),
        updated_at=value.get("updated_at"),
        metadata=value.get("metadata")
        if value.get("metadata") is not None
        else value.get("metadata_"),
    )
    record.extra["memory"] = "archival"
    if value.get("tags"):
        record.extra["tags"] = value["tags"]
    owner = agent or names.get(str(value.get("agent_id")))
    if owner:
        place(record, {"agent": owner}, mapping)
    elif value.get("agent_id"):
        record.extra["agent_id"] = str(value["agent_id"])
    config = value.get("embedding_config") or {}
    vector = value.get("embedding")
    if isinstance(vector, list) and vector and isinstance(config, dict):
        width = config.get("embedding_dim")
        with np.errstate(over="ignore"):  # past float32 is inf: embedded again, not a warning
            array = np.asarray(vector, dtype=np.float32) if _numbers(vector) else None
        # Letta pads stored vectors with zeros to a fixed width.
        if array is not None and isinstance(width, int) and 0 < width < len(array):
            array = array[:width] if not np.any(array[width:]) else None
        if array is not None and config.get("embedding_model"):
            record.vector = array
            record.vector_model = str(config["embedding_model"])
    return record


def _numbers(values: list[Any]) -> bool:
    return all(isinstance(v, int | float) and not isinstance(v, bool) for v in values)
