"""Where an exact scan beats the HNSW index: tenants of several sizes in one shared table.

    python bench/cutoff.py --data DIR --big 100k --tenants 3k,10k,25k --json out.json
    python bench/cutoff.py --smoke        # seconds, no data: checks that it runs

Loads one big tenant (``--big`` memories) and one tenant of each of
``--tenants`` sizes into one table (one HNSW index over all of them, as in a
hosted deployment), then times recall for every tenant, in semantic and
hybrid mode, three ways, taking turns query by query (``--big 0``: the
tenants alone, one table each, as on one user's own server):

* ``rule``: the product's choice (``RECALL_EXACT_SEARCH_MAX``, or
  sqrt(``RECALL_EXACT_SEARCH_RATIO`` x the index's rows) when more; see
  ``memories/search.py``);
* ``exact``: every namespace ranked by an exact scan;
* ``index``: every namespace searched through the HNSW index.

Each timing is the service (``services.recall``) with the query embedding
stubbed out, as in ``bench/scale.py``. The report gives p50/p95 per tenant,
mode and way, the cut-off in effect, which way the rule took, and how much of
the exact top 10 the rule's and the index's results hold (overlap@10, over
the first pass's queries). A small
tenant in a big table is where the index does worst: the scan walks the
shared graph and rejects every other tenant's rows on the way.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

_ROOT = str(Path(__file__).resolve().parent.parent)
if sys.path[0] == str(Path(__file__).resolve().parent):
    sys.path[0] = _ROOT
elif _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

from bench import corpus, harness, scale  # noqa: E402

WAYS = ("rule", "exact", "index")
LIMIT = 10
MODES = ("semantic", "hybrid")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Time recall for tenants of several sizes sharing one table and index, "
        "by the product's rule, by exact scans and through the index.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--data", type=Path, help="Benchmark data directory (holds scifact/).")
    parser.add_argument("--smoke", action="store_true", help="Tiny sizes and built-in texts.")
    parser.add_argument(
        "--big", type=scale.parse_size, default="100k", help="The big tenant (0: none)."
    )
    parser.add_argument(
        "--tenants",
        type=scale.csv_of(scale.parse_size),
        default="3k,10k,25k",
        help="The other tenants' sizes.",
    )
    parser.add_argument("--runs", type=int, default=3, help="Timed passes; medians reported.")
    parser.add_argument("--queries", type=int, default=60, help="Queries per tenant and pass.")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--sigma", type=float, default=0.03, help="Perturbation noise.")
    parser.add_argument(
        "--cache", type=Path, default=corpus.DEFAULT_CACHE, help="Embedding cache directory."
    )
    parser.add_argument("--workdir", type=Path, help="Where the throwaway database lives.")
    parser.add_argument("--json", type=Path, help="Write the results here.")
    args = parser.parse_args(argv)
    if args.smoke:
        args.big, args.tenants = (300 if args.big else 0), [40, 120]
        args.runs, args.queries = 1, 3
    elif args.data is None:
        parser.error("--data is required unless --smoke")
    # What scale.Bench reads of its arguments, at its defaults.
    args.bases, args.m, args.ef_construction = 0, 0, 0
    args.maintenance_work_mem = "64MB" if args.smoke else "2GB"
    args.build_workers = 1

    where = harness.configure(None, args.workdir)
    bench = scale.Bench(args)
    report: dict[str, Any] = {
        "command": "python bench/cutoff.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "machine": harness.machine(),
        "database": {"where": where, **harness.database_versions()},
        "config": bench.config(),
    }
    try:
        report.update(run(bench, args))
    finally:
        bench.cleanup()
    print_report(report)
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0


def run(bench: scale.Bench, args: argparse.Namespace) -> dict[str, Any]:
    """Load the tenants and time them; with ``--big 0``, each tenant alone in the table."""
    tables = [[args.big, *args.tenants]] if args.big else [[size] for size in args.tenants]
    report: dict[str, Any] = {"load": [], "index": [], "cut_off": {}, "results": []}
    started = time.perf_counter()
    for n, sizes in enumerate(tables):
        timed = time_table(bench, args, sizes, seed=args.seed + 100 * n)
        for key in ("load", "index"):
            report[key] += timed[key]
        report["cut_off"][", ".join(f"{size:,}" for size in sizes)] = timed["cut_off"]
        report["results"] += timed["results"]
    report["measure_seconds"] = round(time.perf_counter() - started, 1)
    return report


def time_table(
    bench: scale.Bench, args: argparse.Namespace, sizes: list[int], *, seed: int
) -> dict[str, Any]:
    """Load one table holding a tenant of each size, build its index, and time every tenant."""
    from django.conf import settings

    from memories import search

    bench.reset()
    bench.drop_index()
    tenants = []
    loads = []
    for n, size in enumerate(sizes):
        bench.args.seed = seed + n  # different rows for every tenant
        table = bench.make_table(size, "one", prefix=f"t{seed}-{n}-")
        loads.append(bench.bulk_load(table))
        print(f"  loaded {size:,} memories {loads[-1]}", flush=True)
        tenants.append((size, table.users[0]))
    bench.args.seed = args.seed
    index = bench.build_index()
    print(f"  index {index}", flush=True)

    # recall's limit here in semantic mode; hybrid seeks its pool.
    neighbours = {"semantic": LIMIT, "hybrid": search.POOL}
    cutoff = {mode: cut_off(bench.model_id, k) for mode, k in neighbours.items()}

    rules = {
        "rule": (settings.RECALL_EXACT_SEARCH_MAX, settings.RECALL_EXACT_SEARCH_RATIO),
        "exact": (10**9, 0.0),
        "index": (0, 0.0),
    }
    steps = [(size, user, mode, way) for size, user in tenants for mode in MODES for way in WAYS]
    runs: dict[tuple[int, str, str], list[dict[str, float]]] = {
        (size, mode, way): [] for size, _, mode, way in steps
    }
    # The first pass's result ids, to compare each way's with the exact scan's.
    found: dict[tuple[int, str, str, int], list[str]] = {}
    rng = np.random.default_rng(args.seed)
    picks = rng.choice(len(bench.queries), size=args.queries, replace=False)
    try:
        with harness.using_embedder(bench.stub):
            for run_number in range(args.runs):
                times: dict[tuple[int, str, str], list[float]] = {key: [] for key in runs}
                for q in picks.tolist():
                    for i in rng.permutation(len(steps)).tolist():
                        size, user, mode, way = steps[i]
                        (
                            settings.RECALL_EXACT_SEARCH_MAX,
                            settings.RECALL_EXACT_SEARCH_RATIO,
                        ) = rules[way]
                        ms, results = harness.timed(
                            partial(recall, user_id=user, query=bench.queries[q], mode=mode)
                        )
                        times[size, mode, way].append(ms)
                        if run_number == 0:
                            found[size, mode, way, q] = [hit["id"] for hit in results]
                for key, samples in times.items():
                    runs[key].append(harness.percentiles(samples))
    finally:
        settings.RECALL_EXACT_SEARCH_MAX, settings.RECALL_EXACT_SEARCH_RATIO = rules["rule"]

    def overlap(size: int, mode: str, way: str) -> float:
        shares = [
            len(set(found[size, mode, way, q]) & set(exact)) / len(exact)
            for q in picks.tolist()
            if (exact := found[size, mode, "exact", q])
        ]
        return round(float(np.mean(shares)), 3) if shares else 1.0

    return {
        "load": loads,
        "index": [index],
        "cut_off": cutoff,
        "results": [
            {
                "tenant": size,
                "table": sum(sizes),
                "mode": mode,
                "rule_takes": "exact" if size <= cutoff[mode] else "index",
                **{way: harness.median_of_runs(runs[size, mode, way]) for way in WAYS},
                "overlap@10": {way: overlap(size, mode, way) for way in ("rule", "index")},
            }
            for size, _ in tenants
            for mode in MODES
        ],
    }


def recall(*, user_id: str, query: str, mode: str) -> Any:
    from memories import services

    return services.recall(user_id=user_id, query=query, limit=LIMIT, threshold=0, mode=mode)


def cut_off(model_id: str, neighbours: int) -> int:
    """The exact-scan cut-off the product computes now for ``neighbours`` sought.

    The statement memories/search.py runs for it.
    """
    from django.db import connection

    from memories import search

    with connection.cursor() as cursor:
        cursor.execute(search.CUTOFF, search.cutoff_params(model_id, neighbours))
        return int(cursor.fetchone()[0])


def print_report(report: dict[str, Any]) -> None:
    for table, cutoffs in report["cut_off"].items():
        shown = ", ".join(f"{mode} {n:,}" for mode, n in cutoffs.items())
        print(f"\ntable of {table}: cut-off in effect (memories): {shown}")
    rows = [
        [
            f"{r['tenant']:,}",
            f"{r['table']:,}",
            r["mode"],
            r["rule_takes"],
            *(f"{r[way]['p50']:.1f} / {r[way]['p95']:.1f}" for way in WAYS),
            f"{r['overlap@10']['rule']:.3f} / {r['overlap@10']['index']:.3f}",
        ]
        for r in report["results"]
    ]
    harness.print_table(
        rows,
        [
            "tenant",
            "table",
            "mode",
            "rule takes",
            *(f"{way} p50/p95 ms" for way in WAYS),
            "overlap@10 rule / index",
        ],
    )


if __name__ == "__main__":
    raise SystemExit(main())
