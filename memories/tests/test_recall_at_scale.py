"""recall uses the HNSW index, and selective filters still fill the limit.

The table gets 10,000 memories for one big tenant (30 of them an agent's)
plus a small tenant holding 1% of the rows. Vectors are real embeddings of
2,500 distinct sentences, four copies of each jittered by Gaussian noise
(standard deviation 0.03) and renormalised, like the perturbed tables that
BENCHMARKS.md measured against real data ("From ef_search 40 up, perturbed
tables behave like the real one").

Not a few sentences copied hundreds of times: that makes tight clusters
larger than ef_search (100), and a greedy search that enters a neighbouring
cluster first ("The user deploys on Tuesdays" for a question about the
user's web framework) can exhaust its candidates there and never reach the
right one. Whether it does depends on the random levels of that graph build:
with 64 sentences, 3 builds in 22 (main's code as much as the agents
branch's) found none of the exact top 10 for that question, while ef_search
400 on the same graph found all ten. With these 2,500, 60 of 60 (10 builds,
6 questions) matched the exact top 10 in full.
"""

from __future__ import annotations

import functools
import hashlib
import json
import uuid
from typing import Any

import numpy as np
import pytest
from django.conf import settings
from django.db import connection
from pgvector import Vector

from accounts.models import Agent, User
from core import tenancy
from memories import embeddings, search, services
from memories.embeddings.cache import scope

BIG = 10_000
SMALL = 101  # 1% of the table
SCOUT = 30  # an agent of the big tenant's, with memories of its own
RARE_EVERY = 20  # 5% of the big tenant's rows carry {"flag": "rare"}
RARE_PATH = "docs/rare.md"  # and 5 of them, 0.05%, this document path
RARE_PATH_EVERY = 2000

SUBJECTS = [
    "The user",
    "Our team lead",
    "The customer",
    "My sister",
    "The landlord",
    "The new intern",
    "Grandpa",
    "The data team",
    "Our accountant",
    "The neighbour",
]
TOPICS = [
    "prefers FastAPI over Flask for web services",
    "starts school in September",
    "deploys on Tuesdays after the standup",
    "is training for a spring marathon",
    "runs PostgreSQL 16 in staging",
    "dislikes meetings before ten",
    "sends invoices on the first working day",
    "keeps bees in the back garden",
    "drinks oat milk in coffee",
    "is allergic to penicillin",
    "plays the cello in an orchestra",
    "drives an electric van",
    "reads crime novels on the train",
    "is learning Portuguese",
    "grows tomatoes on the balcony",
    "uses a standing desk",
    "votes by post",
    "files taxes in April",
    "owns two grey cats",
    "commutes by bike in summer",
    "backs up photos to a NAS",
    "writes release notes on Fridays",
    "bakes sourdough at weekends",
    "supports the local football club",
    "books holidays in the Alps",
]
QUALIFIERS = [
    "",
    " these days",
    " according to last week's notes",
    " since the spring",
    " at least at work",
    " and mentions it often",
    " for the third year running",
    " unless plans change",
    " as far as anyone knows",
    " as of this morning",
]
SEEDS = [f"{who} {what}{how}." for who in SUBJECTS for what in TOPICS for how in QUALIFIERS]


@functools.cache
def seed_vectors() -> np.ndarray:
    return embeddings.get_embedder().embed(SEEDS)


def synthetic_vectors(count: int, rng: np.random.Generator) -> np.ndarray:
    """Return ``count`` real sentence embeddings, each jittered a little and renormalised."""
    base = seed_vectors()
    picks = base[rng.permutation(count) % len(SEEDS)]
    noisy = picks + rng.normal(0.0, 0.03, picks.shape).astype(np.float32)
    return noisy / np.linalg.norm(noisy, axis=1, keepdims=True)


