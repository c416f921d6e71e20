"""`recall stdio`: the same tools for desktop clients, as RECALL_API_KEY's user, same limits."""

from __future__ import annotations

import os
import subprocess
import sys

import anyio
import pytest
from django.conf import settings
from mcp import Client
from mcp.client.stdio import StdioServerParameters

from tests.clients import MODES, structured
from tests.conftest import usage_events
from tests.support import database_url

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
        [("list_memories", {}), ("list_memories", {}), ("list_memories", {})],
    )

    assert [r.is_error for r in results] == [False, False, True]
    assert structured(results[2])["error"]["code"] == "rate_limited"
    events = usage_events(3)
    assert (events[2].error_code, events[2].tokens_consumed) == ("rate_limited", 0)


def test_stdio_refuses_to_start_without_a_valid_key(cast):
    for key in ("", "recall_live_" + "B" * 32):
        params = stdio_server(key)
        result = subprocess.run(
            [params.command, *params.args],
            env=params.env,
            cwd=params.cwd,
            capture_output=True,
            text=True,
            timeout=120,
            stdin=subprocess.DEVNULL,
        )
        assert result.returncode == 2
        assert "RECALL_API_KEY" in result.stderr
        assert result.stdout == ""  # stdout is the protocol channel
