"""A filtered recall of a big namespace returns exactly the top k of the memories it matches.

The exact-scan cut-off (``RECALL_EXACT_SEARCH_MAX``) is lowered to 200 here,
so that a namespace of 330 memories is a big one, searched through the HNSW
index, without loading thousands of rows (whose statistics would steer other
modules' plans). 4% of the memories carry ``{"team": "blue"}``, 30%
``{"kind": "note"}`` and 80% ``{"bulk": true}``; creation times are an hour
apart. A filter that matches at most the cut-off is found through its indexes
and ranked exactly, in one pass (``recall_filtered_nearest``, migration 0012,
under forced row-level security); these tests compare it with an exact scan
of the matching rows. A broader filter is searched the way unfiltered recall is, and still
fills the limit. Charlie, another tenant, has memories with the same metadata
and vectors; they never appear.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
import pytest
from django.db import connection
from pgvector import Vector

from accounts.models import Agent, User
from core import tenancy
from memories import embeddings, search, services
from memories.embeddings.cache import scope
from memories.tests.test_recall_at_scale import synthetic_vectors

pytestmark = pytest.mark.slow

SIZE = 300
CUT_OFF = 200
NOW = datetime(2026, 6, 1, tzinfo=UTC)
QUERIES = [
    "web frameworks the user prefers",
    "when the team deploys",
    "allergies and medicine",
    "what the family grows in the garden",
    "music and instruments",
]


def metadata_for(n: int) -> dict[str, object]:
    tags: dict[str, object] = {}
    if n % 25 == 0:
        tags["team"] = "blue"
    if n % 10 < 3:
        tags["kind"] = "note"
    if n % 5 != 0:
        tags["bulk"] = True
    return tags


def insert(user: User, vectors: np.ndarray, agent: Agent | None = None) -> None:
    model = embeddings.get_embedder().model_id
    rows = [
        (
            str(uuid.uuid4()),
            str(user.id),
            str(agent.id) if agent else None,
            f"synthetic {n}",
            hashlib.sha256(f"{user.id}-{agent}-{n}".encode()).hexdigest(),
            Vector(vector).to_text(),
            model,
            json.dumps(metadata_for(n)),
            NOW - timedelta(hours=n),
        )
        for n, vector in enumerate(vectors)
    ]
    with tenancy.operator(), connection.cursor() as cursor:
        cursor.executemany(
            "INSERT INTO memories (id, user_id, agent_id, namespace, content, content_hash,"
            " embedding, embedding_model, metadata, created_at)"
            " VALUES (%s, %s, %s, 'default', %s, %s, %s::vector, %s, %s::jsonb, %s)",
            rows,
        )


@pytest.fixture(scope="module")
def tenants(django_db_setup, django_db_blocker):
    rng = np.random.default_rng(11)
    with django_db_blocker.unblock():
        alice = User.objects.create_user("filtered-alice@example.com")
        charlie = User.objects.create_user("filtered-charlie@example.com")
        vectors = synthetic_vectors(SIZE, rng)
        insert(alice, vectors)
        insert(charlie, vectors)  # the same vectors and metadata, another tenant
        with tenancy.operator():
            scout = Agent.objects.create(user=alice, name="scout")
            writer = Agent.objects.create(user=alice, name="writer")
        insert(alice, synthetic_vectors(30, rng), agent=scout)
        yield alice, charlie, scout, writer
        with tenancy.operator():
            User.objects.filter(id__in=[alice.id, charlie.id]).delete()


@pytest.fixture(autouse=True)
def cut_off(settings):
    settings.RECALL_EXACT_SEARCH_MAX = CUT_OFF
    settings.RECALL_EXACT_SEARCH_RATIO = 0  # not more in a big test database


def exact_top(
    user: User, query: str, where: str, params: list[Any], k: int = 10, *, floor: bool = True
) -> list[str]:
    """The true k nearest of the user's memories that satisfy ``where`` (an exact scan).

    With ``floor``, only those within recall's own floor: threshold 0, a
    cosine similarity of 0 or more.
    """
    vector = Vector(embeddings.get_embedder().embed_one(query)).to_text()
    with tenancy.operator(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_indexscan = off")
        cursor.execute("SET LOCAL enable_bitmapscan = off")
        cursor.execute(
            # S608: ``where`` is this test's own SQL; values are parameters.
            "SELECT id FROM memories WHERE user_id = %s AND embedding <=> %s::vector <= %s AND "  # noqa: S608
            + where
            + " ORDER BY embedding <=> %s::vector, id LIMIT %s",
            [str(user.id), vector, 1 if floor else 2, *params, vector, k],
        )
        return [str(row[0]) for row in cursor.fetchall()]


def recalled(user: User, query: str, **filters: Any) -> list[str]:
    found = services.recall(
        user_id=user.id, query=query, limit=10, threshold=0, mode="semantic", **filters
    )
    return [memory["id"] for memory in found]


@pytest.mark.parametrize("query", QUERIES)
def test_a_rare_metadata_filter_returns_exactly_the_top_k_of_its_matches(db, tenants, query):
    alice, *_ = tenants
    expected = exact_top(alice, query, "metadata @> %s::jsonb", ['{"team": "blue"}'])

    assert recalled(alice, query, metadata_filter={"team": "blue"}) == expected


@pytest.mark.parametrize("query", QUERIES[:3])
def test_a_thirty_percent_filter_under_the_cut_off_is_exact_too(db, tenants, query):
    alice, *_ = tenants
    expected = exact_top(alice, query, "metadata @> %s::jsonb", ['{"kind": "note"}'])

    assert recalled(alice, query, metadata_filter={"kind": "note"}) == expected


@pytest.mark.parametrize("query", QUERIES[:3])
def test_a_date_window_returns_exactly_the_top_k_inside_it(db, tenants, query):
    alice, *_ = tenants
    after, before = NOW - timedelta(hours=140), NOW - timedelta(hours=100)
    expected = exact_top(alice, query, "created_at >= %s AND created_at < %s", [after, before])

    found = recalled(
        alice, query, created_after=after.isoformat(), created_before=before.isoformat()
    )

    assert len(expected) == 10 and found == expected


def test_metadata_and_dates_together(db, tenants):
    alice, *_ = tenants
    after = NOW - timedelta(hours=150)
    query = QUERIES[0]
    expected = exact_top(
        alice, query, "metadata @> %s::jsonb AND created_at >= %s", ['{"kind": "note"}', after]
    )

    found = recalled(
        alice, query, metadata_filter={"kind": "note"}, created_after=after.isoformat()
    )

    assert found == expected


def test_a_filter_broader_than_the_cut_off_searches_the_index_and_fills_the_limit(db, tenants):
    alice, *_ = tenants
    found = services.recall(
        user_id=alice.id,
        query=QUERIES[1],
        limit=10,
        threshold=0,
        mode="semantic",
        metadata_filter={"bulk": True},
    )

    assert len(found) == 10
    assert all(memory["metadata"].get("bulk") is True for memory in found)
    # Too many matches to rank them all: the narrow branch does not run.
    plan = analysed(alice, {"bulk": True})
    narrow = next(line for line in plan.splitlines() if "memories_pkey" in line)
    assert "never executed" in narrow, plan


def analysed(user: User, metadata: dict[str, object], **filters: Any) -> str:
    prepared = search.prepare(
        search.SearchArgs.parse(
            query=QUERIES[0], threshold=0, mode="semantic", metadata_filter=metadata, **filters
        ),
        cache_scope=scope(user.id),
    )
    sql, params = search.statement(user.id, prepared)
    with (
        tenancy.tenant(user.id, local_settings=search.transaction_settings(prepared)),
        connection.cursor() as cursor,
    ):
        cursor.execute("EXPLAIN (ANALYZE, COSTS OFF) " + sql, params)
        return "\n".join(row[0] for row in cursor.fetchall())


def test_a_narrow_filter_reads_only_its_nearest_matches_again(db, tenants):
    alice, *_ = tenants
    plan = analysed(alice, {"team": "blue"})

    # Its 14 matches (12, and 2 of the scout's) are found and measured in one
    # pass; only the 10 nearest are read again, by primary key, and nothing else.
    narrow = next(line for line in plan.splitlines() if "memories_pkey" in line)
    assert "never executed" not in narrow and "loops=10" in narrow, plan
    index = next(line for line in plan.splitlines() if "memories memories_2" in line)
    assert "never executed" in index, plan


def attempted(plan: str) -> bool:
    """Whether the statement called recall_filtered_nearest (its CTE returned a row)."""
    lines = plan.splitlines()
    start = next(n for n, line in enumerate(lines) if line.strip() == "CTE matching")
    result = lines[start + 1]
    assert "Result" in result, plan
    return "rows=1" in result


def test_a_broad_filter_of_one_key_goes_straight_to_the_index(db, tenants):
    alice, *_ = tenants
    # search_metadata counts 264 of alice's memories with {"bulk": true}
    # (240 and the scout's 24), more than the cut-off: the function would
    # answer NULL, so it is not asked.
    assert not attempted(analysed(alice, {"bulk": True}))
    # 14 with {"team": "blue"}, 99 with {"kind": "note"}: asked, and answering.
    assert attempted(analysed(alice, {"team": "blue"}))
    assert attempted(analysed(alice, {"kind": "note"}))
    # A count bounds only a filter of one key and nothing else.
    assert attempted(analysed(alice, {"bulk": True, "kind": "note"}))
    after = (NOW - timedelta(hours=20)).isoformat()
    assert attempted(analysed(alice, {"bulk": True}, created_after=after))


def filtered_nearest(user: User, query: str, metadata: str, most: int, k: int) -> Any:
    """Call the function as the tenant's own role, as the recall statement does."""
    vector = Vector(embeddings.get_embedder().embed_one(query)).to_text()
    model = embeddings.get_embedder().model_id
    with tenancy.tenant(user.id), connection.cursor() as cursor:
        cursor.execute(
            "SELECT recall_filtered_nearest('default', %s, NULL, NULL, %s::jsonb, NULL, NULL,"
            " %s, %s::vector, %s)",
            [model, metadata, most, vector, k],
        )
        found = cursor.fetchone()[0]
    return None if found is None else [str(memory_id) for memory_id in found]


