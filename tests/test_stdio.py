"""`recall stdio`: the same tools for desktop clients, as RECALL_API_KEY's user, same limits."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import anyio
import psutil
import psycopg
import pytest
from django.conf import settings
from django.db import connection, connections
from mcp import Client
from mcp.client.stdio import StdioServerParameters

from accounts import services as accounts
from core import tenancy
from memories.models import Memory
from recall import startup
from tests.clients import MODES, structured
from tests.conftest import usage_events
from tests.support import database_url, free_port

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def stdio_server(key: str, **extra: str) -> StdioServerParameters:
    return StdioServerParameters(
        command=sys.executable,
        args=["-m", "recall", "stdio"],
        cwd=str(settings.BASE_DIR),
        env={
            **os.environ,
            "DATABASE_URL": database_url(),
            "SECRET_KEY": settings.SECRET_KEY,
            "API_KEY_SECRET": settings.API_KEY_SECRET,
            "RECALL_API_KEY": key,
            **extra,
        },
    )


def run_to_its_end(
    params: StdioServerParameters, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``recall stdio`` with nothing on stdin, to its exit (a refusal, here)."""
    return subprocess.run(
        [params.command, *params.args],
        env=env or params.env,
        cwd=params.cwd,
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )


def run_session(params: StdioServerParameters, mode: str, requests):
    async def run():
        async with Client(params, mode=mode) as client:
            return [await client.call_tool(tool, arguments) for tool, arguments in requests]

    return anyio.run(run)


@pytest.mark.parametrize("mode", MODES)
def test_the_tools_work_over_stdio_as_the_keys_user(cast, mode):
    results = run_session(
        stdio_server(cast.alice_key.raw),
        mode,
        [
            ("remember", {"content": "The user's editor is Helix."}),
            ("recall", {"query": "Which editor does the user use?"}),
        ],
    )

    assert structured(results[0])["deduped"] is False
    assert structured(results[1])["memories"][0]["content"] == "The user's editor is Helix."
    events = usage_events(2)
    assert [(e.tool_name, e.api_key_id, e.success) for e in events] == [
        ("remember", cast.alice_key.key.id, True),
        ("recall", cast.alice_key.key.id, True),
    ]
    assert all(len(e.request_id) == 32 for e in events)
    # Charlie's stdio process sees none of it.
    [listed] = run_session(stdio_server(cast.charlie_key.raw), mode, [("list_memories", {})])
    assert structured(listed)["memories"] == []


def test_stdio_applies_the_tier_rate_limit(cast):
    results = run_session(
        stdio_server(cast.alice_key.raw, RATE_LIMIT_FREE="2/min"),
        "legacy",
        [("no_such_tool", {}), ("list_memories", {}), ("made_up", {})],
    )

    assert [r.is_error for r in results] == [True, False, True]
    assert structured(results[2])["error"]["code"] == "rate_limited"
    events = usage_events(3)
    assert (events[2].error_code, events[2].tokens_consumed) == ("rate_limited", 0)
    # A name the catalogue lacks is recorded as "unknown", refused or run.
    assert [e.tool_name for e in events] == ["unknown", "list_memories", "unknown"]


LATE = "Written after the key was revoked."


