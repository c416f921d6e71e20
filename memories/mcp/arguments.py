"""The argument types the tool catalogues share, with the limits of memories/validation.py.

The SDK publishes each tool's arguments as JSON Schema from these, and checks
calls against them before a tool runs; memories/validation.py holds the same
limits for every other interface.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from memories import validation

# A namespace as JSON Schema states it: validation.NAMESPACE_PATTERN's characters.
NAMESPACE_PATTERN = f"^[{validation.NAMESPACE_CHARS}]+$"


# The characters and length a namespace may have; what it is for is said beside each use.
NamespaceText = Annotated[
    str, Field(min_length=1, max_length=validation.NAMESPACE_MAX, pattern=NAMESPACE_PATTERN)
]
_NAMESPACE_MEANS = (
    "Namespace grouping related memories, e.g. 'preferences' or 'project:recall'. "
    "1-64 letters, digits and _ - . : / @"
)
Namespace = Annotated[NamespaceText, Field(description=f"{_NAMESPACE_MEANS}.")]
# Where a namespace may be left out: null is the same as leaving it out ("default").
NamespaceOrDefault = Annotated[
    NamespaceText | None, Field(description=f"{_NAMESPACE_MEANS}; null or unset: 'default'.")
]
Metadata = Annotated[
    dict[str, Any] | None,
    Field(
        description=(
            "Optional JSON object of key/value metadata, e.g. "
            '{"source": "conversation", "confidence": 0.95}. At most 16 KB as JSON.'
        ),
    ),
]
FilterValue = str | int | float | bool | None
MetadataFilter = Annotated[
    dict[str, FilterValue] | None,
    Field(
        max_length=validation.FILTER_MAX_KEYS,
        description=(
            "Only return memories whose metadata has all of these key/value pairs (AND). "
            "At most 8 keys; values must be strings, numbers, booleans or null."
        ),
    ),
]
# What a result's score means, for every search tool's output.
SCORE = (
    "Relevance, 0-1, on one scale for every query, namespace and mode: about the chance "
    "that the memory is relevant to the query (0.5 as likely as not; a clear match 0.9 or "
    "more). It is the memory's own: one stored just before or after a strong match may be "
    "listed right after it with a lower score."
)
Threshold = Annotated[
    float | None,
    Field(
        ge=0.0,
        le=1.0,
        # Strict, as the schema says: true or "0.5" was taken as 1.0 or 0.5
        # (an integer is still a number).
        strict=True,
        description=(
            "Minimum score, 0-1: memories scoring less are left out. Leave unset for the "
            "server's default (0.15: drops what is almost surely unrelated); 0.5 keeps what is "
            "more likely relevant than not."
        ),
    ),
]
SearchMode = Annotated[
    Literal["hybrid", "semantic", "lexical"] | None,
    Field(
        description=(
            'How to rank: "hybrid" (words and meaning together; the server\'s usual default), '
            '"semantic" (meaning only, by cosine similarity) or "lexical" (words only, BM25). '
            "Leave unset for the server's default."
        ),
    ),
]
CreatedAfter = Annotated[
    str | None,
    Field(
        max_length=64,
        description=(
            "Only memories created at or after this moment: ISO 8601, such as "
            '"2025-03-01" (midnight UTC) or "2025-03-01T09:30:00Z".'
        ),
    ),
]
CreatedBefore = Annotated[
    str | None,
    Field(
        max_length=64,
        description="Only memories created before this moment (ISO 8601, as created_after).",
    ),
]
MemoryId = Annotated[
    str, Field(description="A memory id (UUID) as returned by remember or recall.")
]
PriorityName = Literal["critical", "high", "medium", "low"]
Priority = Annotated[
    PriorityName | None,
    Field(
        description="How much this memory matters: critical, high, medium (the default) or "
        "low. Among equally relevant results, higher priority comes first."
    ),
]
PriorityFilter = Annotated[
    PriorityName | list[PriorityName] | None,
    Field(description="Only memories of this priority, or of any of these priorities."),
]
ExpiresAt = Annotated[
    str | None,
    Field(
        max_length=64,
        description="When to forget this memory, as ISO 8601 (e.g. 2026-12-31T23:59:00Z). "
        "Expired memories are never returned and are purged soon after.",
    ),
]


def _json_integer(value: object) -> object:
    """Refuse what pydantic's lax mode would turn into an integer ("5", true): the schema
    says integer. A whole float (5.0) is still one, as JSON does not tell them apart."""
    if isinstance(value, str | bool):
        raise ValueError("not an integer")  # worded from the schema (core/wording.py)
    return value


# After an integer argument's Field, not before (the schema would lose its bounds):
# Annotated[int, Field(...), JsonInteger].
JsonInteger = BeforeValidator(_json_integer)
TtlSeconds = Annotated[
    int | None,
    Field(
        ge=1,
        le=validation.TTL_MAX,
        description="Forget this memory after this many seconds (instead of expires_at).",
    ),
    JsonInteger,
]
Background = Annotated[
    bool,
    Field(
        alias="async",
        strict=True,  # "yes" or 1 is no boolean
        description="Store in the background and return at once with a job_id; "
        "check it with job_status. Validation and the quota are checked before it returns.",
    ),
]
IdempotencyKey = Annotated[
    str | None,
    Field(
        min_length=1,
        max_length=validation.IDEMPOTENCY_KEY_MAX,
        description="With async: your own key for this request. Retrying with the same key "
        "returns the first job instead of queuing another.",
    ),
]
ThreadId = Annotated[
    str | None,
    Field(
        min_length=1,
        max_length=validation.LABEL_MAX,
        description="A conversation or session id; messages get a new one if unset.",
    ),
]


class Message(BaseModel):
    # An unknown field is refused by name, never dropped: "nmae" is a typo.
    model_config = ConfigDict(extra="forbid")

    role: str = Field(
        min_length=1, max_length=validation.ROLE_MAX, description="user, assistant, system, tool..."
    )
    content: str = Field(min_length=1, max_length=validation.CONTENT_MAX)
    name: str | None = Field(None, max_length=validation.LABEL_MAX, description="Who spoke.")
    timestamp: str | None = Field(None, max_length=64, description="When, as ISO 8601.")


Purge = Annotated[
    bool,
    Field(
        strict=True,
        description="Also erase the deleted memories' history now. Without it, history is "
        "kept for the retention period (30 days by default) so deletions can be reviewed.",
    ),
]
# Knowledge updates (issue 22).
Replaces = Annotated[
    str | None,
    Field(
        max_length=64,
        description="The id of an older memory this one replaces (the fact changed). The "
        "older memory is kept, marked as replaced, and left out of searches from now on.",
    ),
]


class MayReplace(BaseModel):
    """An output item: a kept memory that may hold an earlier value of the stored fact."""

    id: str
    content: str


MAY_REPLACE = (
    "Current memories that may state an earlier value of the same fact, which the server "
    "was not sure enough to replace; absent when none. If one does, call again with the "
    "same content and replaces set to its id: nothing new is stored, the link is made."
)
MAY_BE_REPLACED_BY = (
    "Only on a current memory a newer result in this list likely restates with a later "
    "value, which the server was not sure enough to link: that result's id. Prefer the "
    "newer. If it does replace this one, call remember with the newer's content and "
    "replaces set to this id: nothing new is stored, the link is made."
)
IncludeSuperseded = Annotated[
    bool,
    Field(
        strict=True,
        description="Also return memories a later memory replaced, each marked with "
        "superseded_by and superseded_at. Off by default: only current memories.",
    ),
]
AsOf = Annotated[
    str | None,
    Field(
        max_length=64,
        description="Answer from what was held true at this moment (ISO 8601; without a "
        "time zone, UTC; a date alone, its midnight): memories created by then and not yet "
        "replaced then, marked if replaced since, each shown as its version then. Not with "
        "include_superseded.",
    ),
]
# An as_of result's version field (an output field; its argument is AsOf).
AS_OF_VERSION = (
    "Only with as_of: the version shown (see memory_history), the memory's latest at that "
    "moment; content, metadata and priority are that version's."
)
SupersededListing = Annotated[
    Literal["exclude", "include", "only"],
    Field(
        description="Replaced memories: left out (exclude, the default), listed too "
        "(include) or listed alone (only)."
    ),
]
