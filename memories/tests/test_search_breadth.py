"""The HNSW search breadth (hnsw.ef_search) a search's transaction opens with.

HNSW_EF_SEARCH up to 100,000 memories in the namespace, then growing with
its size (memories/search.py, EF_KNEE and EF_EXPONENT), at most EF_MAX; read
from search_namespaces in the transaction's first round trip. An agent may
not read that count and searches at the base breadth.
"""

from __future__ import annotations

import pytest
from django.db import connection

from accounts.tiers import Tier
from core import tenancy
from memories import search, services
from memories.embeddings.cache import scope

pytestmark = pytest.mark.django_db


def breadth(user_id, agent_id=None, **arguments) -> int:
    prepared = search.prepare(
        search.SearchArgs.parse(query="tea", threshold=0, **arguments),
        cache_scope=scope(user_id, agent_id),
    )
    opening = search.transaction_settings(prepared, agent=agent_id is not None)
    with (
        tenancy.tenant(user_id, agent_id=agent_id, local_settings=opening),
        connection.cursor() as cursor,
    ):
        cursor.execute("SHOW hnsw.ef_search")
        return int(cursor.fetchone()[0])


def sized(user_id, documents: int) -> None:
    """Make the namespace's count say ``documents`` (it is what the breadth reads)."""
    services.remember(user_id=user_id, tier=Tier.PRO, content="Alice drinks green tea.")
    with tenancy.operator(), connection.cursor() as cursor:
        cursor.execute(
            "UPDATE search_namespaces SET documents = %s"
            " WHERE user_id = %s AND namespace = 'default'",
            [documents, str(user_id)],
        )


@pytest.mark.parametrize(
    ("documents", "expected"),
    [(1, 100), (100_000, 100), (400_000, 264), (1_000_000, 502), (100_000_000, 1000)],
)
def test_the_breadth_grows_with_the_namespace(cast, documents, expected):
    sized(cast.alice.id, documents)

    assert breadth(cast.alice.id) == expected
    assert breadth(cast.alice.id, mode="hybrid") == expected
    assert breadth(cast.alice.id, metadata_filter={"kind": "note"}) == expected


def test_a_namespace_never_written_searches_at_the_base(cast):
    assert breadth(cast.alice.id) == 100
    assert breadth(cast.alice.id, namespace="elsewhere") == 100


def test_an_agent_searches_at_the_base_breadth(cast, agents):
    sized(cast.alice.id, 1_000_000)

    assert breadth(cast.alice.id, agent_id=agents.research.id) == 100


def test_the_base_is_a_setting(cast, settings):
    settings.HNSW_EF_SEARCH = 40
    sized(cast.alice.id, 400_000)

    assert breadth(cast.alice.id) == 106  # 40 x 4 ** 0.7, rounded up
