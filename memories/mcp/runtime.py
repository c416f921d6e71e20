"""How a tool body runs: one decorator for every tool of every catalogue.

``@tool`` (or ``tool(failure=...)`` for a catalogue with its own error shape)
wraps a tool function so that each call gets fresh database connection
state, finds its caller (set by the HTTP gate or the stdio runner, never from
tool arguments) through ``caller()``, and turns every error into an error
result: a ``RecallError`` as itself, anything else as ``internal_error``,
``unavailable`` or (a race PostgreSQL settled by rolling the call back, met
on each of three runs) ``conflict``, logged without its text. The wrapper keeps the function's
name, docstring and signature, which the SDK publishes as the tool.

Tools are synchronous: the SDK runs them in worker threads, where Django's
transactions work (async code cannot hold one).
"""

from __future__ import annotations

import functools
import inspect
import json
import logging
import random
import time
import typing
from collections.abc import Callable, Mapping
from typing import Any, ParamSpec

from django.db import close_old_connections, connection
from mcp_types import CallToolResult, TextContent
from pydantic import BaseModel

from accounts import auth
from core import errors, outage
from core.errors import InternalError, RecallError
from core.logging import describe_exception

# The tools' own logger, as before they shared this runtime.
logger = logging.getLogger("memories.tools")

Shape = Callable[[RecallError], CallToolResult]


class ErrorDetail(BaseModel):
    code: str
    message: str


class ErrorOutput(BaseModel):
    error: ErrorDetail


Arguments = ParamSpec("Arguments")


def success(data: Mapping[str, object], text: str | None = None) -> CallToolResult:
    return CallToolResult(
        content=[TextContent(type="text", text=text if text is not None else compact(data))],
        structured_content=dict(data),
    )


def failure(error: RecallError) -> CallToolResult:
    """Recall's error result: ``{"error": {"code", "message"}}``, as structured content and text."""
    payload = errors.body(error.code, error.message)
    return CallToolResult(
        content=[TextContent(type="text", text=compact(payload))],
        structured_content=payload,
        is_error=True,
    )


def compact(data: Any) -> str:
    return json.dumps(data, ensure_ascii=False, separators=(",", ":"))


def caller() -> auth.AuthContext:
    """Return who this call acts for."""
    found = auth.current.get()
    if found is None:  # the gate and the stdio runner always set it
        raise InternalError("No authenticated caller for this request.")
    return found


def tool(fn: Callable[Arguments, CallToolResult] | None = None, *, failure: Shape = failure) -> Any:
    """Make ``fn`` a tool body: used bare (``@tool``) or with the catalogue's error shape."""

    def decorate(body: Callable[Arguments, CallToolResult]) -> Callable[Arguments, CallToolResult]:
        @functools.wraps(body)
        def run(*args: Arguments.args, **kwargs: Arguments.kwargs) -> CallToolResult:
            return _run(body.__name__, lambda: body(*args, **kwargs), failure)

        return run

    return decorate(fn) if fn is not None else decorate


def arguments_of(
    other: Callable[..., CallToolResult],
) -> Callable[[Callable[..., CallToolResult]], Callable[..., CallToolResult]]:
    """Give a tool ``other``'s arguments, as the SDK reads and publishes them.

    For a tool whose arguments are another's, word for word: the body takes
    ``**arguments``, and keeps its own name, docstring and result type.
    """

    def decorate(body: Callable[..., CallToolResult]) -> Callable[..., CallToolResult]:
        shared = inspect.signature(other, eval_str=True)
        returns = typing.get_type_hints(body, include_extras=True)["return"]
        body.__signature__ = shared.replace(return_annotation=returns)  # type: ignore[attr-defined]
        return body

    return decorate


# How many times a tool body runs when PostgreSQL rolls it back to settle a
# race (a deadlock, a serialization failure): the whole body again, since
# nothing of it was written. Usage is recorded by the gate, once per call.
CONTENDED_ATTEMPTS = 3


def _run(name: str, call: Callable[[], CallToolResult], shape: Shape) -> CallToolResult:
    """Run one tool body: fresh DB connection state, errors as results, nothing leaked."""
    try:
        _tidy_connections()
        result = _again_when_contended(name, call)
    except RecallError as error:
        return shape(error)
    except Exception as exc:
        shown = errors.from_exception(exc)
        if errors.database_away(exc):
            # Not a bug in this call: logged once per outage, not per call.
            outage.note("tool calls", exc)
        elif shown.code == errors.Unavailable.code:
            # A statement the database cancelled (a timeout, its operator).
            logger.warning(
                "statement cancelled by the database",
                extra={"tool": name, **describe_exception(exc)},
            )
        else:
            logger.error("tool failed", extra={"tool": name, **describe_exception(exc)})
        return shape(shown)
    else:
        outage.recovered("tool calls")
        return result
    finally:
        _tidy_connections()


def _again_when_contended(name: str, call: Callable[[], CallToolResult]) -> CallToolResult:
    attempt = 1
    while True:
        try:
            return call()
        except Exception as exc:
            # Inside an outer transaction (a test's) the rollback was not the
            # body's own: the connection is unusable until that one ends.
            again = attempt < CONTENDED_ATTEMPTS and not connection.in_atomic_block
            if not (again and errors.is_contention(exc)):
                raise
        logger.info("tool ran again after a lost race", extra={"tool": name})
        time.sleep(random.uniform(0.005, 0.05) * attempt)  # noqa: S311 (a jitter, not a secret)
        attempt += 1


def _tidy_connections() -> None:
    # No request_started/finished signals fire for MCP calls, so expire old
    # connections here. Never inside an outer transaction (a test's): closing
    # would end it.
    if not connection.in_atomic_block:
        close_old_connections()