def test_a_key_revoked_or_retiered_while_stdio_runs_applies_from_its_next_calls(cast):
    # The process checked its key once, at start: a revoked key went on
    # reading and writing, and a tier change never reached its rate limit.
    def meanwhile(change: Callable[[], object]) -> Callable[[], None]:
        def run() -> None:
            try:
                change()
            finally:
                connections.close_all()

        return run

    async def until_refused(client: Client, tool: str, arguments: dict, code: str) -> list:
        answers = []
        for _ in range(200):  # the change reaches the process soon after it commits
            answers.append(await client.call_tool(tool, arguments))
            # Until then the key's old state answers: after the tier change,
            # its one call a minute is spent, so rate_limited may come first.
            if answers[-1].is_error and structured(answers[-1])["error"]["code"] == code:
                break
            await anyio.sleep(0.05)
        return answers

    async def session():
        params = stdio_server(
            cast.alice_key.raw, RATE_LIMIT_FREE="1000/min", RATE_LIMIT_PRO="1/min"
        )
        async with Client(params, mode="legacy") as client:
            await client.call_tool("list_memories", {})
            await anyio.to_thread.run_sync(
                meanwhile(lambda: accounts.set_user_tier(user_id=cast.alice.id, tier="pro"))
            )
            retiered = await until_refused(client, "list_memories", {}, "rate_limited")
            await anyio.to_thread.run_sync(
                meanwhile(lambda: accounts.revoke_keys([cast.alice_key.key.id]))
            )
            revoked = await until_refused(client, "list_memories", {}, "unauthorized")
            late = await client.call_tool("remember", {"content": LATE})
            return retiered, revoked, late

    retiered, revoked, late = anyio.run(session)

    assert structured(retiered[-1])["error"]["code"] == "rate_limited"
    assert structured(revoked[-1])["error"]["code"] == "unauthorized"
    assert structured(late)["error"]["code"] == "unauthorized"
    assert "revoked" in structured(late)["error"]["message"]
    with tenancy.operator():
        assert not Memory.objects.filter(content=LATE).exists()


def test_stdio_refuses_to_start_without_a_valid_key(cast):
    for key in ("", "recall_live_" + "B" * 32):
        params = stdio_server(key)
        result = run_to_its_end(params)
        assert result.returncode == 2
        assert "RECALL_API_KEY" in result.stderr
        assert result.stdout == ""  # stdout is the protocol channel
    # A database with users: the key is unknown or revoked, and where it was
    # looked for is said.
    assert "for the database in DATABASE_URL (unknown, or revoked)." in result.stderr


def test_a_refused_key_changes_nothing_in_a_database_that_lacks_a_migration(cast):
    # A client launched with a wrong key migrated the shared database first
    # (while servers of the older version still used it), and only then
    # refused to start.
    latest = ("memories", "0028_search_words_in_angle_brackets")
    with connection.cursor() as cursor:
        cursor.execute(
            "DELETE FROM django_migrations WHERE app = %s AND name = %s RETURNING applied", latest
        )
        (applied,) = cursor.fetchone()
    try:
        params = stdio_server("recall_live_" + "B" * 32)
        result = run_to_its_end(params)
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM django_migrations WHERE app = %s AND name = %s", latest
            )
            (migrated,) = cursor.fetchone()
    finally:
        with connection.cursor() as cursor:
            cursor.execute(
                "INSERT INTO django_migrations (app, name, applied) SELECT %s, %s, %s"
                " WHERE NOT EXISTS (SELECT FROM django_migrations WHERE app = %s AND name = %s)",
                [*latest, applied, *latest],
            )

    assert result.returncode == 2
    assert "(unknown, or revoked)" in result.stderr
    assert migrated == 0


def test_a_malformed_key_on_a_database_with_no_tables_is_refused_without_a_traceback(cast):
    # Refused before migrating, the key's message asked the empty database
    # whether it had users, and failed on the missing table.
    params = connection.get_connection_params()
    params.pop("cursor_factory", None)
    with psycopg.connect(**params, autocommit=True) as admin:
        admin.execute("DROP DATABASE IF EXISTS recall_stdio_empty")
        admin.execute("CREATE DATABASE recall_stdio_empty")
    try:
        server = stdio_server("not-a-recall-key")
        url = database_url().rsplit("/", 1)[0] + "/recall_stdio_empty"
        env = {**(server.env or {}), "DATABASE_URL": url}
        result = run_to_its_end(server, env)
    finally:
        with psycopg.connect(**params, autocommit=True) as admin:
            admin.execute("DROP DATABASE IF EXISTS recall_stdio_empty")

    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert "which has no users" in result.stderr


