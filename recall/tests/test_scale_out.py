"""Every statement on the hot path is tenant-local, so Recall can run distributed by user_id.

``docs/scale-out.md`` describes Recall on Citus: the tenant tables distributed
by ``user_id``, the small account tables as reference tables. A distributed
database routes a statement to one shard only when the statement itself names
the distribution column (the row-level security policy's ``user_id =
current_setting(...)`` is applied on the shard, too late to route). So every
statement a tool call makes on a tenant table must filter on ``user_id`` (or
insert it), and join tenant tables only with each other.

The statements are captured from real calls: each tool of each MCP server,
then the authentication lookup and the usage writes that follow a call. A tool
without a flow here fails the test, so a new tool cannot slip past it.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from accounts import auth, services
from billing import services as billing_services
from billing import usage
from memories.mcp import agent_tools, tools, v1_tools

pytestmark = pytest.mark.django_db

# Distributed by user_id (docs/scale-out.md, "The layout").
TENANT_TABLES = {
    "memories",
    "forget_confirmations",
    "usage_events",
    "memory_history",
    "memory_jobs",
    "search_documents",
    "search_terms",
    "search_namespaces",
    "search_metadata",
    "search_generations",
}
# Replicated to every node: small, read on every request, written rarely.
REFERENCE_TABLES = {"users", "api_keys", "agents"}
# Every node's own catalog: search reads an index's row count from it
# (memories/search.py, the exact-scan cut-off; docs/scale-out.md).
CATALOG_TABLES = {"pg_class"}

# Transaction control and the tenant path's own settings route nowhere.
CONTROL = re.compile(
    r"^\s*(BEGIN|COMMIT|ROLLBACK|SAVEPOINT|RELEASE|SET\b|SELECT set_config\()", re.I
)
# A name after FROM or JOIN (unless it is a function call), INTO or UPDATE.
TABLE = re.compile(
    r"\b(?:(?:FROM|JOIN)\s+([a-z_][a-z_0-9]*)\b(?!\s*\()|(?:INTO|UPDATE)\s+([a-z_][a-z_0-9]*))",
    re.I,
)
INSERT = re.compile(r"\bINSERT\s+INTO\s+([a-z_][a-z_0-9]*)\s*\(([^)]*)\)", re.I)
ROLE = re.compile(r"SET LOCAL ROLE (\w+)", re.I)
FILTERS_USER = re.compile(r"\buser_id\s*(?:=|IN\b)", re.I)


def tables(sql: str) -> set[str]:
    plain = sql.replace('"', "")
    found = {name.lower() for pair in TABLE.findall(plain) for name in pair if name}
    # CTE names and functions are not tables.
    ctes = {
        name.lower()
        for name in re.findall(r"\b([a-z_]+)\s+AS\s+(?:MATERIALIZED\s+)?\(", plain, re.I)
    }
    return found - ctes - {"capped", "query"}


def is_tenant_local(sql: str) -> bool:
    plain = sql.replace('"', "")
    inserts = INSERT.findall(plain)
    if inserts and all(table.lower() in TENANT_TABLES for table, _ in inserts):
        return all(
            "user_id" in {column.strip().split(".")[-1] for column in columns.split(",")}
            for _, columns in inserts
        )
    return bool(FILTERS_USER.search(plain))


def check(statements: list[str], what: str, *, fan_out: str = "") -> None:
    """Assert each statement routes to one tenant's shard.

    ``fan_out`` names, for a tool that has one, what it reads across tenants
    on the operator path by design (docs/scale-out.md).
    """
    operator = False
    for sql in statements:
        role = ROLE.search(sql)
        if role:
            operator = role.group(1) == "recall_operator"
        if CONTROL.match(sql):
            continue
        touched = tables(sql)
        unknown = touched - TENANT_TABLES - REFERENCE_TABLES - CATALOG_TABLES
        assert not unknown, (
            f"{what}: {sorted(unknown)} is neither distributed nor reference:\n{sql}"
        )
        if touched & TENANT_TABLES and not is_tenant_local(sql):
            assert operator and fan_out, f"{what}: a tenant table without user_id:\n{sql}"


def captured(run: Callable[[], Any]) -> list[str]:
    with CaptureQueriesContext(connection) as queries:
        run()
    return [query["sql"] for query in queries.captured_queries]


def as_caller(cast: Any, run: Callable[[], Any], agent: Any = None) -> Callable[[], Any]:
    caller = auth.AuthContext(
        user_id=cast.alice.id,
        api_key_id=None if agent else cast.alice_key.key.id,
        tier="pro",
        agent_id=agent.id if agent else None,
    )

    def called() -> Any:
        token = auth.current.set(caller)
        try:
            result = run()
        finally:
            auth.current.reset(token)
        assert not result.is_error, result.structured_content
        return result

    return called


def stored(cast: Any, content: str) -> str:
    result = as_caller(cast, lambda: tools.remember(content=content))()
    return result.structured_content["id"]


def replaced(cast: Any) -> str:
    """Store a memory and its replacement; return the replaced one's id."""
    old = stored(cast, "The gym is on Elm Street.")
    as_caller(cast, lambda: tools.remember(content="The gym moved to Oak Street.", replaces=old))()
    return old


