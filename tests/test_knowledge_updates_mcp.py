"""Knowledge updates (issue 22) over MCP: a real SDK client on a real socket, on every endpoint.

A chain of facts is stored the way an agent would: the older value first,
the newer one later, named with ``replaces`` or not at all. The current fact
comes first, the replaced one is left out unless asked for (then marked), an
undo brings it back, and an agent never links across another agent.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from memories import services
from tests.clients import call, calls, structured, text
from tests.test_protected_resource import mint

pytestmark = pytest.mark.slow

OLD = "The staging Postgres database runs on pg-staging-3."
NEW = "Staging Postgres was migrated to pg-staging-7 last week."
QUESTION = "Which host does staging Postgres run on?"
LOOK_ALIKE = "Production Postgres runs on pg-prod-9."


def agent_token(live, user, agent) -> str:
    """An OAuth access token of ``agent``'s connection, as /agent/mcp takes."""
    return mint(user, agent, live.url + "/agent/mcp")


def test_a_chain_over_mcp_puts_the_current_fact_first_and_hides_the_old_one(live, cast) -> None:
    url, key = f"{live.url}/mcp", cast.alice_key.raw
    old, look, new = (
        structured(r)
        for r in calls(
            url,
            key,
            [
                ("remember", {"content": OLD}),
                ("remember", {"content": LOOK_ALIKE}),
                ("remember", {"content": NEW}),
            ],
        )
    )
    assert new["replaces"] == [old["id"]]
    assert "replaces" not in look

    found, marked, listed, only = (
        structured(r)
        for r in calls(
            url,
            key,
            [
                ("recall", {"query": QUESTION, "threshold": 0}),
                ("recall", {"query": QUESTION, "threshold": 0, "include_superseded": True}),
                ("list_memories", {}),
                ("list_memories", {"superseded": "only"}),
            ],
        )
    )
    ids = [m["id"] for m in found["memories"]]
    assert ids[0] == new["id"]
    assert old["id"] not in ids
    assert look["id"] in ids  # the look-alike stays current
    [older] = [m for m in marked["memories"] if m["id"] == old["id"]]
    assert older["superseded_by"] == new["id"]
    assert {m["id"] for m in listed["memories"]} == {new["id"], look["id"]}
    assert [m["id"] for m in only["memories"]] == [old["id"]]
    tagged = text(
        call(url, key, "recall", {"query": QUESTION, "threshold": 0, "include_superseded": True})
    )
    assert f'superseded_by="{new["id"]}"' in tagged


def test_an_undo_over_mcp_restores_the_older_memory(live, cast) -> None:
    url, key = f"{live.url}/mcp", cast.alice_key.raw
    [old] = [structured(call(url, key, "remember", {"content": OLD}))]
    new = structured(call(url, key, "remember", {"content": NEW, "replaces": old["id"]}))

    restored, found, history, stats, again = calls(
        url,
        key,
        [
            ("restore_memory", {"id": old["id"]}),
            ("recall", {"query": QUESTION, "threshold": 0}),
            ("memory_history", {"id": old["id"]}),
            ("memory_stats", {}),
            ("restore_memory", {"id": old["id"]}),
        ],
    )
    assert structured(restored)["was_superseded_by"] == new["id"]
    assert {old["id"], new["id"]} <= {m["id"] for m in structured(found)["memories"]}
    assert [v["action"] for v in structured(history)["history"]] == [
        "created",
        "superseded",
        "restored",
    ]
    assert structured(stats)["superseded"] == 0
    assert again.is_error and structured(again)["error"]["code"] == "conflict"


def test_as_of_over_mcp_answers_from_the_past(live, cast) -> None:
    url, key = f"{live.url}/mcp", cast.alice_key.raw
    old = structured(call(url, key, "remember", {"content": OLD}))
    listed = structured(call(url, key, "list_memories", {}))
    created = listed["memories"][0]["created_at"]
    new = structured(call(url, key, "remember", {"content": NEW, "replaces": old["id"]}))

    then = structured(
        call(url, key, "recall", {"query": QUESTION, "as_of": created, "threshold": 0})
    )

    assert [m["id"] for m in then["memories"]] == [old["id"]]
    assert then["memories"][0]["superseded_by"] == new["id"]