@pytest.mark.parametrize("query", QUERIES[:2])
def test_the_function_returns_the_callers_nearest_matches_nearest_first(db, tenants, query):
    alice, charlie, *_ = tenants
    for user in (alice, charlie):
        where = "metadata @> %s::jsonb"
        expected = exact_top(user, query, where, ['{"kind": "note"}'], k=5, floor=False)

        assert filtered_nearest(user, query, '{"kind": "note"}', CUT_OFF, 5) == expected


def test_the_function_answers_null_when_more_match_than_it_may_rank(db, tenants):
    alice, *_ = tenants
    # {"bulk": true}: 240 of alice's 300, and 24 of the scout's 30.
    assert filtered_nearest(alice, QUERIES[0], '{"bulk": true}', 263, 10) is None
    found = filtered_nearest(alice, QUERIES[0], '{"bulk": true}', 264, 10)
    where = "metadata @> %s::jsonb"
    assert found == exact_top(alice, QUERIES[0], where, ['{"bulk": true}'], floor=False)
    assert filtered_nearest(alice, QUERIES[0], '{"nothing": "matches"}', 10, 10) == []


def test_only_the_tenant_roles_may_call_the_filtered_function(db):
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT has_function_privilege(r, 'recall_filtered_nearest(text, text, timestamptz,"
            " timestamptz, jsonb, text[], jsonb, integer, vector, integer)', 'EXECUTE')"
            " FROM unnest(ARRAY['recall_app', 'recall_agent', 'recall_operator', 'public']) r"
        )
        assert [row[0] for row in cursor.fetchall()] == [True, True, False, False]
        cursor.execute(
            "SELECT p.prosecdef, pg_get_userbyid(p.proowner), p.proconfig"
            " FROM pg_proc p WHERE p.proname = 'recall_filtered_nearest'"
        )
        definer, owner, config = cursor.fetchone()
        cursor.execute("SELECT count(*) FROM pg_proc WHERE proname = 'recall_filtered_ids'")
        assert cursor.fetchone()[0] == 0  # replaced, not left callable beside it
    assert definer and owner == "recall_search"
    assert "search_path=pg_catalog, public" in config


