"""What a memory must be to be ranked at all: the filters every search mode applies.

``Filters`` turns a search's namespace, metadata, dates, priorities, source
fields and supersession (current memories, or those held at ``as_of``) into
SQL conditions on ``memories``; ``memories/search.py`` builds each mode's
statement around them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from memories.models import PRIORITY_RANK

SOURCE_FILTERS = ("source_kind", "author", "path", "thread_id", "task_id")
# No tool returns an expired memory, even before maintenance purges it.
LIVE = "(expires_at IS NULL OR expires_at > statement_timestamp())"
# Priority breaks ties among results equally relevant to two decimals.
PRIORITY_ORDER = (
    "CASE priority "
    + " ".join(f"WHEN '{name}' THEN {rank}" for name, rank in PRIORITY_RANK.items())
    + " ELSE 0 END"
)
# The columns a search returns: every column a tool shows, never the vector.
COLUMNS = (
    "id, user_id, agent_id, namespace, source_kind, author, path, thread_id, position,"
    " task_id, content, metadata, priority, expires_at, version, created_at, updated_at,"
    " superseded_by, superseded_at"
)


@dataclass(frozen=True)
class Filters:
    """What a memory must be to be ranked at all, in every mode."""

    namespace: str
    metadata: dict[str, Any] = field(default_factory=dict)
    created_after: datetime | None = None  # inclusive
    created_before: datetime | None = None  # exclusive
    priorities: tuple[str, ...] = ()
    # memory_search's source filters, column -> value (SOURCE_FILTERS only).
    sources: dict[str, str] = field(default_factory=dict)
    # Replaced memories (issue 22) are left out unless asked for; ``as_of``
    # ranks what was held true at that moment, replaced since or not.
    include_superseded: bool = False
    as_of: datetime | None = None

    @property
    def until(self) -> datetime | None:
        """``as_of`` as the exclusive bound it is applied as, or None.

        as_of holds to the millisecond, as every timestamp is shown: a
        memory's own created_at (or a history version's timestamp), passed
        back, includes it.
        """
        return self.as_of + timedelta(milliseconds=1) if self.as_of else None

    @property
    def narrowing(self) -> bool:
        """Whether anything besides the namespace limits which memories are ranked."""
        return bool(self.metadata or self.others)

    @property
    def others(self) -> bool:
        """Whether anything besides the namespace and the metadata limits them."""
        return bool(self.created_after or self.created_before or self.priorities or self.sources)

    def clauses(self) -> tuple[list[str], dict[str, Any]]:
        """Return SQL conditions on ``memories`` (besides the user) and their parameters.

        Expired memories never qualify.
        """
        clauses = ["namespace = %(namespace)s", LIVE, *self.held()]
        params: dict[str, Any] = {"namespace": self.namespace, "as_of": self.until}
        if self.metadata:
            clauses.append("metadata @> %(metadata)s::jsonb")
        if self.created_after is not None:
            clauses.append("created_at >= %(created_after)s")
        if self.created_before is not None:
            clauses.append("created_at < %(created_before)s")
        if self.priorities:
            clauses.append("priority = ANY(%(priorities)s)")
        for column, value in self.sources.items():
            if column not in SOURCE_FILTERS:
                raise ValueError(f"not a source filter: {column}")
            clauses.append(f"{column} = %(source_{column})s")
            params[f"source_{column}"] = value
        params.update(
            metadata=json.dumps(self.metadata) if self.metadata else None,
            created_after=self.created_after,
            created_before=self.created_before,
            priorities=list(self.priorities) or None,
            sources=json.dumps(self.sources) if self.sources else None,
        )
        return clauses, params

    def held(self, alias: str = "") -> list[str]:
        """Return the conditions on supersession: current memories, or those held at ``as_of``.

        Applied in the dense scan, and again where the filtered-nearest
        path's rows are joined back to ``memories``; ``recall_rank()`` holds
        the same rule for its lexical candidates and neighbours (migration
        0020), and ``recall_lexical_matches()`` before it chooses them (0024).
        """
        a = f"{alias}." if alias else ""
        if self.as_of is not None:
            return [
                f"{a}created_at < %(as_of)s",
                f"({a}superseded_at IS NULL OR {a}superseded_at >= %(as_of)s)",
            ]
        return [] if self.include_superseded else [f"{a}superseded_by IS NULL"]