def insert(
    user: User, vectors: np.ndarray, metadata_for, path_for=lambda n: "", agent=None
) -> None:
    model = embeddings.get_embedder().model_id
    rows = [
        (
            str(uuid.uuid4()),
            str(user.id),
            str(agent.id) if agent else None,
            "default",
            f"synthetic {n}",
            hashlib.sha256(f"{user.id}-{agent.id if agent else ''}-{n}".encode()).hexdigest(),
            Vector(v).to_text(),
            model,
            json.dumps(metadata_for(n)),
            path_for(n),
        )
        for n, v in enumerate(vectors)
    ]
    with tenancy.operator(), connection.cursor() as cursor:
        cursor.executemany(
            "INSERT INTO memories (id, user_id, agent_id, namespace, content, content_hash,"
            " embedding, embedding_model, metadata, path)"
            " VALUES (%s, %s, %s, %s, %s, %s, %s::vector, %s, %s::jsonb, %s)",
            rows,
        )


@pytest.fixture(scope="module")
def table(django_db_setup, django_db_blocker):
    rng = np.random.default_rng(7)
    with django_db_blocker.unblock():
        # Earlier tests' rolled-back rows stay in the HNSW graph until a vacuum:
        # dozens of identical copies of a few sentences close to these questions
        # (test_recall writes its FastAPI sentence in a dozen tests). In a full
        # run, built around them, a graph once found none of the exact top 10
        # while the module alone always passed. Autovacuum clears such rows in
        # production; this measures the graph of this table alone.
        with connection.cursor() as cursor:
            cursor.execute("VACUUM memories")
        big = User.objects.create_user("big@example.com")
        small = User.objects.create_user("small@example.com")
        insert(
            big,
            synthetic_vectors(BIG, rng),
            lambda n: {"flag": "rare"} if n % RARE_EVERY == 0 else {},
            lambda n: RARE_PATH if n % RARE_PATH_EVERY == 0 else "",
        )
        insert(small, synthetic_vectors(SMALL, rng), lambda n: {})
        with tenancy.operator():
            scout = Agent.objects.create(user=big, name="scout")
        insert(big, synthetic_vectors(SCOUT, rng), lambda n: {}, agent=scout)
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE memories")
        yield big, small, scout
        with tenancy.operator():
            User.objects.filter(id__in=[big.id, small.id]).delete()


def explain(user: User, analyze: bool = False, mode: str = "semantic", **kwargs) -> str:
    prepared = search.prepare(
        search.SearchArgs.parse(
            query="web frameworks",
            threshold=0,
            mode=mode,
            metadata_filter=kwargs.get("metadata_filter") or None,
            sources=kwargs.get("sources"),
        ),
        cache_scope=scope(user.id),
    )
    agent = kwargs.get("agent_id") is not None
    sql, params = search.statement(user.id, prepared, agent=agent)
    # The settings the product opens a search's transaction with, unless told.
    opening = kwargs.get("opening") or search.transaction_settings(prepared, agent=agent)
    with (
        tenancy.tenant(user.id, agent_id=kwargs.get("agent_id"), local_settings=opening),
        connection.cursor() as cursor,
    ):
        cursor.execute(("EXPLAIN (ANALYZE, COSTS OFF) " if analyze else "EXPLAIN ") + sql, params)
        return "\n".join(row[0] for row in cursor.fetchall())


@pytest.mark.slow
def test_recall_uses_the_hnsw_index_at_ten_thousand_rows(db, table):
    big, _, _ = table
    plan = explain(big)
    assert "Index Scan using memories_hnsw_" in plan, plan


def exact_ids(user: User, query: str, **where: object) -> set[str]:
    """Return the ids of the user's memories (those matching ``where``) that threshold 0 admits.

    In semantic mode, those at or above similarity 0; in hybrid mode (the
    default) every one, since lexical coverage always reaches 0.
    """
    vector = Vector(embeddings.get_embedder().embed_one(query)).to_text()
    near = "true" if settings.RECALL_SEARCH_MODE != "semantic" else "embedding <=> %s::vector <= 1"
    clauses = "".join(f" AND {column} = %s" for column in where)
    params = [str(user.id), *([vector] if near != "true" else [])]
    with tenancy.operator(), connection.cursor() as cursor:
        cursor.execute(
            # S608: the column names are this test's own keywords; values are parameters.
            f"SELECT id FROM memories WHERE user_id = %s AND {near}" + clauses,  # noqa: S608
            [*params, *[str(value) for value in where.values()]],
        )
        return {str(row[0]) for row in cursor.fetchall()}


