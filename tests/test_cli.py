"""The `recall` command: one command to serve, and the operator's key commands."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx2
import pytest
from django.conf import settings
from django.core.management import call_command
from django.core.management.base import CommandError

from accounts import auth
from accounts.models import ApiKey, User
from core import tenancy
from recall.cli import ADMIN_COMMANDS
from tests.clients import call, structured
from tests.support import free_port

pytestmark = pytest.mark.slow


def recall_command(*args: str, env: dict[str, str], timeout: float = 300):
    return subprocess.run(
        [sys.executable, "-m", "recall", *args],
        cwd=settings.BASE_DIR,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def start_serve(data_dir: Path, port: int) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if k not in {"DATABASE_URL"}}
    env.update(RECALL_DATA_DIR=str(data_dir), PORT=str(port))
    return subprocess.Popen(
        [sys.executable, "-m", "recall", "serve"],
        cwd=settings.BASE_DIR,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_ready(url: str, process: subprocess.Popen[str], timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert process.poll() is None, process.stderr.read() if process.stderr else ""
        try:
            if httpx2.get(f"{url}/ready").status_code == 200:
                return
        except httpx2.TransportError:
            pass
        time.sleep(0.3)
    raise AssertionError("recall serve did not become ready")


def test_serve_starts_everything_on_a_fresh_machine_and_stops_cleanly(tmp_path):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    first = start_serve(tmp_path, port)
    try:
        wait_ready(url, first)
        [record] = (tmp_path / "servers").glob("*.json")  # where doctor finds the server
        assert json.loads(record.read_text())["port"] == port
        first.send_signal(signal.SIGTERM)
        out, err = first.communicate(timeout=60)
    finally:
        if first.poll() is None:
            first.kill()
    assert first.returncode == 0, err
    assert not record.exists()  # removed as the server stopped
    key = re.search(r"API key:\s+(recall_live_[A-Za-z0-9_-]{32})", out).group(1)
    assert '"Authorization": "Bearer ' + key in out  # a ready-to-paste client configuration
    assert re.search(r"sign in as admin@localhost / \S+", out)
    assert not (tmp_path / "pgdata" / "postmaster.pid").exists()  # the database stopped too

    # Second run: same data, no new secrets printed, and the first key works.
    second = start_serve(tmp_path, port)
    try:
        wait_ready(url, second)
        result = call(f"{url}/mcp", key, "remember", {"content": "Survives restarts."})
        assert structured(result)["deduped"] is False
        second.send_signal(signal.SIGINT)
        out, _ = second.communicate(timeout=60)
    finally:
        if second.poll() is None:
            second.kill()
    assert "API key:" not in out
    assert second.returncode == 0


@pytest.mark.django_db
def test_operators_create_users_and_keys_set_tiers_and_revoke_keys(capsys):
    call_command("create_user", "dana@example.com", "--tier", "pro")
    assert "Created user dana@example.com (pro)" in capsys.readouterr().out

    call_command("create_key", "DANA@example.com", "--name", "laptop")
    captured = capsys.readouterr()
    raw = captured.out.strip()
    assert re.fullmatch(r"recall_live_[A-Za-z0-9_-]{32}", raw)
    assert "cannot be shown again" in captured.err

    call_command("list_keys", "dana@example.com")
    listed = capsys.readouterr().out
    assert raw[:20] in listed and raw not in listed and "pro" in listed and "1 key." in listed

    call_command("set_tier", "dana@example.com", "unlimited")
    assert "now unlimited" in capsys.readouterr().out
    assert auth.authenticate(raw).tier == "unlimited"

    call_command("revoke_key", raw[:20])
    assert "Revoked key" in capsys.readouterr().out
    assert ApiKey.objects.for_key(raw) is None
    with tenancy.operator():
        assert ApiKey.objects.get(user__email="dana@example.com").revoked_at is not None
    assert User.objects.get(email="dana@example.com").tier == "unlimited"


@pytest.mark.django_db
def test_a_leaked_key_is_revoked_by_pasting_the_whole_key(capsys):
    # review145: only the id or the display prefix worked; the whole key, what
    # someone revoking a leaked key has to hand, was "No API key matches".
    call_command("create_user", "ivy@example.com")
    capsys.readouterr()
    call_command("create_key", "ivy@example.com")
    raw = capsys.readouterr().out.strip()
    call_command("create_key", "ivy@example.com")  # another key, left alone
    other = capsys.readouterr().out.strip()

    call_command("revoke_key", raw)
    said = capsys.readouterr()
    assert "Revoked key" in said.out and raw[:20] in said.out
    assert raw not in said.out + said.err  # the secret is never echoed
    assert auth.authenticate(raw) is None
    assert auth.authenticate(other) is not None

    call_command("revoke_key", raw)
    assert "already revoked" in capsys.readouterr().out

    # A well-formed key of no row: the refusal says what it takes, not the secret.
    wrong = raw[:20] + ("A" if raw[20] != "A" else "B") + raw[21:]
    with pytest.raises(CommandError) as refused:
        call_command("revoke_key", wrong)
    message = str(refused.value)
    assert wrong not in message and wrong[20:] not in message
    assert "the key's id, its display prefix" in message and "or the whole key" in message
    # Pasted with what stood around it, the key was repeated whole (review148).
    for pasted in (f"Bearer {wrong}", f"RECALL_API_KEY={wrong}", "x" * 60):
        with pytest.raises(CommandError) as refused:
            call_command("revoke_key", pasted)
        assert wrong[20:] not in str(refused.value) and "x" * 30 not in str(refused.value)


@pytest.mark.django_db
def test_a_user_created_without_a_password_is_told_how_to_sign_in(capsys, monkeypatch):
    call_command("create_user", "gil@example.com")
    out = capsys.readouterr().out

    assert "gil@example.com has no password, so cannot sign in to the dashboard yet" in out
    assert "`recall manage changepassword gil@example.com`" in out
    # The command it names works for an email: it sets a password to sign in with.
    from django.contrib.auth.management.commands import changepassword

    monkeypatch.setattr(changepassword.getpass, "getpass", lambda prompt: "a-Sound-passw0rd!")
    call_command("changepassword", "gil@example.com")
    assert User.objects.get(email="gil@example.com").check_password("a-Sound-passw0rd!")

    call_command("create_user", "hal@example.com", "--password", "another-Sound-passw0rd")
    assert "cannot sign in" not in capsys.readouterr().out


@pytest.mark.django_db
def test_an_operator_scopes_a_key_to_an_agent(capsys):
    from accounts.models import Agent

    call_command("create_user", "fay@example.com")
    fay = User.objects.get(email="fay@example.com")
    with tenancy.operator():
        research = Agent.objects.create(user=fay, name="research")
    capsys.readouterr()

    call_command("create_key", "fay@example.com", "--agent", "Research")
    captured = capsys.readouterr()

    assert "as agent research" in captured.err
    assert auth.authenticate(captured.out.strip()).agent_id == research.id
    with pytest.raises(CommandError, match=r"no agent called 'nobody'\. Agents are made on the"):
        call_command("create_key", "fay@example.com", "--agent", "nobody")


@pytest.mark.django_db
def test_operator_commands_explain_their_errors():
    with pytest.raises(CommandError, match="No user with email"):
        call_command("create_key", "nobody@example.com")
    call_command("create_user", "erin@example.com")
    with pytest.raises(CommandError, match="already exists"):
        call_command("create_user", "Erin@example.com")
    with pytest.raises(CommandError, match="No API key matches"):
        call_command("revoke_key", "recall_live_nothing")
    with pytest.raises(CommandError, match="No user with email"):
        call_command("set_tier", "nobody@example.com", "pro")
    with pytest.raises(CommandError, match="No user with email"):  # it said "0 keys."
        call_command("list_keys", "nobody@example.com")


@pytest.mark.parametrize(
    "command", ["serve", "stdio", "worker", "doctor", "manage", *ADMIN_COMMANDS]
)
def test_help_on_any_command_touches_no_data_directory_or_database(tmp_path, command):
    data_dir = tmp_path / "never-created"
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in {"DATABASE_URL", "SECRET_KEY", "API_KEY_SECRET"}
    }
    env["RECALL_DATA_DIR"] = str(data_dir)

    helped = recall_command(command, "--help", env=env, timeout=120)

    assert helped.returncode == 0, helped.stderr
    # Named as the operator types it: `recall create-key`, never Django's
    # `recall create_key`, and `recall manage help`, not `recall help`.
    wanted = (
        "Type 'recall manage help <subcommand>'"
        if command == "manage"
        else f"usage: recall {command} "
    )
    assert helped.stdout.lstrip().startswith(wanted), helped.stdout[:300]
    # No secrets generated, no embedded PostgreSQL initialised or started there.
    assert not data_dir.exists()


def test_the_cli_explains_itself():
    env = dict(os.environ)
    helped = recall_command("--help", env=env)
    assert helped.returncode == 0 and "recall serve" in helped.stdout
    unknown = recall_command("frobnicate", env=env)
    assert unknown.returncode == 2 and "unknown command" in unknown.stderr
    # Recall's version, never Django's (a subcommand's --version printed 5.2.x).
    for argv in (["--version"], ["create-key", "--version"]):
        shown = recall_command(*argv, env=env)
        assert re.fullmatch(r"recall \d+\.\d+\.\d+\S*\n", shown.stdout), shown.stdout


@pytest.mark.parametrize(
    ("command", "setting", "said"),
    [
        ("serve", {"LOG_LEVEL": "verbose"}, "LOG_LEVEL must be one of"),
        ("worker", {"RATE_LIMIT_FREE": "10/day"}, "RATE_LIMIT_FREE"),
        ("list-keys", {"PORT": "abc"}, "PORT"),
        ("create-key", {"RECALL_DATA_DIR": "a-file"}, "cannot hold its secrets"),
    ],
)
def test_a_bad_setting_is_one_line_naming_it_not_a_traceback(tmp_path, command, setting, said):
    # Each was some thirty lines of stack above the message; a desktop client's
    # log shows a stdio server's stderr and nothing else.
    env = {k: v for k, v in os.environ.items() if k not in {"DATABASE_URL"}}
    env["RECALL_DATA_DIR"] = str(tmp_path / "data")
    (tmp_path / "a-file").write_text("not a directory")
    env.update({k: str(tmp_path / v) if v == "a-file" else v for k, v in setting.items()})

    operand = [] if command in ("serve", "worker") else ["someone@example.com"]
    refused = recall_command(command, *operand, env=env, timeout=120)

    assert refused.returncode == 2
    assert "Traceback" not in refused.stderr
    [line] = refused.stderr.strip().splitlines()
    assert line.startswith(f"recall {command}: configuration: ") and said in line, line


@pytest.mark.parametrize(
    ("argv", "usage"),
    [
        (["import", "--from", "mem0", "--help"], "usage: recall import "),
        (["manage", "migrate", "--help"], "usage: recall manage migrate "),
    ],
)
def test_a_subcommands_usage_names_it_as_typed(tmp_path, argv, usage):
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    env["RECALL_DATA_DIR"] = str(tmp_path / "never-created")

    helped = recall_command(*argv, env=env, timeout=120)

    assert helped.returncode == 0, helped.stderr
    assert helped.stdout.startswith(usage), helped.stdout[:300]
