"""Log formatters: one JSON object per line in production, readable lines in development.

Callers pass structured fields through ``extra=``. Anything sensitive must be
reduced before it gets here (see ``fingerprint``); the formatters print what
they are given, except a ``request`` field and exception messages. Django's
loggers (``django.request``'s "Not Found: /path", ``django.security``) pass
the request itself, whose repr holds the query string: an OAuth ``state`` or
``code_challenge``, a dashboard search, a key sent as ``?api_key=``. It is
logged as its method and path only. The JSON formatter logs an
exception's type and frames only, since database and provider errors can quote
the content or query that caused them. The console formatter, for
development, prints the traceback's frames and type, without the message, for
the same reason.
"""

from __future__ import annotations

import hashlib
import json
import logging
import sysconfig
import traceback
from datetime import UTC, datetime

# Attributes every LogRecord has; anything else came from ``extra=``.
_STANDARD = set(vars(logging.makeLogRecord({}))) | {
    "message",
    "asctime",
    "taskName",
    "color_message",  # uvicorn's ANSI-coloured copy of the message
}


def fingerprint(text: str) -> str:
    """Return an 8-character SHA-256 prefix: enough to correlate, useless to read."""
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:8]


def _fields(record: logging.LogRecord) -> dict[str, object]:
    fields = {k: v for k, v in vars(record).items() if k not in _STANDARD and not k.startswith("_")}
    if "request" in fields:
        fields["request"] = _request_line(fields["request"])
    return fields


def _request_line(request: object) -> str:
    """A request as ``METHOD /path``: never its query string, headers or body."""
    method, path = getattr(request, "method", None), getattr(request, "path", None)
    if isinstance(method, str) and isinstance(path, str):
        return f"{method} {path}"
    return type(request).__name__


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "event": record.getMessage(),
            # Which worker of `recall serve --workers N` wrote the line.
            "pid": record.process,
        }
        entry.update(_fields(record))
        if record.exc_info and record.exc_info[1] is not None:
            # Type and frames only: exception messages can quote user content.
            entry.update(describe_exception(record.exc_info[1]))
        return json.dumps(entry, default=str, ensure_ascii=False)


class ConsoleFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        ts = datetime.fromtimestamp(record.created).strftime("%H:%M:%S")
        extras = " ".join(f"{k}={v}" for k, v in _fields(record).items())
        line = f"{ts} {record.levelname:<7} {record.name}: {record.getMessage()}"
        if extras:
            line += f"  [{extras}]"
        if record.exc_info and record.exc_info[1] is not None:
            # The stack and the type, as the JSON formatter: not the message,
            # which can quote the content or query that caused it.
            exc = record.exc_info[1]
            stack = "".join(traceback.format_tb(exc.__traceback__))
            kind = f"{type(exc).__module__}.{type(exc).__qualname__}"
            line += f"\nTraceback (most recent call last):\n{stack}{kind} (message withheld)"
        return line


def describe_exception(exc: BaseException) -> dict[str, object]:
    """Describe an exception for the log by type and stack frames only.

    The message is left out on purpose: exception text from the database or a
    provider can quote the content or query that caused it. ``origin`` is the
    innermost frame outside the libraries. A database error adds its SQLSTATE
    and the constraint it names, if any: codes and schema names, which say
    which error it was (a deadlock, 40P01, or a unique violation) without
    quoting anything.
    """
    frames = traceback.extract_tb(exc.__traceback__)
    described: dict[str, object] = {
        "exc_type": f"{type(exc).__module__}.{type(exc).__qualname__}",
        "frames": [f"{frame.filename}:{frame.lineno} in {frame.name}" for frame in frames[-10:]],
    }
    # The last ten frames of a database error are often all the driver's and
    # Django's; the innermost of our own says which call failed.
    ours = [frame for frame in frames if not _library(frame.filename)]
    if ours:
        described["origin"] = f"{ours[-1].filename}:{ours[-1].lineno} in {ours[-1].name}"
    described.update(_database_error(exc))
    return described


_STDLIB = sysconfig.get_paths()["stdlib"]


def _library(filename: str) -> bool:
    """Whether a frame is an installed package's or the standard library's."""
    return "site-packages" in filename or filename.startswith((_STDLIB, "<"))


def _database_error(exc: BaseException) -> dict[str, object]:
    """The SQLSTATE (and constraint) of a psycopg error in ``exc``'s causes, else nothing.

    Django wraps psycopg's errors, so the code is on the cause; read by name,
    so this base module imports no driver.
    """
    seen: BaseException | None = exc
    for _ in range(5):  # a wrapper or two deep; never a loop
        if seen is None:
            break
        state = getattr(seen, "sqlstate", None)
        if isinstance(state, str) and state:
            found: dict[str, object] = {"sqlstate": state}
            constraint = getattr(getattr(seen, "diag", None), "constraint_name", None)
            if isinstance(constraint, str) and constraint:
                found["constraint"] = constraint
            return found
        seen = seen.__cause__ or seen.__context__
    return {}
