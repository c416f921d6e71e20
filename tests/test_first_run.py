"""A new self-hoster's first ten minutes: `recall serve` on a fresh machine, then what it printed.

One server for the module, in a data directory that is not the default one,
as a user who set RECALL_DATA_DIR would have. Each test follows the banner's
instructions the way a person would, and nothing else.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from django.conf import settings
from mcp import Client
from mcp.client.stdio import StdioServerParameters

from recall.startup import RULE
from tests.clients import raw_call
from tests.support import free_port
from tests.test_cli import recall_command

pytestmark = pytest.mark.slow


def data_directory_only(data_dir: Path) -> dict[str, str]:
    """This environment, on the embedded database in ``data_dir`` with secrets of its own."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in {"DATABASE_URL", "SECRET_KEY", "API_KEY_SECRET"}
    }
    return {**env, "RECALL_DATA_DIR": str(data_dir)}


@dataclass
class FirstRun:
    url: str
    banner: str  # everything the terminal showed: stdout and the log lines on stderr
    home: Path
    process: subprocess.Popen[bytes]
    data_dir: Path
    port: int

    @property
    def api_key(self) -> str:
        match = re.search(r"API key:\s+(recall_live_[A-Za-z0-9_-]{32})", self.banner)
        assert match, self.banner
        return match[1]

    @property
    def password(self) -> str:
        match = re.search(r"sign in as admin@localhost / (\S+)\)", self.banner)
        assert match, self.banner
        return match[1]

    def config(self, heading: str) -> dict[str, Any]:
        """Return the client configuration the banner printed under ``heading``."""
        start = self.banner.index(heading)
        config, _ = json.JSONDecoder().raw_decode(self.banner, self.banner.index("{", start))
        return config


@pytest.fixture(scope="module")
def first_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FirstRun]:
    data_dir = tmp_path_factory.mktemp("first-run") / "my-recall-data"
    home = tmp_path_factory.mktemp("home")
    port = free_port()
    banner = tmp_path_factory.mktemp("out") / "banner.txt"
    env = {**data_directory_only(data_dir), "PORT": str(port)}
    # One stream, as a terminal shows them: the banner among the log lines.
    with banner.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "recall", "serve"],
            cwd=settings.BASE_DIR,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 240
        while True:
            assert process.poll() is None, banner.read_text()[-3000:]
            assert time.monotonic() < deadline, "recall serve did not become ready"
            try:
                if httpx2.get(f"{url}/ready").status_code == 200:
                    break
            except httpx2.TransportError:
                pass
            time.sleep(0.3)
        # The banner follows readiness, once the start-up lines are done.
        while banner.read_text().count(RULE) < 2:
            assert time.monotonic() < deadline, banner.read_text()[-3000:]
            time.sleep(0.2)
        yield FirstRun(url, banner.read_text(), home, process, data_dir, port)
    finally:
        process.terminate()
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            process.kill()


def run_desktop_client(first_run: FirstRun, calls: list[tuple[str, dict[str, Any]]]) -> list[Any]:
    """Launch the printed Claude Desktop configuration as Claude Desktop does.

    Claude Desktop starts the command with its own environment, not the shell
    that ran `recall serve`: only PATH, a HOME, and the configuration's env.
    """
    server = first_run.config("Claude Desktop")["mcpServers"]["recall"]
    params = StdioServerParameters(
        command=server["command"],
        args=server["args"],
        env={"PATH": os.environ["PATH"], "HOME": str(first_run.home), **server["env"]},
    )

    async def session() -> list[Any]:
        async with Client(params, mode="legacy") as client:
            return [await client.call_tool(name, arguments) for name, arguments in calls]

    return anyio.run(session)