def preview_token(cast: Any) -> str:
    result = as_caller(cast, lambda: tools.forget(mode="by_query", query="lunch", threshold=0))()
    return result.structured_content["confirmation_token"]


Flow = Callable[[Any], Callable[[], Any]]

# One flow per tool of /mcp: what an agent's call to it does.
FLOWS: dict[str, list[tuple[str, Flow]]] = {
    "remember": [("store", lambda cast: lambda: tools.remember(content="Lunch is at noon."))],
    "recall": [
        ("search", lambda cast: lambda: tools.recall(query="when is lunch", threshold=0)),
        (
            "search with a filter",
            lambda cast: lambda: tools.recall(query="lunch", metadata_filter={"k": 1}),
        ),
    ],
    "list_memories": [("page", lambda cast: lambda: tools.list_memories(limit=5))],
    "update_memory": [
        (
            "update",
            lambda cast: (lambda id: lambda: tools.update_memory(id=id, content="Lunch at one."))(
                stored(cast, "Lunch moved.")
            ),
        )
    ],
    "forget": [
        (
            "by id",
            lambda cast: (lambda id: lambda: tools.forget(mode="by_id", id=id))(
                stored(cast, "Forget this.")
            ),
        ),
        ("preview", lambda cast: lambda: tools.forget(mode="by_query", query="lunch")),
        (
            "confirm",
            lambda cast: (
                lambda token: lambda: tools.forget(mode="by_query", confirmation_token=token)
            )(preview_token(cast)),
        ),
    ],
}


def job_id(cast: Any) -> str:
    result = as_caller(cast, lambda: tools.remember(content="Filed later.", async_=True))()
    return result.structured_content["job_id"]


FLOWS.update(
    {
        "memory_history": [
            (
                "history",
                lambda cast: (lambda id: lambda: tools.memory_history(id=id))(
                    stored(cast, "Has a past.")
                ),
            )
        ],
        "job_status": [
            (
                "status",
                lambda cast: (lambda job: lambda: tools.job_status(job_id=job))(job_id(cast)),
            )
        ],
        "restore_memory": [
            (
                "undo",
                lambda cast: (lambda id: lambda: tools.restore_memory(id=id))(replaced(cast)),
            )
        ],
        "memory_stats": [("stats", lambda cast: lambda: tools.memory_stats())],
        "health_check": [("health", lambda cast: lambda: tools.health_check())],
    }
)

# Seed 003's tools at /agent/mcp, called as Alice's writer agent.
AGENT_FLOWS: dict[str, list[tuple[str, Flow]]] = {
    "memory_add": [
        (
            "note",
            lambda cast: lambda: agent_tools.memory_add(content="The launch moved to May."),
        )
    ],
    "memory_search": [("search", lambda cast: lambda: agent_tools.memory_search(query="launch"))],
    "memory_recall": [("recall", lambda cast: lambda: agent_tools.memory_recall(query="launch"))],
    "memory_filters": [("filters", lambda cast: lambda: agent_tools.memory_filters())],
}


def v1_stored(cast: Any) -> str:
    result = as_caller(cast, lambda: v1_tools.add_memory(content="Tea at four.", async_=False))()
    return result.structured_content["memory_id"]


