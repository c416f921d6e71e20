"""A usage event: one tool call, or one refused, to meter, show and bill.

The type sits below the apps because more than one makes events: accounts'
admission builds the event of a call it refuses, the MCP middleware the
event of every call it runs. Billing owns the recorder that stores them
(``billing/usage.py``) and installs it when Django starts (its app
config's ``ready()``), so code below billing hands events over through
``record()`` without importing billing.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Collection
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Protocol

from core import storable

# What an event calls a tool its endpoint does not have. The name a client
# sent is its own to choose: recorded as it came, each made-up name would be
# one more line in the user's usage legend and the admin's filter.
UNKNOWN_TOOL = "unknown"

# The error code of a call cancelled while it ran (the client went away, or
# ``recall stdio`` stopped): no failure of ours, and never sent to a client.
CANCELLED = "cancelled"


def tool_label(name: object, known: Collection[str]) -> str:
    """The name an event records for a call of ``name``: itself if one of ``known``."""
    return name if isinstance(name, str) and name in known else UNKNOWN_TOOL


@dataclass(frozen=True)
class Event:
    user_id: uuid.UUID
    api_key_id: uuid.UUID | None
    request_id: str
    tool_name: str
    success: bool
    latency_ms: int
    tokens_consumed: int = 1
    error_code: str | None = None
    agent_id: uuid.UUID | None = None
    occurred_at: datetime = field(default_factory=lambda: datetime.now(UTC))
    event_id: uuid.UUID = field(default_factory=uuid.uuid4)


class Caller(Protocol):
    """Who made a call, as an event names them (``accounts.callers.AuthContext``)."""

    @property
    def user_id(self) -> uuid.UUID: ...

    @property
    def api_key_id(self) -> uuid.UUID | None: ...

    @property
    def agent_id(self) -> uuid.UUID | None: ...


def event_of(
    caller: Caller,
    tool: str,
    *,
    request_id: str,
    error_code: str | None,
    latency_ms: int,
    tokens_consumed: int = 1,
) -> Event:
    """The event of ``caller``'s call of ``tool``: a success when ``error_code`` is None."""
    return Event(
        user_id=caller.user_id,
        api_key_id=caller.api_key_id,
        agent_id=caller.agent_id,
        request_id=request_id,
        # The name is the client's to send: one the database refused failed
        # the whole batch of its user's events with it.
        tool_name=storable.scrub(tool, max_length=64),
        success=error_code is None,
        error_code=error_code,
        latency_ms=latency_ms,
        tokens_consumed=tokens_consumed,
    )


@dataclass
class Metered:
    """Whether the usage event of the tool call in hand was recorded.

    The HTTP gate takes a rate-limit token before the SDK reads the call, and
    the SDK can refuse it (a malformed ``_meta``, a 2026-era call without its
    envelope) before the middleware that records the event runs. The gate
    then records the refusal itself, so the call still leaves exactly one.
    """

    recorded: bool = False


metered: ContextVar[Metered | None] = ContextVar("recall_metered", default=None)


class Recorder(Protocol):
    def record(self, event: Event) -> None: ...

    def touch_key(self, key_id: uuid.UUID) -> None: ...


_recorder: Callable[[], Recorder] | None = None


def install(recorder: Callable[[], Recorder]) -> None:
    """Name the function that returns the process's recorder (billing does, at start-up)."""
    global _recorder
    _recorder = recorder


def recorder() -> Recorder:
    if _recorder is None:
        raise RuntimeError("No usage recorder is installed: is the billing app installed?")
    return _recorder()


def record(event: Event) -> None:
    """Hand an event to the recorder; it never blocks nor fails the caller."""
    recorder().record(event)


def touch_key(key_id: uuid.UUID) -> None:
    """Note that an API key was used just now (its ``last_used_at``, written in batches)."""
    recorder().touch_key(key_id)
