"""recall: run Recall's memory server, and look after its users, keys and data.

    recall serve                 migrate, load the model, serve HTTP on PORT (default 8080)
                                 (--workers N: N processes on one port; default: the cores)
    recall stdio                 serve the same tools over stdio, as RECALL_API_KEY's user
                                 (--tools v1: seed 001's tools, as /v1/mcp serves them)
    recall worker                run background adds and maintenance only (--threads N)
    recall export EMAIL          write a user's memories as JSON Lines (--namespace, --embeddings)
    recall import EMAIL FILE     import a JSON Lines export into a user's account
    recall import --from FORMAT EMAIL PATH
                                 import from another memory server (mem0, openmemory,
                                 mcp-memory-service, basic-memory, letta, jsonl, csv;
                                 --dry-run, --namespace, --ids, --map, --source-model)
    recall create-user EMAIL     create a user (--tier, --password, --staff)
    recall create-key EMAIL      issue an API key, printed once (--name, --tier, --agent)
    recall set-tier EMAIL TIER   set a user's tier and their keys' (free ... team, unlimited)
    recall link-customer EMAIL CUS
                                 link a Stripe customer to a user, as a checkout would
    recall list-keys [EMAIL]     list keys without their secrets (--all for revoked too)
    recall revoke-key ID|PREFIX|KEY
                                 revoke a key by id, display prefix or the whole key
    recall clear-cache [EMAIL]   drop cached query vectors: one user's, or every user's
    recall doctor                check the data directory, database, roles, row-level security,
                                 model files, Redis, webhooks and the running server (its
                                 pid, port and /ready); exit 1 on a problem
    recall manage ...            any Django management command (migrate, reembed, ...)
    recall --version             print Recall's version

With DATABASE_URL unset, every command uses the embedded PostgreSQL in
RECALL_DATA_DIR, starting it if needed. TRANSPORT=stdio makes ``serve``
behave as ``stdio``. `recall COMMAND --help` explains a command without
touching the data directory or a database.
"""

from __future__ import annotations

import _thread
import contextlib
import errno
import logging
import os
import signal
import socket
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType

ADMIN_COMMANDS = {
    "export": "export_memories",
    "import": "import_memories",
    "create-user": "create_user",
    "create-key": "create_key",
    "set-tier": "set_tier",
    "link-customer": "link_customer",
    "list-keys": "list_keys",
    "revoke-key": "revoke_key",
    "clear-cache": "clear_query_cache",
}