def test_the_printed_desktop_configuration_shares_the_servers_memories(first_run):
    stored, listed = run_desktop_client(
        first_run,
        [
            ("remember", {"content": "The user's favourite editor is Helix.", "namespace": "fr"}),
            ("list_memories", {"namespace": "fr"}),
        ],
    )

    assert not stored.is_error, stored
    assert [m["content"] for m in listed.structured_content["memories"]] == [
        "The user's favourite editor is Helix."
    ]
    # The HTTP server sees the same memory: one database, not a second one.
    found = raw_call(
        f"{first_run.url}/mcp",
        first_run.api_key,
        "list_memories",
        {"namespace": "fr"},
    ).json()["result"]["structuredContent"]["memories"]
    assert [m["content"] for m in found] == ["The user's favourite editor is Helix."]
    # No second embedded database in the default data directory.
    assert not (first_run.home / ".local" / "share" / "recall").exists()


def test_the_first_user_is_not_throttled_and_the_banner_says_why(first_run):
    assert "Tier:       Unlimited" in first_run.banner
    assert "RECALL_ADMIN_TIER" in first_run.banner

    statuses = [
        raw_call(f"{first_run.url}/mcp", first_run.api_key, "list_memories", {}).status_code
        for _ in range(40)
    ]

    assert statuses == [200] * 40  # the free tier would have refused the eleventh


def test_the_keys_page_shows_the_key_as_used_right_after_calls(first_run):
    with httpx2.Client(base_url=first_run.url, follow_redirects=True) as browser:
        login = browser.get("/login/")
        csrf = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', login.text)
        assert csrf, login.text
        signed_in = browser.post(
            "/login/",
            data={
                "csrfmiddlewaretoken": csrf[1],
                "username": "admin@localhost",
                "password": first_run.password,
            },
            headers={"Referer": f"{first_run.url}/login/"},
        )
        assert signed_in.status_code == 200
        raw_call(f"{first_run.url}/mcp", first_run.api_key, "list_memories", {})

        deadline = time.monotonic() + 10
        while "within the last minute" not in (page := browser.get("/keys/").text):
            assert time.monotonic() < deadline, page
            time.sleep(0.2)


def test_the_registry_manifest_asks_for_what_the_printed_configuration_sets(first_run):
    server = first_run.config("Claude Desktop")["mcpServers"]["recall"]
    manifest = json.loads((settings.BASE_DIR / "server.json").read_text())
    [package] = manifest["packages"]
    declared = {variable["name"] for variable in package["environmentVariables"]}

    # A registry client installing the package runs `recall stdio` with the
    # variables the manifest names: the same command and settings the banner
    # printed, or it would open another database than the server's.
    arguments = package["packageArguments"]
    positional = [arg["value"] for arg in arguments if arg["type"] == "positional"]
    assert server["args"][-len(positional) :] == positional
    assert set(server["env"]) <= declared


def test_the_banner_stands_apart_from_the_log_lines(first_run):
    lines = first_run.banner.splitlines()
    start, end = (i for i, line in enumerate(lines) if line == RULE)
    framed = lines[start:end]

    assert framed[1].startswith("Recall: first run.")
    assert not [line for line in framed if line.startswith('{"ts"')]  # no log line inside
    before = "\n".join(lines[:start])
    # Every worker had finished starting before it was printed.
    assert before.count("Application startup complete.") == first_run.banner.count(
        "Application startup complete."
    )
    assert before.count("Application startup complete.") >= 1


def test_doctor_finds_the_running_server_from_the_data_directory_alone(first_run):
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in {"DATABASE_URL", "SECRET_KEY", "API_KEY_SECRET", "PORT", "HOST"}
    }
    env["RECALL_DATA_DIR"] = str(first_run.data_dir)

    done = subprocess.run(
        [sys.executable, "-m", "recall", "doctor"],
        cwd=settings.BASE_DIR,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )

    assert (
        f"ok       server              pid {first_run.process.pid} serves "
        f"http://127.0.0.1:{first_run.port}"
    ) in done.stdout, done.stdout
    assert "/ready: ready" in done.stdout
    assert f"serving 127.0.0.1:{first_run.port} to" in done.stdout
    assert "127.0.0.1:8080" not in done.stdout