def test_as_of_over_mcp_and_v1_shows_each_memory_as_it_was_then(live, cast) -> None:
    url, v1, key = f"{live.url}/mcp", f"{live.url}/v1/mcp", cast.alice_key.raw
    old, look = (
        structured(r)
        for r in calls(
            url, key, [("remember", {"content": OLD}), ("remember", {"content": LOOK_ALIKE})]
        )
    )
    [created] = structured(call(url, key, "memory_history", {"id": look["id"]}))["history"]
    then = created["timestamp"]
    # The id as every tool gives it, however the caller spelled it.
    shown = structured(call(url, key, "memory_history", {"id": look["id"].upper()}))
    assert shown["id"] == look["id"]
    edited = "The staging Postgres database runs on pg-staging-5 after the disk failure."
    # Edited after T through seed 001's tool, then replaced.
    updated = call(v1, key, "update_memory", {"memory_id": old["id"], "content": edited})
    assert not updated.is_error
    new = structured(call(url, key, "remember", {"content": NEW, "replaces": old["id"]}))

    recalled = call(url, key, "recall", {"query": QUESTION, "as_of": then, "threshold": 0})
    searched = structured(call(v1, key, "search_memory", {"query": QUESTION, "as_of": then}))
    now = structured(call(url, key, "recall", {"query": QUESTION, "threshold": 0}))

    by_id = {m["id"]: m for m in structured(recalled)["memories"]}
    assert set(by_id) == {old["id"], look["id"]}
    assert (by_id[old["id"]]["content"], by_id[old["id"]]["version"]) == (OLD, 1)
    assert by_id[old["id"]]["superseded_by"] == new["id"]
    assert (by_id[look["id"]]["content"], by_id[look["id"]]["version"]) == (LOOK_ALIKE, 1)
    assert f'version="1">{OLD}</memory>' in text(recalled)
    results = {r["id"]: r for r in searched["results"]}
    assert set(results) == {old["id"], look["id"]}
    assert (results[old["id"]]["memory"], results[old["id"]]["version"]) == (OLD, 1)
    assert results[old["id"]]["superseded_by"] == new["id"]
    assert (results[look["id"]]["memory"], results[look["id"]]["version"]) == (LOOK_ALIKE, 1)
    # Now: the current fact, and no version field.
    assert now["memories"][0]["id"] == new["id"]
    assert all("version" not in m for m in now["memories"])


def test_a_foreign_replaces_is_not_found_and_writes_nothing(live, cast) -> None:
    theirs = structured(call(f"{live.url}/mcp", cast.charlie_key.raw, "remember", {"content": OLD}))
    url, key = f"{live.url}/mcp", cast.alice_key.raw

    refused, listed = calls(
        url,
        key,
        [("remember", {"content": NEW, "replaces": theirs["id"]}), ("list_memories", {})],
    )

    assert refused.is_error
    assert structured(refused)["error"]["code"] == "not_found"
    assert structured(listed)["memories"] == []


def test_a_chain_over_v1_add_memory(live, cast) -> None:
    url, key = f"{live.url}/v1/mcp", cast.alice_key.raw
    old = structured(call(url, key, "add_memory", {"content": OLD, "async": False}))
    # async (the seed's default): queued with its replacement, linked when stored.
    queued = structured(
        call(url, key, "add_memory", {"content": NEW, "replaces": old["memory_id"]})
    )
    assert queued["status"] == "queued"
    # The session's server runs no workers: this process takes the job.
    assert services.run_next_job()
    done = structured(call(live.mcp_url, key, "job_status", {"job_id": queued["job_id"]}))
    assert done["status"] == "done", done

    refused = call(url, key, "add_memory", {"content": NEW, "replaces": "not-an-id"})
    assert refused.is_error and structured(refused)["code"] == "INVALID_PARAMETERS"
    # Another user_id's memory: the seed's word for a namespace is in the message.
    elsewhere = {"content": "Something else.", "async": False, "user_id": "sarah"}
    other = call(url, key, "add_memory", {**elsewhere, "replaces": old["memory_id"]})
    assert other.is_error and "user_id" in structured(other)["error"]

    found = structured(call(url, key, "search_memory", {"query": QUESTION}))["results"]
    assert [r["id"] for r in found] == [queued["memory_id"]]
    marked = structured(
        call(url, key, "search_memory", {"query": QUESTION, "include_superseded": True})
    )["results"]
    [older] = [r for r in marked if r["id"] == old["memory_id"]]
    assert older["superseded_by"] == queued["memory_id"]
    everything = structured(call(url, key, "get_all_memories", {"superseded": "include"}))
    assert everything["total"] == 2
    assert structured(call(url, key, "get_all_memories", {}))["total"] == 1


