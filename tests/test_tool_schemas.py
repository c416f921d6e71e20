"""The published tool catalogues, pinned byte for byte on the live server.

``tools/list`` is the contract clients code against: names, descriptions,
argument schemas (bounds, patterns, aliases), output schemas with their error
branch, and annotations. Each endpoint's answer, in both protocol
generations, must be exactly the bytes kept under ``tests/tool_schemas/``. A
change to any tool's surface fails here first; when the change is meant,
regenerate the files with ``RECALL_WRITE_TOOL_SCHEMAS=1`` and review the diff.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import httpx2
import pytest

from tests.fuzz import GENERATIONS, envelope, headers
from tests.test_protected_resource import mint

SNAPSHOTS = Path(__file__).parent / "tool_schemas"
ENDPOINTS = {"mcp": "/mcp", "agent": "/agent/mcp", "v1": "/v1/mcp"}


def listed(url: str, credential: str, generation: str) -> bytes:
    body = envelope("tools/list", {}, generation)
    response = httpx2.post(
        url, headers=headers(credential, generation, body), json=body, timeout=60
    )
    assert response.status_code == 200, response.text
    return response.content


@pytest.mark.parametrize("generation", GENERATIONS)
@pytest.mark.parametrize("endpoint", sorted(ENDPOINTS))
def test_each_endpoint_publishes_exactly_its_pinned_tools(live, cast, agents, endpoint, generation):
    url = live.url + ENDPOINTS[endpoint]
    # /agent/mcp admits OAuth connections only; the others take Alice's key.
    credential = mint(cast.alice, agents.writer, url) if endpoint == "agent" else cast.alice_key.raw
    body = listed(url, credential, generation)
    snapshot = SNAPSHOTS / f"{endpoint}-{generation}.json"
    if os.environ.get("RECALL_WRITE_TOOL_SCHEMAS") == "1":
        snapshot.parent.mkdir(exist_ok=True)
        snapshot.write_bytes(body)

    pinned = snapshot.read_bytes()
    # The parsed comparison first, for a readable difference; then the bytes.
    assert json.loads(body) == json.loads(pinned)
    assert body == pinned


@pytest.mark.parametrize("snapshot", sorted(SNAPSHOTS.glob("*.json")), ids=lambda p: p.stem)
def test_every_tool_says_what_it_touches_and_reads_as_plain_text(snapshot):
    # Writes left destructiveHint unset, which MCP reads as true (remember
    # looked destructive), and openWorldHint, read as true, was never said;
    # descriptions kept their docstrings' indentation.
    tools = json.loads(snapshot.read_bytes())["result"]["tools"]
    for tool in tools:
        hints = tool["annotations"]
        assert hints["openWorldHint"] is False, tool["name"]
        if not hints["readOnlyHint"]:
            assert isinstance(hints.get("destructiveHint"), bool), tool["name"]
        assert not any(line.startswith(" ") for line in tool["description"].splitlines())
    additive = {"remember", "memory_add", "add_memory"}
    assert all(t["annotations"]["destructiveHint"] is False for t in tools if t["name"] in additive)