# (signal, the exit status a shell expects of a command it stopped: 128 + the signal)
INTERRUPTS = [(signal.SIGINT, 130), (signal.SIGTERM, 143)]
BOGUS_KEY = "recall_live_" + "B" * 32  # refused only once start-up is over


def start(env: dict[str, str], command: str = "stdio") -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "recall", command],
        cwd=settings.BASE_DIR,
        env=env,
        stdin=subprocess.PIPE,  # held open: a client that has not gone away
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_for(what: str, done: Callable[[], bool], process: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + 180
    while not done():
        assert process.poll() is None, f"recall stdio ended before {what}"
        assert time.monotonic() < deadline, f"recall stdio never got to {what}"
        time.sleep(0.05)


def waiting_on_lock(holder: psycopg.Connection, application: str) -> Callable[[], bool]:
    """Whether the process that connected as ``application`` waits on an advisory lock.

    It asks for the lock again and again (``pooling.advisory_lock``), so its
    last statement is that question.
    """

    def waiting() -> bool:
        row = holder.execute(
            "SELECT count(*) FROM pg_stat_activity"
            " WHERE application_name = %s AND query LIKE 'SELECT pg_try_advisory_lock(%%'",
            [application],
        ).fetchone()
        return bool(row and row[0])

    return waiting


def interrupt(process: subprocess.Popen[str], signum: int) -> tuple[str, str]:
    process.send_signal(signum)
    return process.communicate(timeout=180)


def assert_stopped_quietly(process: subprocess.Popen[str], out: str, err: str, code: int) -> None:
    assert process.returncode == code, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    assert "KeyboardInterrupt" not in err, err[-3000:]
    assert "recall stdio: interrupted while starting; stopped." in err.splitlines()
    assert out == ""  # stdout is the protocol channel


def interrupted_at_the_lock(
    command: str, env: dict[str, str], signum: int
) -> tuple[subprocess.Popen[str], str, str]:
    """Run ``recall COMMAND`` and interrupt it while its start-up waits on the start-up lock."""
    params = connection.get_connection_params()
    params.pop("cursor_factory", None)
    application = f"recall-{command}-starting"
    # Start-up waits on this lock while another process migrates: hold it, so
    # the signal arrives while start-up is surely under way.
    with psycopg.connect(**params, autocommit=True) as holder:
        holder.execute("SELECT pg_advisory_lock(%s)", [startup._STARTUP_LOCK])
        process = start({**env, "PGAPPNAME": application}, command)
        try:
            wait_for("the start-up lock", waiting_on_lock(holder, application), process)
            out, err = interrupt(process, signum)
        finally:
            if process.poll() is None:
                process.kill()
                process.communicate()
    return process, out, err


@pytest.mark.parametrize(("signum", "code"), INTERRUPTS, ids=["SIGINT", "SIGTERM"])
def test_an_interrupt_while_starting_exits_quietly_with_a_shells_status(cast, signum, code):
    env = dict(stdio_server(cast.alice_key.raw).env or {})

    process, out, err = interrupted_at_the_lock("stdio", env, signum)

    assert_stopped_quietly(process, out, err, code)


@pytest.mark.parametrize(("signum", "code"), INTERRUPTS, ids=["SIGINT", "SIGTERM"])
def test_an_interrupt_while_starting_stops_the_embedded_database(tmp_path, signum, code):
    env = {**embedded_env(), "RECALL_DATA_DIR": str(tmp_path), "RECALL_API_KEY": BOGUS_KEY}
    pgdata = tmp_path.resolve() / "pgdata"
    # A data directory with a database cluster, not yet migrated: `recall
    # stdio` refuses one that holds no database at all.
    make_cluster(tmp_path, env)
    assert not postmasters(pgdata)
    process = start(env)
    try:
        # The server starts early in start-up; migrating its new database
        # takes seconds more. Starting it, a signal waits until it is up.
        wait_for("the embedded database", (pgdata / "postmaster.pid").exists, process)
        out, err = interrupt(process, signum)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
        left = postmasters(pgdata)
        for postmaster in left:
            postmaster.send_signal(signal.SIGINT)  # PostgreSQL's fast shutdown
        psutil.wait_procs(left, timeout=60)

    assert not left, "the embedded PostgreSQL was left running"
    assert not (pgdata / "postmaster.pid").exists()
    assert_stopped_quietly(process, out, err, code)


def embedded_env() -> dict[str, str]:
    """This environment without the test database's settings: a command uses its own."""
    dropped = {"DATABASE_URL", "SECRET_KEY", "API_KEY_SECRET"}
    return {k: v for k, v in os.environ.items() if k not in dropped}


def make_cluster(data_dir: Path, env: dict[str, str]) -> None:
    """Make the embedded database cluster in ``data_dir``, and stop its server again."""
    made = subprocess.run(
        [sys.executable, "-c", INIT_CLUSTER, str(data_dir)],
        cwd=settings.BASE_DIR,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert made.returncode == 0, made.stderr[-3000:]


# Starts the embedded server on a data directory (initdb the first time), and
# stops it as the process exits.
INIT_CLUSTER = (
    "import sys; from pathlib import Path; from recall.db import embedded; "
    "embedded.start(Path(sys.argv[1]))"
)


def postmasters(pgdata: Path) -> list[psutil.Process]:
    """The PostgreSQL servers running on ``pgdata``."""
    found = []
    for process in psutil.process_iter(["name", "cmdline"]):
        if process.info["name"] == "postgres" and str(pgdata) in (process.info["cmdline"] or []):
            found.append(process)
    return found


@pytest.mark.parametrize(("signum", "code"), INTERRUPTS, ids=["SIGINT", "SIGTERM"])
def test_serve_interrupted_while_starting_exits_quietly_too(signum, code):
    env = {
        **os.environ,
        "DATABASE_URL": database_url(),
        "SECRET_KEY": settings.SECRET_KEY,
        "API_KEY_SECRET": settings.API_KEY_SECRET,
        "PORT": str(free_port()),
    }

    process, _, err = interrupted_at_the_lock("serve", env, signum)

    assert process.returncode == code, err[-3000:]
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err[-3000:]
    assert "recall serve: interrupted while starting; stopped." in err.splitlines()


# Attaches to the embedded server, says so, and waits for a line (or a kill).
ATTACH_AND_WAIT = (
    "import sys; from pathlib import Path; from recall.db import embedded; "
    "embedded.start(Path(sys.argv[1])); print('attached', flush=True); sys.stdin.readline()"
)


def test_the_last_process_to_exit_stops_the_embedded_database_after_one_was_killed(tmp_path):
    # The killed process still counted as a user of the server, so the last
    # one to exit left it running, holding its shared memory.
    env = embedded_env()
    pgdata = tmp_path.resolve() / "pgdata"
    make_cluster(tmp_path, env)

    def attach() -> subprocess.Popen[str]:
        process = subprocess.Popen(
            [sys.executable, "-c", ATTACH_AND_WAIT, str(tmp_path)],
            cwd=settings.BASE_DIR,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert process.stdout is not None and process.stdout.readline() == "attached\n"
        return process

    killed, last = attach(), attach()
    try:
        killed.kill()
        killed.communicate(timeout=30)
        _, err = last.communicate("\n", timeout=120)
        assert last.returncode == 0, err[-3000:]
        left = postmasters(pgdata)
    finally:
        for process in (killed, last):
            if process.poll() is None:
                process.kill()
        stray = postmasters(pgdata)
        for postmaster in stray:
            postmaster.send_signal(signal.SIGINT)
        psutil.wait_procs(stray, timeout=60)

    assert not left, "the embedded PostgreSQL was left running"