def test_an_operator_command_on_a_fresh_data_directory_migrates_first(tmp_path):
    # `recall create-user` before any `recall serve` failed on a missing table.
    env = data_directory_only(tmp_path / "fresh")

    def recall(*args: str) -> subprocess.CompletedProcess[str]:
        return recall_command(*args, env=env)

    created = recall("create-user", "ops@example.com", "--tier", "pro")
    assert created.returncode == 0, created.stderr[-3000:]
    assert "Created user ops@example.com (pro)" in created.stdout
    key = recall("create-key", "ops@example.com")
    assert key.returncode == 0, key.stderr[-3000:]
    assert re.fullmatch(r"recall_live_[A-Za-z0-9_-]{32}", key.stdout.strip())

    # A database an older version migrated is not migrated under its servers.
    older = recall("manage", "migrate", "billing", "0008", "--verbosity", "0")
    assert older.returncode == 0, older.stderr[-3000:]
    refused = recall("create-key", "ops@example.com")
    assert refused.returncode == 1
    assert "lacks migrations this version brings" in refused.stderr
    shown = recall("manage", "showmigrations", "billing").stdout
    assert "[ ] 0009_billing_account_mcpize_tier" in shown  # still not applied


def test_stdio_on_a_data_directory_without_a_database_makes_none_and_says_where(tmp_path):
    # A desktop client's configuration with a wrong RECALL_DATA_DIR: `recall
    # stdio` ran initdb and the migrations there, wrote secrets, and only then
    # refused the key, which no database made there could ever hold.
    env = data_directory_only(tmp_path / "elsewhere")
    env["RECALL_API_KEY"] = "recall_live_" + "A" * 32

    ran = recall_command("stdio", env=env, timeout=60)

    assert ran.returncode == 2, ran.stderr[-3000:]
    resolved = str((tmp_path / "elsewhere").resolve())
    assert f"RECALL_DATA_DIR ({resolved}) holds no Recall database" in ran.stderr
    assert "`recall serve` makes the database" in ran.stderr
    assert env["RECALL_API_KEY"] not in ran.stderr
    assert not (tmp_path / "elsewhere").exists()


def test_stdio_on_a_database_without_users_makes_no_first_user_and_says_where(tmp_path):
    # Before, `recall stdio` created the first user and printed its password
    # and a key to stderr, the client's log, then refused the client's key
    # without naming the directory it had looked in.
    env = data_directory_only(tmp_path / "elsewhere")
    made = recall_command("manage", "migrate", "--verbosity", "0", env=env)
    assert made.returncode == 0, made.stderr[-3000:]
    env["RECALL_API_KEY"] = "recall_live_" + "A" * 32

    ran = recall_command("stdio", env=env)

    assert ran.returncode == 2, ran.stderr[-3000:]
    resolved = str((tmp_path / "elsewhere").resolve())
    wanted = f"not a valid, live API key for the database in RECALL_DATA_DIR ({resolved})"
    assert f"{wanted}, which has no users" in ran.stderr
    assert "recall_live_" not in ran.stderr.replace(env["RECALL_API_KEY"], "")
    assert RULE not in ran.stderr and RULE not in ran.stdout
    listed = recall_command("list-keys", "--all", env=env)
    assert listed.returncode == 0, listed.stderr[-3000:]
    assert "admin@localhost" not in listed.stdout, listed.stdout


def test_serve_on_a_port_in_use_stops_before_making_the_first_user(tmp_path):
    # It created the first user and key, failed to bind, then printed the
    # banner with the other server's address: secrets shown once, for a
    # database nobody could reach.
    env = data_directory_only(tmp_path / "second")
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        env.update(HOST="127.0.0.1", PORT=str(holder.getsockname()[1]))

        ran = recall_command("serve", env=env)

    assert ran.returncode == 1, ran.stderr[-3000:]
    assert f"cannot listen on 127.0.0.1:{env['PORT']} (in use: another server" in ran.stderr
    assert RULE not in ran.stdout and "recall_live_" not in ran.stdout + ran.stderr
    listed = recall_command("list-keys", "--all", env=env)
    assert listed.returncode == 0, listed.stderr[-3000:]
    assert "admin@localhost" not in listed.stdout, listed.stdout
