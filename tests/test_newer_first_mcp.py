"""Newer first over MCP: a restatement the write did not link comes first, on every endpoint.

A real SDK client on a real socket. Detection on write keeps both memories
(its evidence is below the link's confidence); the search's order puts the
newer first, and the older carries ``may_be_replaced_by``: a mark, not a
link.
"""

from __future__ import annotations

import pytest

from tests.clients import call, calls, structured, text
from tests.test_knowledge_updates_mcp import agent_token

pytestmark = pytest.mark.slow

OLDER = "The team style guide uses tabs for indentation."
NEWER = "We adopted four-space indentation across the codebase."
QUESTION = "What indentation does the team use?"
# A restatement that answers the question as well as the older one: marked.
EMPLOYER = "Cormac works at Brackenfield."
NEW_EMPLOYER = "Cormac is a staff engineer at Marlowe Robotics."
WHO = "Which company employs Cormac?"


def remember_both(url: str, key: str, first: str, second: str) -> tuple[dict, dict]:
    """``remember`` two notes in turn over one session; their results."""
    a, b = calls(url, key, [("remember", {"content": first}), ("remember", {"content": second})])
    return structured(a), structured(b)


def test_recall_and_search_memory_put_the_newer_restatement_first(live, cast) -> None:
    url, key = f"{live.url}/mcp", cast.alice_key.raw
    older, newer = remember_both(url, key, OLDER, NEWER)
    assert "replaces" not in newer

    found = structured(call(url, key, "recall", {"query": QUESTION, "threshold": 0}))["memories"]
    v1 = structured(call(f"{live.url}/v1/mcp", key, "search_memory", {"query": QUESTION}))[
        "results"
    ]

    assert [m["id"] for m in found][:2] == [newer["id"], older["id"]]
    assert not any("superseded_by" in m for m in found)
    # The newer answers the question less well than the older (by more than
    # MARK_LAG): moved, not marked.
    assert not any("may_be_replaced_by" in m for m in found)
    assert [r["id"] for r in v1][:2] == [newer["id"], older["id"]]


def test_every_endpoint_marks_an_older_memory_a_newer_one_likely_restates(
    live, cast, agents
) -> None:
    url, key = f"{live.url}/mcp", cast.alice_key.raw
    older, newer = remember_both(url, key, EMPLOYER, NEW_EMPLOYER)
    assert "replaces" not in newer

    recalled = call(url, key, "recall", {"query": WHO, "threshold": 0})
    found = structured(recalled)["memories"]
    v1 = structured(call(f"{live.url}/v1/mcp", key, "search_memory", {"query": WHO}))["results"]

    assert [m["id"] for m in found][:2] == [newer["id"], older["id"]]
    assert found[1]["may_be_replaced_by"] == newer["id"]
    assert "may_be_replaced_by" not in found[0]
    assert f'may_be_replaced_by="{newer["id"]}"' in text(recalled)
    assert [(r["id"], r.get("may_be_replaced_by")) for r in v1][:2] == [
        (newer["id"], None),
        (older["id"], newer["id"]),
    ]

    agent = f"{live.url}/agent/mcp"
    token = agent_token(live, cast.alice, agents.research)
    [mine] = structured(call(agent, token, "memory_add", {"content": EMPLOYER}))["memories"]
    [note] = structured(call(agent, token, "memory_add", {"content": NEW_EMPLOYER}))["memories"]
    searched = structured(call(agent, token, "memory_search", {"query": WHO}))["memories"]
    assert [(m["id"], m.get("may_be_replaced_by")) for m in searched][:2] == [
        (note["id"], None),
        (mine["id"], note["id"]),
    ]


def test_the_caller_can_make_the_mark_a_link(live, cast) -> None:
    url, key = f"{live.url}/mcp", cast.alice_key.raw
    older, newer = remember_both(url, key, EMPLOYER, NEW_EMPLOYER)
    marked = structured(call(url, key, "recall", {"query": WHO, "threshold": 0}))["memories"]
    assert marked[1]["may_be_replaced_by"] == newer["id"]

    linked = call(url, key, "remember", {"content": NEW_EMPLOYER, "replaces": older["id"]})
    found = structured(call(url, key, "recall", {"query": WHO, "threshold": 0}))["memories"]

    assert structured(linked)["replaces"] == [older["id"]]
    assert [m["id"] for m in found] == [newer["id"]]
    assert not any("may_be_replaced_by" in m for m in found)