def main(argv: list[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "recall.settings")
    if not args or args[0] in ("-h", "--help", "help"):
        sys.stdout.write(__doc__ or "")
        return
    if args[0] in ("--version", "version") or (len(args) > 1 and args[1] == "--version"):
        # A subcommand's --version was Django's own version (its BaseCommand's).
        from core.process import version

        sys.stdout.write(f"recall {version()}\n")
        return
    command, rest = args[0], args[1:]
    import psycopg
    from django.core.exceptions import ImproperlyConfigured
    from django.db import DatabaseError

    from core.errors import EmbeddingUnavailable

    try:
        _run(command, rest)
    except ImproperlyConfigured as exc:
        # A setting the environment gets wrong: one line naming it, not a traceback
        # (which a desktop client's log would show, and nothing else).
        sys.stderr.write(f"recall {command}: configuration: {exc}\n")
        raise SystemExit(2) from None
    except EmbeddingUnavailable as exc:
        # A damaged or foreign RECALL_LOCAL_MODEL_DIR shows when the model loads:
        # at start-up, for the vector index's width; a remote embedder's outage
        # during an import or a re-embed ends here too. Exit 1, as an outage does:
        # not always the configuration's fault.
        sys.stderr.write(f"recall {command}: embedding model: {exc.message}\n")
        raise SystemExit(1) from None
    except (DatabaseError, psycopg.Error) as exc:
        # psycopg's own, unwrapped: the embedded server's start-up connects
        # before Django has a connection of its own.
        from recall import unreachable

        said = unreachable.describe(exc)
        if said is None:
            raise  # a fault in a query, not in the configuration: its traceback helps
        sys.stderr.write(f"recall {command}: {said}\n")
        raise SystemExit(1) from None


def _run(command: str, rest: list[str]) -> None:
    asks_help = "-h" in rest or "--help" in rest
    if asks_help:
        _help_without_database()
    if command == "serve":
        serve(rest)
    elif command == "stdio":
        stdio(rest)
    elif command == "worker":
        worker(rest)
    elif command == "doctor":
        doctor(rest)
    elif command == "import" and any(a == "--from" or a.startswith("--from=") for a in rest):
        _operator(["recall", "import_from", *rest], migrate=not asks_help, shown=command)
    elif command in ADMIN_COMMANDS:
        _operator(["recall", ADMIN_COMMANDS[command], *rest], migrate=not asks_help, shown=command)
    elif command == "manage":
        # Django names the program after argv[0] in its help and usage lines.
        _django(["recall manage", *rest])
    else:
        sys.stderr.write(f"recall: unknown command {command!r}; see `recall --help`.\n")
        raise SystemExit(2)


def _help_without_database() -> None:
    """Let a command's help load the settings without a data directory or a database.

    Django's commands need the settings to print their help, and on the
    embedded default the settings generate secrets in the data directory,
    and the first database connection wrapper starts PostgreSQL there. A
    placeholder DATABASE_URL (never connected to) and placeholder secrets
    stop both; the help text does not depend on them.
    """
    os.environ.setdefault("DATABASE_URL", "postgres://help@127.0.0.1:9/help")
    os.environ.setdefault("SECRET_KEY", "help")
    os.environ.setdefault("API_KEY_SECRET", "help")


def _django(argv: list[str], *, shown: str | None = None) -> None:
    """Run a Django management command; ``shown`` is the name its usage line gives it.

    Django's would be the command's own (``create_key``), which ``recall``
    does not take: the operator typed ``create-key``.
    """
    from django.core.management import ManagementUtility, execute_from_command_line

    if shown is None:
        execute_from_command_line(argv)
        return
    import django

    django.setup()
    command = ManagementUtility(argv).fetch_command(argv[1])
    command.run_from_argv([argv[0], shown, *argv[2:]])


def _operator(argv: list[str], *, migrate: bool, shown: str | None = None) -> None:
    """Run an operator's command; with ``migrate``, on a database that has its tables.

    On a fresh data directory the first command may be ``create-user``,
    before any ``serve`` has migrated: it failed on a missing table. A
    database never migrated is migrated here. One that only lacks a newer
    version's migrations is not: servers of the older version may be using
    it, and a migration may lock their tables; the command says so instead.
    """
    if not migrate:
        _django(argv, shown=shown)
        return
    import django

    django.setup()
    from django.db import connection
    from django.db.migrations.executor import MigrationExecutor

    from recall import startup

    executor = MigrationExecutor(connection)
    if executor.migration_plan(executor.loader.graph.leaf_nodes()):
        if executor.loader.applied_migrations:
            sys.stderr.write(
                "recall: this database lacks migrations this version brings. Apply them "
                "with `recall serve` (which migrates as it starts) or `recall manage migrate`, "
                "once the servers of the older version are stopped.\n"
            )
            raise SystemExit(1)
        with startup.startup_lock():
            startup.migrate()
    _django(argv, shown=shown)


def serve(argv: list[str] | None = None) -> None:
    import argparse

    import django

    parser = argparse.ArgumentParser(prog="recall serve")
    parser.add_argument(
        "--workers",
        type=int,
        default=None,
        help="server processes sharing the port (default: WEB_CONCURRENCY, else one per core)",
    )
    args = parser.parse_args(argv or [])
    from django.conf import settings

    if settings.TRANSPORT == "stdio":
        if args.workers is not None:
            parser.error("--workers serves HTTP; TRANSPORT=stdio serves one client over stdio")
        stdio([])  # which sets Django up, minding signals as it starts
        return
    count = args.workers if args.workers is not None else settings.WEB_CONCURRENCY
    if count < 1:
        parser.error("--workers must be at least 1")
    taken = _port_taken(settings.HOST, settings.PORT, count)
    if taken:
        # Before the first run's user and key: their banner would point at
        # whatever holds the port, and be shown once.
        sys.stderr.write(f"recall serve: {_cannot_listen(settings.HOST, settings.PORT, taken)}\n")
        raise SystemExit(1)
    # uvicorn shuts down gracefully on SIGINT/SIGTERM, then re-raises the
    # signal with the handlers it found. Make those a normal exit, so atexit
    # hooks run (they stop the embedded PostgreSQL) and the exit code is 0;
    # they take over from start-up's with no moment between.
    with StartupSignals("recall serve", then=_exit_cleanly) as signals:
        with signals.held():
            django.setup()  # starts the embedded PostgreSQL, if that is the database
        from recall import startup

        # One startup for all workers: migrations, the index check and the
        # first user happen here once. Each worker loads its own copy of the
        # model (an onnxruntime session cannot be shared between processes),
        # so the parent of several workers does not hold one too.
        first = startup.prepare(sys.stdout, load_model=count == 1, announce_now=False)
    banner = startup.Banner(first, sys.stdout) if first is not None else None

    import uvicorn

    from recall import instances

    logging.getLogger("recall.startup").info(
        "serving", extra={"host": settings.HOST, "port": settings.PORT, "workers": count}
    )
    # The record `recall doctor` reads to find this server (recall/instances.py).
    serving = instances.recorded(
        Path(settings.RECALL_DATA_DIR), host=settings.HOST, port=settings.PORT, workers=count
    )
    with shared_by_workers(count), serving as me:
        if banner is not None:
            banner.show_when_ready(me.url)
        try:
            uvicorn.run(
                "recall.asgi:application",
                host=settings.HOST,
                port=settings.PORT,
                workers=count,
                lifespan="on",
                # uvicorn's h11 protocol, with a deadline for slow clients.
                http="recall.protocol:TimedH11Protocol",
                log_config=None,  # our LOGGING handles uvicorn's loggers
                access_log=False,  # tool calls log themselves, with request ids
                proxy_headers=True,
                forwarded_allow_ips=settings.FORWARDED_ALLOW_IPS,
                timeout_graceful_shutdown=10,
            )
        finally:
            if banner is not None:
                banner.show()


IN_USE = "in use: another server may be running there"


def _cannot_listen(host: str, port: int, reason: str) -> str:
    """Say why ``recall serve`` cannot listen, with the advice that fits ``reason``."""
    where = f"cannot listen on {host}:{port} ({reason})"
    if reason == IN_USE:
        return f"{where}. Stop what holds it, or set HOST and PORT."
    if reason == os.strerror(errno.EACCES):
        return f"{where}. Ports below 1024 need privileges: set PORT to 1024 or more."
    # A name that does not resolve, or an address no interface here has: no
    # other server is to blame, and HOST alone is wrong.
    return (
        f"{where}: HOST is not an address of this machine. Set HOST to one of its"
        " addresses: 127.0.0.1 for this machine only, 0.0.0.0 for every network."
    )


def _port_taken(host: str, port: int, workers: int) -> str | None:
    """Why ``recall serve`` could not listen on ``host:port``, or None if it could now.

    The sockets are bound and released at once as uvicorn will bind them,
    with SO_REUSEADDR (a port a stopped server left in TIME_WAIT is free):
    with several workers, one socket for ``host`` (IPv6 if it holds a
    colon, and not v6-only); with one, asyncio's, one per address ``host``
    names, v6-only, skipping a family this machine lacks.
    """
    if not host:
        return None
    if workers > 1:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        return _bind_fails([(family, (host, port))], v6_only=False)
    try:
        found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (OSError, ValueError) as exc:  # ValueError: UnicodeError, a name IDNA refuses
        return str(getattr(exc, "strerror", None) or exc)
    return _bind_fails([(family, address) for family, *_, address in found], v6_only=True)


def _bind_fails(addresses: list[tuple[int, tuple[object, ...]]], *, v6_only: bool) -> str | None:
    for family, address in addresses:
        try:
            probe = socket.socket(family, socket.SOCK_STREAM)
        except OSError:
            continue  # a family this machine lacks: uvicorn skips it too
        with probe:
            try:
                probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                if family == socket.AF_INET6 and v6_only:  # else the system's default
                    probe.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
                probe.bind(address)
            except OSError as exc:
                if exc.errno == errno.EADDRINUSE:
                    return IN_USE
                return str(exc.strerror or exc)
            except (ValueError, TypeError) as exc:  # a host no socket takes (a NUL)
                return str(exc)
    return None


def _exit_cleanly(signum: int, frame: object) -> None:
    raise SystemExit(0)


def doctor(argv: list[str] | None = None) -> None:
    """Check the data directory, database, roles, row-level security, model files, Redis,
    webhooks and the running server; exit 1 on a problem."""
    import argparse

    import django
    from django.core.exceptions import ImproperlyConfigured

    argparse.ArgumentParser(prog="recall doctor", description=doctor.__doc__).parse_args(argv or [])

    no_database = _no_database_in_data_directory() is not None
    if no_database:
        # django.setup() builds the connection wrapper, and the embedded one starts
        # its server, running initdb in an empty directory: a mistyped RECALL_DATA_DIR
        # got a fresh database from a check.
        from recall import env
        from recall.db import embedded

        embedded.make_none(env.data_directory("RECALL_DATA_DIR", embedded=True))
    try:
        django.setup()
    except ImproperlyConfigured as exc:
        # Settings that do not load are the first thing to fix.
        sys.stdout.write(f"Recall doctor\n\n  problem  settings  {exc}\n\n1 problem.\n")
        raise SystemExit(1) from None
    from recall import doctor as checks

    raise SystemExit(checks.run(sys.stdout, no_database=no_database))


def stdio(argv: list[str]) -> None:
    import argparse

    import django

    parser = argparse.ArgumentParser(prog="recall stdio")
    parser.add_argument(
        "--tools",
        choices=["mcp", "v1"],
        default="mcp",
        help="which tool set: /mcp's (default) or seed 001's, as /v1/mcp serves it",
    )
    args = parser.parse_args(argv)
    missing = _no_database_in_data_directory()
    if missing:
        sys.stderr.write(f"recall stdio: {missing}\n")
        raise SystemExit(2)
    # Once it has served, the process is on its way out: a signal then would
    # only break off the exit hooks that stop the embedded PostgreSQL.
    with StartupSignals("recall stdio", then=_ignore) as signals:
        with signals.held():
            django.setup()  # starts the embedded PostgreSQL, if that is the database
        from recall import stdio as runner

        # Its transport takes SIGINT and SIGTERM over once it serves.
        runner.run(tools=args.tools)


def _no_database_in_data_directory() -> str | None:
    """Say so when ``recall stdio`` would start the embedded PostgreSQL where none is.

    A desktop client's configuration with a wrong RECALL_DATA_DIR would
    otherwise get a new database (initdb, secrets, migrations) made there only
    to refuse its key: a key is only ever valid in the database that made it.
    """
    from django.core.exceptions import ImproperlyConfigured

    from recall import env
    from recall.db import embedded

    if env.is_set("DATABASE_URL"):
        return None
    try:
        where = env.data_directory("RECALL_DATA_DIR", embedded=True)
    except ImproperlyConfigured:
        return None  # the settings say what is wrong with it, as for every command
    if embedded.holds_database(where):
        return None
    return (
        f"RECALL_DATA_DIR ({where.resolve()}) holds no Recall database, so no API key is valid"
        " there: is that the server's data directory? `recall serve` makes the database"
        " and its first key."
    )


class Interrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM during start-up, raised wherever start-up had got to.

    A ``KeyboardInterrupt``, so that code which tidies up after Ctrl-C (psycopg
    cancels the query it was waiting on) does so for SIGTERM too.
    """

    def __init__(self, signum: signal.Signals) -> None:
        super().__init__(signum.name)
        self.signum = signum


class StartupSignals:
    """Make SIGINT or SIGTERM during start-up a quiet exit: 130 or 143, as a shell expects.

    Without this, Ctrl-C while Django sets up, the embedded PostgreSQL starts,
    migrations run or the model loads printed a traceback, and SIGTERM ended
    the process on the spot: atexit hooks never ran, so the embedded server it
    had started (or joined) ran on. Here either signal raises ``Interrupted``
    where start-up is, the stack unwinds, one line says what happened, and the
    exit runs the hooks that stop the server. The status is 128 + the signal's
    number, as for a command a shell's Ctrl-C stopped, even if what was
    interrupted (an import, say) turned the exception into another one.

    During ``held()`` a signal waits until the block ends: starting the
    embedded server runs initdb and pg_ctl, and killing them halfway would
    leave a server that no process counts as its user, so nobody stops it. A
    second signal does not wait.

    A signal that lands in a finalizer (garbage collection runs them anywhere)
    raises where Python only reports an exception and carries on; it is
    delivered again, to the code that runs next, instead of being reported.

    The handlers stay until something replaces them or the block ends: the
    stdio transport replaces them as it starts serving, and then stops
    cleanly on either signal; ``serve`` leaves the block once start-up is
    done, before uvicorn, which shuts down gracefully on either.
    """

    SIGNALS = (signal.SIGINT, signal.SIGTERM)
    REDELIVER_SECONDS = 0.1

    def __init__(
        self, command: str, then: Callable[[int, FrameType | None], object] | None = None
    ) -> None:
        self.command = command
        self.then = then  # the handler once start-up is done (else the one before)
        self.received: signal.Signals | None = None
        self.holding = False
        self.previous: dict[int, Callable[[int, FrameType | None], object] | int | None] = {}
        self.previous_hook = sys.unraisablehook

    def __enter__(self) -> StartupSignals:
        for signum in self.SIGNALS:
            self.previous[signum] = signal.signal(signum, self._arrived)
        self.previous_hook = sys.unraisablehook
        sys.unraisablehook = self._unraisable
        return self

    def _arrived(self, signum: int, frame: FrameType | None) -> None:
        first = self.received is None
        if self.received is None:
            self.received = signal.Signals(signum)
        if not (self.holding and first):
            raise Interrupted(self.received)

    def _unraisable(self, unraisable: sys.UnraisableHookArgs) -> None:
        if not isinstance(unraisable.exc_value, Interrupted):
            self.previous_hook(unraisable)
            return
        # From a thread, a moment later: delivered at once, it would land in this hook.
        again = threading.Timer(
            self.REDELIVER_SECONDS, _thread.interrupt_main, [unraisable.exc_value.signum]
        )
        again.daemon = True
        again.start()

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        """Hold a signal that arrives in the block until the block ends."""
        self.holding = True
        try:
            yield
        finally:
            self.holding = False
        if self.received is not None:
            raise Interrupted(self.received)

    def __exit__(self, exc_type: type[BaseException] | None, *rest: object) -> None:
        sys.unraisablehook = self.previous_hook
        if self.received is None and exc_type is None:
            for signum, handler in self.previous.items():
                after = self.then or handler
                if after is not None:  # None: not set from Python, so nothing to put back
                    signal.signal(signum, after)
            return
        # The process is on its way out. More signals would only break off
        # the exit hooks that stop the embedded PostgreSQL: let them finish.
        for signum in self.SIGNALS:
            signal.signal(signum, _ignore)
        if self.received is None:
            return  # start-up failed of itself (a bad key, say): its exception goes on
        sys.stderr.write(f"{self.command}: interrupted while starting; stopped.\n")
        sys.stderr.flush()
        raise SystemExit(128 + self.received) from None


def _ignore(signum: int, frame: FrameType | None) -> None:
    pass


def worker(argv: list[str]) -> None:
    """Run background workers and maintenance without serving HTTP, until SIGTERM or Ctrl-C."""
    import argparse

    import django

    parser = argparse.ArgumentParser(prog="recall worker", description=worker.__doc__)
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="worker threads (default: JOB_WORKERS, at least 1)",
    )
    args = parser.parse_args(argv)
    django.setup()
    from django.conf import settings

    from core import stalls
    from memories import embeddings, jobs
    from recall import startup

    threads = max(args.threads if args.threads is not None else settings.JOB_WORKERS, 1)
    stalls.install()
    startup.migrate()
    startup.check_embeddings()
    embeddings.get_embedder().load()
    running = jobs.Workers(threads=threads).start()

    def stop(signum: int, frame: object) -> None:
        running.stop()

    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, stop)
    logging.getLogger("recall.startup").info("worker running", extra={"threads": threads})
    running.wait()


@contextlib.contextmanager
def shared_by_workers(count: int) -> Iterator[None]:
    """Set up what ``count`` worker processes share, for as long as they run; nothing for one."""
    if count <= 1:
        yield
        return
    from django.conf import settings
    from django.db import connections

    from core import sharedstate, workers
    from recall.db import embedded

    state = sharedstate.SharedState.create()
    os.environ[sharedstate.ENV] = str(state.path)
    os.environ[workers.COUNT_ENV] = str(count)
    supervisor = None
    if settings.EMBEDDED_DATABASE:
        supervisor = embedded.Supervisor(Path(settings.RECALL_DATA_DIR)).start()
    # The parent only supervises from here on: no connection of its own.
    connections.close_all()
    try:
        yield
    finally:
        if supervisor is not None:
            supervisor.stop()
        if settings.EMBEDDED_DATABASE:
            # The workers have stopped; the embedded server stops with the
            # parent, its last user (see embedded.forget_exited).
            embedded.forget_exited(Path(settings.RECALL_DATA_DIR))
        os.environ.pop(sharedstate.ENV, None)
        os.environ.pop(workers.COUNT_ENV, None)
        state.remove()
