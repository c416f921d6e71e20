"""What tenant-private query caching costs in hit rate.

The query cache keys each vector by its caller's scope (a user, or one of its
agents), so a query one tenant ran is a model run for every other tenant. The
price is the hits one tenant used to get from another's identical queries.
This replays query streams through the real ``QueryCache`` twice, once with
every lookup in one scope (the old, shared keying) and once in the caller's
scope, and reports both hit rates.

Two sources of queries:

* a synthetic multi-tenant stream (always): tenants of Zipf-distributed
  activity, each asking its own questions with Zipf popularity, and with
  probability ``--generic`` one of a pool of generic questions every tenant
  may ask ("what does the user prefer?"): the only queries sharing can save;
* with ``--data DIR``, LoCoMo's questions, one tenant per conversation, each
  question asked ``--repeats`` times in a shuffled order: how often real
  questions of different users coincide.

The model is a stub: only hits and misses are counted, never timed.

    .venv/bin/python bench/cache_tenancy.py --json out.json
    .venv/bin/python bench/cache_tenancy.py --data ../shared/data --json out.json
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import sys
import unicodedata
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


class StubModel:
    """Anything the cache needs of an embedder, and no model run."""

    model_id = "stub-model"
    dimensions = 8

    def embed_one(self, text: str) -> np.ndarray:
        return np.ones(self.dimensions, dtype=np.float32)


def zipf_weights(n: int, s: float) -> list[float]:
    return [1.0 / (rank**s) for rank in range(1, n + 1)]


def synthetic(
    rng: random.Random,
    *,
    tenants: int,
    lookups: int,
    generic_share: float,
    private_queries: int = 2_000,
    generic_queries: int = 200,
    skew: float = 1.1,
) -> list[tuple[str, str]]:
    """Return ``(tenant, query)`` lookups."""
    activity = zipf_weights(tenants, 1.0)
    private = zipf_weights(private_queries, skew)
    generic = zipf_weights(generic_queries, skew)
    who = rng.choices(range(tenants), weights=activity, k=lookups)
    stream = []
    for tenant in who:
        if rng.random() < generic_share:
            query = f"generic {rng.choices(range(generic_queries), weights=generic)[0]}"
        else:
            asked = rng.choices(range(private_queries), weights=private)[0]
            query = f"tenant {tenant} asks {asked}"
        stream.append((f"u{tenant}", query))
    return stream


def locomo(data: Path, rng: random.Random, repeats: int) -> list[tuple[str, str]]:
    path = data / "locomo10.json"
    if not path.exists():
        path = data / "locomo10-dev.json"
    conversations = json.loads(path.read_text())
    stream = [
        (f"u{n}", " ".join(unicodedata.normalize("NFC", qa["question"]).split()))
        for n, conversation in enumerate(conversations)
        for qa in conversation["qa"]
        for _ in range(repeats)
    ]
    rng.shuffle(stream)
    return stream


def hit_rates(stream: Iterable[tuple[str, str]], size: int) -> dict[str, float]:
    from memories.embeddings.cache import QueryCache

    model = StubModel()
    shared = QueryCache(max_entries=size, ttl=10**9)
    private = QueryCache(max_entries=size, ttl=10**9)
    for tenant, query in stream:
        shared.embed(model, query, scope="everyone")  # type: ignore[arg-type]
        private.embed(model, query, scope=tenant)  # type: ignore[arg-type]
    before, after = shared.stats().hit_rate or 0.0, private.stats().hit_rate or 0.0
    return {
        "shared_hit_rate": round(before, 4),
        "private_hit_rate": round(after, 4),
        "cost_points": round((before - after) * 100, 2),
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, help="a folder with locomo10(-dev).json")
    parser.add_argument("--tenants", type=int, default=200)
    parser.add_argument("--lookups", type=int, default=200_000)
    parser.add_argument("--generic", default="0,0.05,0.2,0.5", help="shares of generic queries")
    parser.add_argument("--size", type=int, default=10_000, help="entries (QUERY_CACHE_SIZE)")
    parser.add_argument("--repeats", type=int, default=3, help="LoCoMo: times each is asked")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--smoke", action="store_true", help="a tiny run that checks the script")
    args = parser.parse_args(argv)
    if args.smoke:
        args.tenants, args.lookups, args.generic = 5, 2_000, "0,0.5"

    rng = random.Random(7)
    report: dict[str, Any] = {
        "machine": {"python": platform.python_version(), "system": platform.platform()},
        "config": {"tenants": args.tenants, "lookups": args.lookups, "size": args.size},
        "synthetic": {},
    }
    print(f"{'stream':<28}{'shared':>9}{'private':>9}{'cost':>8}")
    for share in (float(x) for x in args.generic.split(",")):
        stream = synthetic(rng, tenants=args.tenants, lookups=args.lookups, generic_share=share)
        rates = hit_rates(stream, args.size)
        report["synthetic"][str(share)] = rates
        print(
            f"{f'synthetic, {share:.0%} generic':<28}{rates['shared_hit_rate']:>9.1%}"
            f"{rates['private_hit_rate']:>9.1%}{rates['cost_points']:>7.2f}pt"
        )
    if args.data:
        rates = hit_rates(locomo(args.data, rng, args.repeats), args.size)
        report["locomo"] = rates
        print(
            f"{'LoCoMo questions':<28}{rates['shared_hit_rate']:>9.1%}"
            f"{rates['private_hit_rate']:>9.1%}{rates['cost_points']:>7.2f}pt"
        )
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
