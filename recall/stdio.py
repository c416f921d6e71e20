"""Serve the MCP tools over stdio, for desktop clients that launch a subprocess.

The process acts as the user behind ``RECALL_API_KEY``, with the same tier
limits and usage events as HTTP. stdout carries the protocol, so everything
else, logs included, goes to stderr.
"""

from __future__ import annotations

import signal
import sys

import anyio
from django.conf import settings
from django.db import DatabaseError

from accounts import auth
from billing import usage
from core import context, stalls
from memories import jobs
from memories.mcp import build_server, build_v1_server, runtime, v1_tools
from memories.mcp import stdio as admission
from recall import startup, stdio_transport, unreachable


def run(tools: str = "mcp") -> None:
    """Serve /mcp's tools, or with ``tools="v1"`` seed 001's, until stdin closes."""
    raw = settings.RECALL_API_KEY
    if not raw:
        sys.stderr.write("recall stdio: set RECALL_API_KEY to the API key this process acts as.\n")
        raise SystemExit(2)
    if _refused_as_it_stands(raw):
        sys.stderr.write(f"recall stdio: {refused_key()}\n")
        raise SystemExit(2)
    startup.prepare(sys.stderr, announce_urls=False, first_user=False)
    caller = auth.authenticate(raw)
    if caller is None:
        sys.stderr.write(f"recall stdio: {refused_key()}\n")
        raise SystemExit(2)
    auth.current.set(caller)
    context.transport.set("stdio")
    if tools == "v1":
        server = build_v1_server()
        admission.install(server, v1_tools.failure, raw)
    else:
        server = build_server()
        admission.install(server, runtime.failure, raw)
    stalls.install()
    # Background adds made over stdio need a worker even when no server runs.
    workers = jobs.Workers().start()
    try:
        anyio.run(stdio_transport.serve, server)
    finally:
        # The transport's handlers are gone with its loop, and the defaults
        # would let a SIGTERM (a client sends one two seconds after closing
        # stdin) end the process before the exit hooks stop the embedded
        # PostgreSQL. It is on its way out: let it finish.
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, signal.SIG_IGN)
        workers.stop()
        usage.get_recorder().stop()


def _refused_as_it_stands(raw: str) -> bool:
    """Whether the database, before this process migrates it, refuses the key: a process
    started with a wrong key changes nothing. A database too old (or too new) to say
    lets start-up go on; the key is checked again once it is ready."""
    try:
        return auth.authenticate(raw) is None
    except DatabaseError:
        return False


def refused_key() -> str:
    """Say why RECALL_API_KEY was refused, and where it was looked for."""
    from accounts import services
    from core import tenancy

    where = (
        f"the database in RECALL_DATA_DIR ({startup.data_directory()})"
        if settings.EMBEDDED_DATABASE
        else "the database in DATABASE_URL"
    )
    try:
        with tenancy.operator():
            anyone = services.has_users()
    except DatabaseError as exc:
        if unreachable.describe(exc) is not None:
            # Nothing can be said of the key; `recall` says the database is out of reach.
            raise
        anyone = False  # not migrated yet: no users either
    if not anyone:
        return (
            f"RECALL_API_KEY is not a valid, live API key for {where}, which has no users:"
            " is that the server's data directory?"
        )
    return f"RECALL_API_KEY is not a valid, live API key for {where} (unknown, or revoked)."