def test_a_long_memory_keeps_its_vector_in_its_row(db):
    # Content the compressor cannot shrink, long enough that the row outgrows
    # 2 KB: it is the content that leaves the row, not the vector every exact
    # ranking reads.
    user = User.objects.create_user("filtered-long@example.com")
    content = "".join(
        np.random.default_rng(5).choice(list("abcdefghijklmnopqrstuvwxyz0123456789"), 900)
    )
    vector = Vector(embeddings.get_embedder().embed_one(content)).to_text()
    with tenancy.operator(), connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO memories (id, user_id, namespace, content, content_hash, embedding,"
            " embedding_model, metadata) VALUES (gen_random_uuid(), %s, 'default', %s, %s,"
            " %s::vector, %s, '{}')"
            " RETURNING id",
            [
                str(user.id),
                content,
                hashlib.sha256(content.encode()).hexdigest(),
                vector,
                embeddings.get_embedder().model_id,
            ],
        )
        # As stored: RETURNING shows the row before it was toasted.
        cursor.execute(
            "SELECT pg_column_toast_chunk_id(embedding), pg_column_toast_chunk_id(content)"
            " FROM memories WHERE id = %s",
            [cursor.fetchone()[0]],
        )
        vector_chunk, content_chunk = cursor.fetchone()

    assert vector_chunk is None
    assert content_chunk is not None


def test_another_tenants_matching_memories_never_appear(db, tenants):
    _, charlie, *_ = tenants
    found = services.recall(
        user_id=charlie.id,
        query=QUERIES[0],
        limit=50,
        threshold=0,
        mode="semantic",
        metadata_filter={"team": "blue"},
    )

    assert found and all(m["metadata"].get("team") == "blue" for m in found)
    with tenancy.operator():
        owners = set(
            User.objects.filter(memories__id__in=[m["id"] for m in found]).values_list(
                "id", flat=True
            )
        )
    assert owners == {charlie.id}


def test_an_agent_ranks_only_the_memories_it_may_read(db, tenants):
    alice, _, scout, writer = tenants
    as_writer = services.recall(
        user_id=alice.id,
        agent_id=writer.id,
        query=QUERIES[0],
        limit=10,
        threshold=0,
        mode="semantic",
        metadata_filter={"team": "blue"},
    )
    as_scout = services.recall(
        user_id=alice.id,
        agent_id=scout.id,
        query=QUERIES[0],
        limit=10,
        threshold=0,
        mode="semantic",
        metadata_filter={"team": "blue"},
    )

    assert as_writer == []  # the writer has no memories; the user's are not its
    # The scout's own blue memories (n = 0 and 25), those at or above similarity 0.
    assert as_scout and {m["content"] for m in as_scout} <= {"synthetic 0", "synthetic 25"}