def test_a_fact_that_changes_back_over_v1_is_the_first_memory_again(live, cast) -> None:
    url, key = f"{live.url}/v1/mcp", cast.alice_key.raw
    old = structured(call(url, key, "add_memory", {"content": OLD, "async": False}))
    new = structured(
        call(url, key, "add_memory", {"content": NEW, "async": False, "replaces": old["memory_id"]})
    )

    # The seed's default, async: announced with the id it keeps, usable at once.
    again = structured(call(url, key, "add_memory", {"content": OLD}))
    assert again["memory_id"] == old["memory_id"]
    assert services.run_next_job()

    found = structured(call(url, key, "search_memory", {"query": QUESTION}))["results"]
    assert [r["id"] for r in found] == [old["memory_id"]]
    marked = structured(
        call(url, key, "search_memory", {"query": QUESTION, "include_superseded": True})
    )["results"]
    [newer] = [r for r in marked if r["id"] == new["memory_id"]]
    assert newer["superseded_by"] == old["memory_id"]
    history = structured(call(url, key, "get_memory_history", {"memory_id": old["memory_id"]}))
    # Current again, then the replacement of what had replaced it.
    restored, replacing = history["history"][-2:]
    assert (restored["action"], replacing["action"]) == ("restored", "updated")
    assert replacing["replaces"] == [new["memory_id"]]


def test_a_chain_over_the_agent_endpoint_stays_inside_the_agent(live, cast, agents) -> None:
    url = f"{live.url}/agent/mcp"
    research = agent_token(live, cast.alice, agents.research)
    writer = agent_token(live, cast.alice, agents.writer)
    writers = structured(call(url, writer, "memory_add", {"content": OLD}))["memories"][0]
    old = structured(call(url, research, "memory_add", {"content": OLD}))["memories"][0]

    added = structured(call(url, research, "memory_add", {"content": NEW}))["memories"][0]
    foreign = call(url, research, "memory_add", {"content": NEW, "replaces": writers["id"]})
    found = structured(call(url, research, "memory_search", {"query": QUESTION}))["memories"]
    marked = structured(
        call(url, research, "memory_search", {"query": QUESTION, "include_superseded": True})
    )["memories"]
    theirs = structured(call(url, writer, "memory_search", {"query": QUESTION}))["memories"]

    assert added["replaces"] == [old["id"]]  # the research agent's own older note
    assert foreign.is_error and structured(foreign)["error"]["code"] == "not_found"
    assert found[0]["id"] == added["id"]
    assert old["id"] not in [m["id"] for m in found]
    assert [m["superseded_by"] for m in marked if m["id"] == old["id"]] == [added["id"]]
    # The writer's own memory was never linked: still current for it.
    assert [m["id"] for m in theirs] == [writers["id"]]


UNSURE_OLD = "Jess prefers beach holidays."
UNSURE_NEW = "Jess is all about mountain hiking trips now."


