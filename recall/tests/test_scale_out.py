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
from memories import tools

pytestmark = pytest.mark.django_db

# Distributed by user_id (docs/scale-out.md, "Tables").
TENANT_TABLES = {"memories", "forget_confirmations", "usage_events"}
# Replicated to every node: small, read on every request, written rarely.
REFERENCE_TABLES = {"users", "api_keys"}

# Transaction control and the tenant path's own settings route nowhere.
CONTROL = re.compile(
    r"^\s*(BEGIN|COMMIT|ROLLBACK|SAVEPOINT|RELEASE|SET\b|SELECT set_config\()", re.I
)
TABLE = re.compile(r"\b(?:FROM|JOIN|INTO|UPDATE)\s+([a-z_][a-z_0-9]*)", re.I)
FILTERS_USER = re.compile(r"\buser_id\s*(?:=|IN\b)", re.I)


def tables(sql: str) -> set[str]:
    plain = sql.replace('"', "")
    found = {name.lower() for name in TABLE.findall(plain)}
    # CTE names and functions are not tables.
    ctes = {
        name.lower()
        for name in re.findall(r"\b([a-z_]+)\s+AS\s+(?:MATERIALIZED\s+)?\(", plain, re.I)
    }
    return found - ctes - {"capped", "query"}


def is_tenant_local(sql: str) -> bool:
    plain = sql.replace('"', "")
    if plain.lstrip().upper().startswith("INSERT"):
        columns = plain.split("(", 1)[1].split(")", 1)[0]
        return "user_id" in {column.strip().split(".")[-1] for column in columns.split(",")}
    return bool(FILTERS_USER.search(plain))


def check(statements: list[str], what: str) -> None:
    assert statements, f"{what}: no statements captured"
    for sql in statements:
        if CONTROL.match(sql):
            continue
        touched = tables(sql)
        unknown = touched - TENANT_TABLES - REFERENCE_TABLES
        assert not unknown, (
            f"{what}: {sorted(unknown)} is neither distributed nor reference:\n{sql}"
        )
        if touched & TENANT_TABLES:
            assert is_tenant_local(sql), f"{what}: a tenant table without user_id:\n{sql}"


def captured(run: Callable[[], Any]) -> list[str]:
    with CaptureQueriesContext(connection) as queries:
        run()
    return [query["sql"] for query in queries.captured_queries]


def as_caller(cast: Any, run: Callable[[], Any]) -> Callable[[], Any]:
    caller = auth.AuthContext(user_id=cast.alice.id, api_key_id=cast.alice_key.key.id, tier="pro")

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


def preview_token(cast: Any) -> str:
    result = as_caller(cast, lambda: tools.forget(mode="by_query", query="lunch", threshold=0))()
    return result.structured_content["confirmation_token"]


# One flow per tool: what an agent's call to it does.
FLOWS: dict[str, list[tuple[str, Callable[[Any], Callable[[], Any]]]]] = {
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


def test_every_tool_has_a_flow_here():
    assert {fn.__name__ for fn, _ in tools.TOOLS} == set(FLOWS)


@pytest.mark.parametrize(
    ("tool", "label"), [(tool, label) for tool, flows in FLOWS.items() for label, _ in flows]
)
def test_each_tool_calls_statements_only_tenant_local(cast, tool, label):
    stored(cast, "Lunch is at noon.")
    [make] = [make for name, make in FLOWS[tool] if name == label]
    run = as_caller(cast, make(cast))

    check(captured(run), f"{tool} ({label})")


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
    with pytest.raises(AssertionError, match="neither distributed nor reference"):
        check(["SELECT * FROM somewhere_new WHERE user_id = %s"], "an unplanned table")
    check(["INSERT INTO memories (id, user_id) VALUES (%s, %s)"], "an insert")
