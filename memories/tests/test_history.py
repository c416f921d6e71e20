"""Memory history: a version row for every change, written by the database, and purges."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.db.utils import ProgrammingError
from django.utils import timezone

from accounts.tiers import Tier
from core import context, tenancy
from core.errors import Conflict, NotFound
from memories import services
from memories.models import MemoryHistory


def remember(user_id, content, **kwargs):
    return services.remember(user_id=user_id, tier=Tier.PRO, content=content, **kwargs)["id"]


def history_rows(memory_id) -> list[MemoryHistory]:
    with tenancy.operator():
        return list(MemoryHistory.objects.filter(memory_id=memory_id).order_by("version"))


def test_every_change_is_a_version_oldest_first(cast):
    memory_id = remember(cast.alice.id, "The user prefers dark mode", metadata={"v": 1})
    services.update_memory(user_id=cast.alice.id, id=memory_id, content="The user loves dark mode")
    services.update_memory(user_id=cast.alice.id, id=memory_id, priority="high")
    services.forget_by_id(user_id=cast.alice.id, id=memory_id)

    versions = services.memory_history(user_id=cast.alice.id, id=memory_id)

    assert [(v["version"], v["action"]) for v in versions] == [
        (1, "created"),
        (2, "updated"),
        (3, "updated"),
        (4, "deleted"),
    ]
    assert [v["content"] for v in versions] == [
        "The user prefers dark mode",
        "The user loves dark mode",
        "The user loves dark mode",
        "The user loves dark mode",  # a deletion records the memory as it was
    ]
    assert [v["priority"] for v in versions] == ["medium", "medium", "high", "high"]
    assert versions[0]["metadata"] == {"v": 1}
    assert all(v["timestamp"].endswith("Z") for v in versions)


def test_each_version_names_the_client_and_key_that_made_it(cast):
    with context.acting_as("mcp", cast.alice_key.key.id):
        memory_id = remember(cast.alice.id, "made through Alice's key")
    with context.acting_as("v1", cast.bob_key.key.id):
        services.update_memory(user_id=cast.alice.id, id=memory_id, metadata={"by": "bob"})
    with context.acting_as("dashboard"):
        services.forget_by_id(user_id=cast.alice.id, id=memory_id)

    versions = services.memory_history(user_id=cast.alice.id, id=memory_id)

    assert [(v["client"], v["api_key_id"]) for v in versions] == [
        ("mcp", str(cast.alice_key.key.id)),
        ("v1", str(cast.bob_key.key.id)),
        ("dashboard", None),
    ]


def test_a_change_made_with_no_actor_is_recorded_as_system(cast):
    memory_id = remember(cast.alice.id, "no one in particular")

    [created] = services.memory_history(user_id=cast.alice.id, id=memory_id)

    assert (created["client"], created["api_key_id"]) == ("system", None)


def test_a_change_nobody_can_see_writes_no_version(cast):
    memory_id = remember(cast.alice.id, "same words")
    # The same content again, and the vector alone recomputed (what reembed does).
    services.update_memory(user_id=cast.alice.id, id=memory_id, content="same words")
    with tenancy.operator(), connection.cursor() as cursor:
        cursor.execute("UPDATE memories SET embedding_model = 'other' WHERE id = %s", [memory_id])

    assert [v["version"] for v in services.memory_history(user_id=cast.alice.id, id=memory_id)] == [
        1
    ]


def test_a_change_that_fails_leaves_no_version(cast):
    first = remember(cast.alice.id, "first")
    second = remember(cast.alice.id, "second")

    with pytest.raises(Conflict):
        services.update_memory(user_id=cast.alice.id, id=second, content="first")

    assert [v["version"] for v in services.memory_history(user_id=cast.alice.id, id=second)] == [1]
    assert len(history_rows(first)) == 1


def test_another_tenants_history_does_not_exist_for_you(cast):
    memory_id = remember(cast.alice.id, "Alice's secret")

    with pytest.raises(NotFound):
        services.memory_history(user_id=cast.charlie.id, id=memory_id)
    with tenancy.tenant(cast.charlie.id), connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM memory_history")
        assert cursor.fetchone()[0] == 0


@pytest.mark.parametrize(
    "statement",
    [
        "UPDATE memory_history SET content = 'rewritten'",
        "DELETE FROM memory_history",
    ],
)
def test_the_tenant_path_cannot_rewrite_or_delete_history(cast, statement):
    remember(cast.alice.id, "kept as it was")

    with (
        pytest.raises(ProgrammingError, match="permission denied"),
        tenancy.tenant(cast.alice.id),
        connection.cursor() as cursor,
    ):
        cursor.execute(statement)


def test_the_purge_function_spares_the_history_of_a_live_memory(cast):
    memory_id = remember(cast.alice.id, "still here")

    with tenancy.tenant(cast.alice.id), connection.cursor() as cursor:
        cursor.execute("SELECT recall_purge_history(ARRAY[%s]::uuid[])", [memory_id])
        assert cursor.fetchone()[0] == 0

    assert len(history_rows(memory_id)) == 1


def test_the_purge_function_leaves_the_reasons_of_a_live_memorys_links(cast):
    old = remember(cast.alice.id, "Staging Postgres runs on pg-staging-3.")
    new = remember(cast.alice.id, "Staging Postgres was migrated to pg-staging-7 last week.")

    with tenancy.tenant(cast.alice.id), connection.cursor() as cursor:
        cursor.execute("SELECT recall_purge_history(ARRAY[%s]::uuid[])", [new])
        assert cursor.fetchone()[0] == 0

    [linked] = [row for row in history_rows(old) if row.action == "superseded"]
    assert str(linked.superseded_by) == new
    assert "pg-staging-7" in linked.decision["reason"]


def test_the_purge_function_cannot_reach_another_tenants_history(cast):
    memory_id = remember(cast.alice.id, "Alice's, deleted")
    services.forget_by_id(user_id=cast.alice.id, id=memory_id)

    with tenancy.tenant(cast.charlie.id), connection.cursor() as cursor:
        cursor.execute("SELECT recall_purge_history(ARRAY[%s]::uuid[])", [memory_id])
        assert cursor.fetchone()[0] == 0

    assert len(history_rows(memory_id)) == 2


def test_a_deleted_memorys_history_outlives_it_until_the_retention_purge(cast, settings):
    settings.HISTORY_RETENTION_DAYS = 30
    gone = remember(cast.alice.id, "deleted long ago")
    kept = remember(cast.alice.id, "still alive")
    services.update_memory(user_id=cast.alice.id, id=kept, metadata={"edited": True})
    services.forget_by_id(user_id=cast.alice.id, id=gone)

    services.clean_up(now=timezone.now() + timedelta(days=29))
    assert len(history_rows(gone)) == 2

    done = services.clean_up(now=timezone.now() + timedelta(days=31))

    assert done is not None and done.history_rows == 2
    assert history_rows(gone) == []
    assert len(history_rows(kept)) == 2  # a live memory's history is never aged out
    with pytest.raises(NotFound):
        services.memory_history(user_id=cast.alice.id, id=gone)


def test_forget_with_purge_removes_the_history_at_once(cast):
    gone = remember(cast.alice.id, "really gone")
    services.update_memory(user_id=cast.alice.id, id=gone, content="really, really gone")

    result = services.forget_by_id(user_id=cast.alice.id, id=gone, purge=True)

    assert result == {"success": True, "purged": True}
    assert history_rows(gone) == []


def test_deleting_a_user_deletes_their_history(cast):
    memory_id = remember(cast.alice.id, "goes with Alice")

    with tenancy.operator():
        cast.alice.delete()

    assert history_rows(memory_id) == []


SECRET = "Swordfish-7731 is the vault code"


def rows_holding(text: str) -> list[str]:
    """Return ``table.column`` for every text, JSON or array value anywhere that contains ``text``.

    Reads every table in the schema on the operator path, which every
    row-level security policy admits.
    """
    found = []
    with tenancy.operator(), connection.cursor() as cursor:
        cursor.execute(
            "SELECT table_name, column_name FROM information_schema.columns"
            " WHERE table_schema = 'public'"
            " AND data_type IN ('text', 'character varying', 'jsonb', 'json', 'ARRAY')"
        )
        for table, column in cursor.fetchall():
            cursor.execute(
                # Names come from the catalog itself, quoted.
                f'SELECT count(*) FROM "{table}" WHERE "{column}"::text LIKE %s',  # noqa: S608
                [f"%{text}%"],
            )
            if cursor.fetchone()[0]:
                found.append(f"{table}.{column}")
    return found


def test_after_a_purge_no_row_in_any_table_holds_the_content(cast):
    from billing import services as billing_services
    from billing.usage import Event

    with context.acting_as("mcp", cast.alice_key.key.id):
        memory_id = remember(cast.alice.id, SECRET, metadata={"note": SECRET})
        services.update_memory(user_id=cast.alice.id, id=memory_id, content=SECRET + ", really")
        services.remember(
            user_id=cast.alice.id,
            tier=Tier.PRO,
            messages=[{"role": "user", "content": SECRET + " (said aloud)"}],
            thread_id="vault",
        )
        services.remember(
            user_id=cast.alice.id,
            tier=Tier.PRO,
            content=SECRET + " (queued)",
            background=True,
            idempotency_key="vault-1",
        )
    assert services.run_next_job()
    billing_services.save_usage_events(
        user_id=cast.alice.id,
        events=[
            Event(
                user_id=cast.alice.id,
                api_key_id=cast.alice_key.key.id,
                request_id="r1",
                tool_name="remember",
                success=True,
                latency_ms=3,
            )
        ],
    )
    assert "memories.content" in rows_holding(SECRET)
    assert "memory_history.content" in rows_holding(SECRET)

    preview = services.forget_preview(user_id=cast.alice.id, query=SECRET, threshold=0.3)
    assert preview["total_matches"] == 3, preview["matches"]
    services.forget_confirm(
        user_id=cast.alice.id, confirmation_token=preview["confirmation_token"], purge=True
    )

    assert rows_holding(SECRET) == []
    assert rows_holding("Swordfish") == []