def test_every_endpoint_names_a_likely_older_statement_and_links_it_when_asked(
    live, cast, agents
) -> None:
    url, key = f"{live.url}/mcp", cast.alice_key.raw
    old, new = (
        structured(r)
        for r in calls(url, key, [("remember", {"content": c}) for c in (UNSURE_OLD, UNSURE_NEW)])
    )
    assert "replaces" not in new
    assert new["may_replace"] == [{"id": old["id"], "content": UNSURE_OLD}]
    linked = structured(call(url, key, "remember", {"content": UNSURE_NEW, "replaces": old["id"]}))
    assert linked == {"id": new["id"], "deduped": True, "replaces": [old["id"]]}

    v1, jess = f"{live.url}/v1/mcp", {"user_id": "jess", "async": False}  # a namespace
    first = structured(call(v1, key, "add_memory", {"content": UNSURE_OLD, **jess}))
    added = structured(call(v1, key, "add_memory", {"content": UNSURE_NEW, **jess}))
    assert added["may_replace"] == [{"id": first["memory_id"], "content": UNSURE_OLD}]

    research = agent_token(live, cast.alice, agents.research)
    agent = f"{live.url}/agent/mcp"
    [mine] = structured(call(agent, research, "memory_add", {"content": UNSURE_OLD}))["memories"]
    [note] = structured(call(agent, research, "memory_add", {"content": UNSURE_NEW}))["memories"]
    # The agent's own older note only: alice's key-written ones are another writer's.
    assert note["may_replace"] == [{"id": mine["id"], "content": UNSURE_OLD}]


def test_the_new_arguments_take_only_their_own_types_on_every_endpoint(live, cast) -> None:
    # The schema says boolean and number: "yes", 1 or "0.5" were converted
    # and taken (include_superseded "yes" on, threshold true as 1.0).
    url, v1, key = f"{live.url}/mcp", f"{live.url}/v1/mcp", cast.alice_key.raw
    refused: list[tuple[str, str, dict[str, Any]]] = [
        (url, "recall", {"query": QUESTION, "include_superseded": "yes"}),
        (url, "recall", {"query": QUESTION, "include_superseded": 1}),
        (url, "recall", {"query": QUESTION, "threshold": True}),
        (url, "recall", {"query": QUESTION, "threshold": "0.5"}),
        (url, "forget", {"mode": "all", "purge": "true"}),
        (url, "remember", {"content": OLD, "async": "false"}),
        (v1, "search_memory", {"query": QUESTION, "include_superseded": "true"}),
        (v1, "search_memory", {"query": QUESTION, "prefer_cache": "no"}),
        (v1, "add_memory", {"content": OLD, "async": 0}),
        (url, "recall", {"query": QUESTION, "as_of": "2030-01-01", "include_superseded": True}),
    ]
    for endpoint, tool, arguments in refused:
        result = call(endpoint, key, tool, arguments)
        assert result.is_error, (tool, arguments)
        said = text(result)
        assert "internal" not in said.lower(), (tool, arguments)
        # In our words, naming the argument: never the validation library's.
        named = [k for k in arguments if k not in ("query", "content", "mode")]
        assert any(k in said for k in named) and "Input should" not in said, said
    assert services.list_memories(user_id=cast.alice.id) == []
    # An integer is still a number.
    assert not call(url, key, "recall", {"query": QUESTION, "threshold": 0}).is_error


def test_a_fact_whose_newer_value_expired_is_found_again_within_seconds(live, cast) -> None:
    # The older value stayed replaced, by a memory no tool returns, until the
    # minute's clean-up: recall found nothing for up to a minute.
    url, key = f"{live.url}/mcp", cast.alice_key.raw
    old = structured(call(url, key, "remember", {"content": OLD, "namespace": "brief"}))["id"]
    newer = {"content": NEW, "namespace": "brief", "replaces": old, "ttl_seconds": 1}
    assert structured(call(url, key, "remember", newer))["replaces"] == [old]

    asked = {"query": QUESTION, "namespace": "brief", "threshold": 0}
    deadline = time.monotonic() + 10  # expiry after 1 s; the purge asks every 2 s
    while True:
        found = structured(call(url, key, "recall", asked))["memories"]
        if [m["id"] for m in found] == [old] or time.monotonic() > deadline:
            break
        time.sleep(0.5)

    assert [m["id"] for m in found] == [old]
    assert "superseded_by" not in found[0] or found[0]["superseded_by"] is None
