"""memory_stats, health and the query cache's housekeeping, as services."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from accounts.tiers import Tier
from billing import services as billing_services
from billing.usage import Event
from core.errors import EmbeddingUnavailable
from memories import embeddings, services


def test_stats_count_the_callers_memories_history_and_jobs(cast):
    for n in range(3):
        services.remember(user_id=cast.alice.id, tier=Tier.PRO, content=f"work {n}", namespace="w")
    first = services.remember(user_id=cast.alice.id, tier=Tier.PRO, content="home")["id"]
    services.update_memory(user_id=cast.alice.id, id=first, metadata={"edited": True})
    services.remember(user_id=cast.alice.id, tier=Tier.PRO, content="later", background=True)
    services.remember(user_id=cast.charlie.id, tier=Tier.PRO, content="not Alice's")

    stats = services.memory_stats(user_id=cast.alice.id)

    assert stats["memories"] == 4
    assert [(ns["namespace"], ns["count"]) for ns in stats["namespaces"]] == [
        ("default", 1),
        ("w", 3),
    ]
    assert stats["namespaces"][1]["oldest"] <= stats["namespaces"][1]["newest"]
    assert stats["history_rows"] == 5
    assert stats["jobs"] == {"queued": 1, "running": 0, "done": 0, "failed": 0}
    assert set(stats["cache"]) >= {"hits", "misses", "hit_rate", "size", "evictions"}


def test_stats_report_the_callers_own_latency_percentiles(cast):
    now = timezone.now()
    events = [
        Event(
            user_id=cast.alice.id,
            api_key_id=key,
            request_id=f"r{n}",
            tool_name="recall",
            success=True,
            latency_ms=latency,
            occurred_at=now - timedelta(seconds=n),
        )
        for n, (key, latency) in enumerate(
            [(cast.alice_key.key.id, ms) for ms in range(1, 101)]
            + [(cast.bob_key.key.id, 5000)] * 10
        )
    ]
    billing_services.save_usage_events(user_id=cast.alice.id, events=events)

    mine = services.memory_stats(user_id=cast.alice.id, api_key_id=cast.alice_key.key.id)
    everyone = services.memory_stats(user_id=cast.alice.id)

    assert mine["latency"] == {"calls": 100, "p50_ms": 50.5, "p95_ms": 95.0}
    assert everyone["latency"]["calls"] == 110
    assert everyone["latency"]["p95_ms"] == 5000.0


def test_health_reports_each_part_and_no_secrets(cast, settings):
    embeddings.get_embedder().load()

    health = services.health(user_id=cast.alice.id)

    assert health["status"] == "ok"
    assert health["database"]["ok"] is True
    assert health["embedder"] == {"ok": True, "model": embeddings.get_embedder().model_id}
    assert health["queue"] == {"depth": 0, "oldest_seconds": 0.0}
    assert health["redis"] is None
    assert health["uptime_seconds"] >= 0
    assert health["rss_bytes"] > 10_000_000
    text = str(health)
    assert settings.SECRET_KEY not in text
    assert settings.API_KEY_SECRET not in text


def test_health_says_so_while_the_embedder_fails_and_recovers_with_it(cast, monkeypatch):
    # Loaded is not working: a provider that fails every call (down, a key revoked)
    # left health_check saying ok.
    embedder = embeddings.get_embedder()
    embedder.load()
    real = embedder.embed_one

    def broken(text):
        raise RuntimeError("provider down")

    monkeypatch.setattr(embedder, "embed_one", broken)
    with pytest.raises(EmbeddingUnavailable):
        services.remember(user_id=cast.alice.id, tier="pro", content="Will not be stored")

    failing = services.health(user_id=cast.alice.id)
    assert failing["status"] == "degraded"
    assert failing["embedder"]["ok"] is False
    assert "latest embedding call failed" in failing["embedder"]["error"]

    monkeypatch.setattr(embedder, "embed_one", real)
    services.remember(user_id=cast.alice.id, tier="pro", content="Stored once it works")

    assert services.health(user_id=cast.alice.id)["embedder"] == {
        "ok": True,
        "model": embedder.model_id,
    }


def test_optimize_cache_reports_what_it_did(cast):
    embeddings.reset_query_cache()
    services.recall(user_id=cast.alice.id, query="first question", threshold=0)
    services.recall(user_id=cast.alice.id, query="second question", threshold=0)
    services.recall(user_id=cast.alice.id, query="second question", threshold=0)

    done = services.optimize_cache(user_id=cast.alice.id, max_entries=1)

    assert (done["demoted"], done["kept"], done["expired"]) == (1, 1, 0)
    assert done["bytes_freed"] > 0
    stats = services.cache_stats(user_id=cast.alice.id)
    assert (stats["hits"], stats["misses"], stats["size"]) == (1, 2, 1)


def test_health_counts_the_callers_own_queue_only(cast):
    # It counted every tenant's jobs: Charlie watched Alice's writes come and go.
    services.remember(
        user_id=cast.alice.id, tier=Tier.PRO, content="The user prefers tea.", background=True
    )

    assert services.health(user_id=cast.alice.id)["queue"]["depth"] == 1
    assert services.health(user_id=cast.charlie.id)["queue"] == {"depth": 0, "oldest_seconds": 0.0}
    assert services.queue_depth()["depth"] == 1  # the operator's view: every tenant's