def branch_ran(plan: str, *, exact: bool) -> bool:
    """Say whether the exact (or else the index) branch of an analysed plan ran."""
    gate = "One-Time Filter: ((InitPlan" if exact else "One-Time Filter: ((NOT (InitPlan"
    lines = plan.splitlines()
    at = next(n for n, line in enumerate(lines) if gate in line)
    child = next(line for line in lines[at + 1 :] if "->" in line)
    return "never executed" not in child


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["semantic", "hybrid"])
def test_a_big_namespace_is_searched_through_the_index(db, table, mode):
    big, _, _ = table
    plan = explain(big, analyze=True, mode=mode)
    assert branch_ran(plan, exact=False) and not branch_ran(plan, exact=True), plan
    assert "Index Scan using memories_hnsw_" in plan


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["semantic", "hybrid"])
def test_a_small_namespace_is_ranked_by_an_exact_scan(db, table, mode):
    _, small, _ = table
    plan = explain(small, analyze=True, mode=mode)
    assert branch_ran(plan, exact=True) and not branch_ran(plan, exact=False), plan


@pytest.mark.slow
def test_the_exact_scan_cut_off_is_a_setting(db, table, settings):
    big, small, _ = table
    settings.RECALL_EXACT_SEARCH_MAX = BIG + SCOUT  # the user-wide view holds both
    assert branch_ran(explain(big, analyze=True), exact=True)
    settings.RECALL_EXACT_SEARCH_MAX = 0
    settings.RECALL_EXACT_SEARCH_RATIO = 0
    assert branch_ran(explain(small, analyze=True), exact=False)


def sort_setting(user: User, **arguments: Any) -> str:
    """The enable_sort a search's transaction opens with, as the database reports it."""
    prepared = search.prepare(
        search.SearchArgs.parse(query="web frameworks", threshold=0, **arguments),
        cache_scope=scope(user.id),
    )
    opening = search.transaction_settings(prepared)
    with tenancy.tenant(user.id, local_settings=opening), connection.cursor() as cursor:
        cursor.execute("SHOW enable_sort")
        return cursor.fetchone()[0]


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["semantic", "hybrid"])
def test_the_index_branch_reads_the_index_where_the_planner_would_sort(db, table, settings, mode):
    _, small, _ = table
    # The cut-off sends the small tenant to the index branch, and its 101
    # rows are cheap to sort: left to itself, the planner reads and sorts them.
    settings.RECALL_EXACT_SEARCH_MAX = 0
    settings.RECALL_EXACT_SEARCH_RATIO = 0
    planner = explain(small, analyze=True, mode=mode, opening=search.SEARCH_SETTINGS)
    assert branch_ran(planner, exact=False), planner
    assert "Index Scan using memories_hnsw_" not in planner, planner

    plan = explain(small, analyze=True, mode=mode)
    assert branch_ran(plan, exact=False) and not branch_ran(plan, exact=True), plan
    assert "Index Scan using memories_hnsw_" in plan, plan
    found = services.recall(user_id=small.id, query="web frameworks", threshold=0, mode=mode)
    assert len(found) == 10


@pytest.mark.slow
def test_sorting_is_off_for_unfiltered_searches_only(db, table):
    big, small, _ = table
    for user in (big, small):  # the exact branch sorts whatever the setting
        assert sort_setting(user) == "off"
        assert sort_setting(user, mode="hybrid") == "off"
    # Filters have indexes of their own to weigh; lexical search has no vector side.
    assert sort_setting(big, metadata_filter={"flag": "rare"}) == "on"
    assert sort_setting(big, sources={"path": RARE_PATH}) == "on"
    assert sort_setting(big, mode="lexical") == "on"


