"""Newer first over MCP: a restatement the write did not link comes first on /mcp and /v1/mcp.

A real SDK client on a real socket. Detection on write keeps both memories
(its evidence is below the link's confidence); the search's order puts the
newer first, both unmarked.
"""

from __future__ import annotations

import pytest

from tests.clients import call, calls, structured

pytestmark = pytest.mark.slow

OLDER = "For focus work I listen to lo-fi beats."
NEWER = "These days I focus best with no music at all."
QUESTION = "What do I listen to when I need to focus?"


def test_recall_and_search_memory_put_the_newer_restatement_first(live, cast) -> None:
    url, key = f"{live.url}/mcp", cast.alice_key.raw
    older, newer = (
        structured(r)
        for r in calls(
            url, key, [("remember", {"content": OLDER}), ("remember", {"content": NEWER})]
        )
    )
    assert "replaces" not in newer

    found = structured(call(url, key, "recall", {"query": QUESTION, "threshold": 0}))["memories"]
    v1 = structured(call(f"{live.url}/v1/mcp", key, "search_memory", {"query": QUESTION}))[
        "results"
    ]

    assert [m["id"] for m in found][:2] == [newer["id"], older["id"]]
    assert not any("superseded_by" in m for m in found)
    assert [r["id"] for r in v1][:2] == [newer["id"], older["id"]]