# Seed 001's tools at /v1/mcp.
V1_FLOWS: dict[str, list[tuple[str, Flow]]] = {
    "add_memory": [
        ("add", lambda cast: lambda: v1_tools.add_memory(content="Tea at five.", async_=False)),
        ("add later", lambda cast: lambda: v1_tools.add_memory(content="Tea at six.")),
    ],
    "search_memory": [("search", lambda cast: lambda: v1_tools.search_memory(query="tea"))],
    "get_all_memories": [("page", lambda cast: lambda: v1_tools.get_all_memories(limit=5))],
    "update_memory": [
        (
            "update",
            lambda cast: (
                lambda id: lambda: v1_tools.update_memory(memory_id=id, content="Tea at three.")
            )(v1_stored(cast)),
        )
    ],
    "delete_memory": [
        (
            "delete",
            lambda cast: (lambda id: lambda: v1_tools.delete_memory(memory_id=id))(v1_stored(cast)),
        )
    ],
    "delete_all_memories": [("delete all", lambda cast: lambda: v1_tools.delete_all_memories())],
    "get_memory_history": [
        (
            "history",
            lambda cast: (lambda id: lambda: v1_tools.get_memory_history(memory_id=id))(
                v1_stored(cast)
            ),
        )
    ],
    "cache_stats": [("stats", lambda cast: lambda: v1_tools.cache_stats())],
    "optimize_cache": [("optimize", lambda cast: lambda: v1_tools.optimize_cache())],
    "health_check": [("health", lambda cast: lambda: v1_tools.health_check())],
}

# Tools that read across tenants on purpose, on the operator path, and why:
# none now (health_check's queue depth is the caller's own).
FAN_OUT: dict[str, str] = {}

CATALOGUES = [
    ("mcp", tools.TOOLS, FLOWS, False),
    ("agent", agent_tools.TOOLS, AGENT_FLOWS, True),
    ("v1", v1_tools.TOOLS, V1_FLOWS, False),
]
CASES = [
    (server, tool, label)
    for server, _, flows, _ in CATALOGUES
    for tool, made in flows.items()
    for label, _ in made
]


@pytest.mark.parametrize("server", [name for name, *_ in CATALOGUES])
def test_every_tool_of_every_server_has_a_flow_here(server):
    [(catalogue, flows)] = [(c, f) for name, c, f, _ in CATALOGUES if name == server]
    assert {fn.__name__ for fn, _ in catalogue} == set(flows)


@pytest.mark.parametrize(("server", "tool", "label"), CASES)
def test_each_tool_calls_statements_only_tenant_local(cast, agents, server, tool, label):
    stored(cast, "Lunch is at noon.")
    [(flows, as_agent)] = [(f, a) for name, _, f, a in CATALOGUES if name == server]
    [make] = [make for name, make in flows[tool] if name == label]
    run = as_caller(cast, make(cast), agents.writer if as_agent else None)

    check(captured(run), f"{server} {tool} ({label})", fan_out=FAN_OUT.get(tool, ""))


def test_authentication_and_usage_writes_route_to_one_node(cast):
    auth.reset()
    check(captured(lambda: auth.authenticate(cast.alice_key.raw)), "authentication")

    event = usage.Event(
        user_id=cast.alice.id,
        api_key_id=cast.alice_key.key.id,
        request_id="r",
        tool_name="recall",
        success=True,
        error_code=None,
        latency_ms=3,
    )
    saving = captured(
        lambda: billing_services.save_usage_events(user_id=cast.alice.id, events=[event])
    )
    check(saving, "usage events")
    touching = captured(lambda: services.record_key_use({cast.alice_key.key.id: event.occurred_at}))
    check(touching, "key last used")


def test_the_check_itself_catches_a_statement_without_the_user():
    with pytest.raises(AssertionError, match="without user_id"):
        check(["SELECT id FROM memories WHERE namespace = %s"], "a forgetful query")
    with pytest.raises(AssertionError, match="without user_id"):
        check(["WITH j AS (INSERT INTO memory_jobs (id) VALUES (%s)) SELECT 1"], "a lost insert")
    with pytest.raises(AssertionError, match="without user_id"):
        check(["SELECT count(*) FROM memory_jobs"], "a fan-out nobody declared")
    check(
        ["SET LOCAL ROLE recall_operator", "SELECT count(*) FROM memory_jobs"],
        "a declared fan-out",
        fan_out="the queue",
    )
    with pytest.raises(AssertionError, match="neither distributed nor reference"):
        check(["SELECT * FROM somewhere_new WHERE user_id = %s"], "an unplanned table")
    check(["INSERT INTO memories (id, user_id) VALUES (%s, %s)"], "an insert")