def index_rows() -> float:
    """The rows of the model's HNSW index, as its statistics say (what the cut-off reads)."""
    from memories.indexes import index_name

    name = index_name(embeddings.get_embedder().model_id)
    with connection.cursor() as cursor:
        cursor.execute("SELECT reltuples FROM pg_class WHERE oid = to_regclass(%s)", [name])
        return float(cursor.fetchone()[0])


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["semantic", "hybrid"])
def test_a_small_part_of_a_big_index_is_ranked_exactly_past_the_fixed_cut_off(
    db, table, settings, mode
):
    big, small, scout = table
    rows = index_rows()
    assert rows >= BIG, rows  # the fixture's ANALYZE counted the index
    # A fixed cut-off of 20, below the small tenant's 101 memories and the
    # scout agent's 30: the index for every one of them.
    settings.RECALL_EXACT_SEARCH_MAX = 20
    settings.RECALL_EXACT_SEARCH_RATIO = 0
    assert branch_ran(explain(small, analyze=True, mode=mode), exact=False)
    assert branch_ran(explain(big, analyze=True, mode=mode, agent_id=scout.id), exact=False)
    # sqrt(ratio x k x rows) = 1,000, k the neighbours sought: above the small
    # tenant and the scout's memories (counted under the agent's policy), far
    # below the big tenant's.
    k = search.POOL if mode == "hybrid" else 10
    settings.RECALL_EXACT_SEARCH_RATIO = 1000**2 / (k * rows)
    assert branch_ran(explain(small, analyze=True, mode=mode), exact=True)
    assert branch_ran(explain(big, analyze=True, mode=mode, agent_id=scout.id), exact=True)
    assert branch_ran(explain(big, analyze=True, mode=mode), exact=False)
    # and what it returns is the exact top 10
    found = services.recall(
        user_id=small.id, query="web frameworks", limit=10, threshold=0, mode="semantic"
    )
    vector = Vector(embeddings.get_embedder().embed_one("web frameworks")).to_text()
    with tenancy.operator(), connection.cursor() as cursor:
        cursor.execute(
            "SELECT id FROM memories WHERE user_id = %s"
            " ORDER BY cosine_distance(embedding, %s::vector) LIMIT 10",
            [str(small.id), vector],
        )
        assert {r["id"] for r in found} == {str(row[0]) for row in cursor.fetchall()}


@pytest.mark.slow
def test_the_size_test_reads_an_index_not_the_table(db, table):
    big, _, _ = table
    plan = explain(big, analyze=True)
    small_cte = plan[plan.index("CTE small") : plan.index("CTE nearest")]
    assert "Seq Scan" not in small_cte, small_cte


@pytest.mark.slow
def test_a_filter_matching_five_percent_still_fills_the_limit(db, table):
    big, _, _ = table
    found = services.recall(
        user_id=big.id,
        query="web frameworks",
        limit=10,
        threshold=0,
        metadata_filter={"flag": "rare"},
    )
    assert len(found) == 10
    assert all(r["metadata"] == {"flag": "rare"} for r in found)


@pytest.mark.slow
def test_a_narrow_source_filter_is_ranked_by_an_exact_scan(db, table):
    big, _, _ = table
    plan = explain(big, analyze=True, sources={"path": RARE_PATH})
    assert branch_ran(plan, exact=True) and not branch_ran(plan, exact=False), plan

    found = services.search_sources(
        user_id=big.id, agent_id=None, query="web frameworks", threshold=0, path=RARE_PATH
    )

    # All that the threshold lets through, however far from the query: an
    # index scan could stop short of them.
    assert {r["id"] for r in found} == exact_ids(big, "web frameworks", path=RARE_PATH)
    assert {r["path"] for r in found} == {RARE_PATH}


@pytest.mark.slow
def test_a_broad_source_filter_still_uses_the_index(db, table):
    big, _, _ = table
    plan = explain(big, analyze=True, sources={"source_kind": "note"})
    assert branch_ran(plan, exact=False) and not branch_ran(plan, exact=True), plan
    assert "Index Scan using memories_hnsw_" in plan


@pytest.mark.slow
def test_an_agent_of_a_big_tenant_is_ranked_among_its_own_memories(db, table):
    big, _, scout = table
    # Row-level security applies to the size test: the agent's 30 are counted.
    plan = explain(big, analyze=True, agent_id=scout.id)
    assert branch_ran(plan, exact=True) and not branch_ran(plan, exact=False), plan

    found = services.recall(
        user_id=big.id, agent_id=scout.id, query="web frameworks", limit=50, threshold=0
    )

    assert {r["id"] for r in found} == exact_ids(big, "web frameworks", agent_id=scout.id)


@pytest.mark.slow
def test_a_tenant_with_one_percent_of_the_rows_still_fills_the_limit(db, table):
    _, small, _ = table
    found = services.recall(user_id=small.id, query="web frameworks", limit=10, threshold=0)
    assert len(found) == 10


# A question for each of the table's 25 topics, each with real neighbours in
# it (the nearest at cosine 0.58 to 0.81). "Which web framework does the user
# like?", the one question this test used to ask, has none: its nearest lie
# at 0.41-0.44, a flat region where a greedy graph search can settle on
# other rows as close, and did (0 of 10 in two full runs). How the index does
# on the whole spread of queries is recall@10 in BENCHMARKS.md, over 200.
QUESTIONS = [
    "Who prefers FastAPI for web services?",
    "When does the team deploy?",
    "What is the customer allergic to?",
    "Which instrument does my sister play?",
    "What does the landlord grow on the balcony?",
    "Who keeps bees?",
    "When does the new intern start school?",
    "Who is training for a marathon?",
    "Which PostgreSQL version runs in staging?",
    "Who dislikes early meetings?",
    "When does our accountant send invoices?",
    "What does grandpa put in his coffee?",
    "What does the neighbour drive?",
    "What does the team lead read on the train?",
    "Which language is the customer learning?",
    "Who works at a standing desk?",
    "How does my sister vote?",
    "When does the landlord file taxes?",
    "How many cats does the intern have?",
    "How does grandpa get to work in summer?",
    "Where does the data team back up photos?",
    "When are the release notes written?",
    "Who bakes bread at weekends?",
    "Which football club does our accountant support?",
    "Who books holidays in the Alps?",
]


@pytest.mark.slow
def test_the_index_results_match_an_exact_scan(db, table):
    big, _, _ = table
    overlaps = {}
    for query in QUESTIONS:
        found = [
            r["id"]
            for r in services.recall(
                user_id=big.id, query=query, limit=10, threshold=0, mode="semantic"
            )
        ]
        vector = embeddings.get_embedder().embed_one(query)
        with tenancy.tenant(big.id), connection.cursor() as cursor:
            # Without the cast the partial index cannot serve the query: a true exact scan.
            cursor.execute(
                "SELECT id FROM memories ORDER BY embedding <=> %s::vector LIMIT 10",
                [Vector(vector).to_text()],
            )
            exact = [str(row[0]) for row in cursor.fetchall()]
        overlaps[query] = len(set(found) & set(exact))

    # recall@10 of at least 0.9 over the questions, the bar BENCHMARKS.md
    # sets. A graph search is approximate, one build at a time: in one full
    # CI run, a graph built among the rows earlier tests had left and vacuum
    # had taken out found 0 of 10 for one question of six (the other five
    # 10 of 10). So the bar holds over 25 questions, and one or two questions
    # may be answered from a neighbouring part of the graph; a fault of the
    # search's own (the wrong index, namespace or order) misses on most.
    # Eleven builds of the module alone (the last three with these questions
    # exactly): 247-250 of 250, no question under 7.
    assert sum(overlaps.values()) >= 9 * len(QUESTIONS), overlaps
    assert sum(overlap < 7 for overlap in overlaps.values()) <= 2, overlaps
