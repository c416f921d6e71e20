"""Measure the memory services and the database as the table grows.

    python bench/scale.py --data DIR --sizes 10k,100k --json out.json
    python bench/scale.py --smoke          # seconds, no data: checks that it runs

For each size (memories in the table) and layout (``one`` tenant holding them
all, or ``spread`` over ``--tenants`` tenants) it loads the table, builds the
HNSW index, and measures: ingest rate (bulk load, remember with and without
the model), index build time and size, recall latency (raw SQL, the service
with the query embedding stubbed, the service with the model), recall with a
1% and a 5% metadata filter, list_memories and forget latency, HNSW recall@10
against an exact scan, and the peak memory of PostgreSQL and of this process.

Vectors are real: the SciFact abstracts split into sentences, embedded once
by the local model and cached under ``--cache`` (outside the repository).
Sizes beyond the real sentences add perturbed copies: a real vector plus
N(0, sigma^2) noise per component, renormalised (see ``--sigma`` and
BENCHMARKS.md for why that keeps HNSW honest). Queries are the SciFact
training claims, embedded by the same model.

Every run uses its own throwaway embedded PostgreSQL unless ``--database-url``
names a scratch database (the script truncates ``memories`` there).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

# Run as a script, Python puts bench/ first on sys.path, where bench/http.py
# would shadow the standard library's http; the project root goes there instead.
_ROOT = str(Path(__file__).resolve().parent.parent)
if sys.path[0] == str(Path(__file__).resolve().parent):
    sys.path[0] = _ROOT
elif _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

from bench import corpus, harness  # noqa: E402

BENCH_EMAIL = "bench-{}@example.com"
_VECTOR_LITERAL = re.compile(r"'\[[^\]]*\]'")
FILTERS = {"1%": {"b100": 7}, "5%": {"b20": 7}}
MODES = ("semantic", "hybrid", "lexical")


def parse_size(text: str) -> int:
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([kKmM]?)", text.strip())
    if not match:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (try 10k, 100k, 1M)")
    factor = {"": 1, "k": 1_000, "m": 1_000_000}[match.group(2).lower()]
    return int(float(match.group(1)) * factor)


def size_label(size: int) -> str:
    if size >= 1_000_000 and size % 1_000_000 == 0:
        return f"{size // 1_000_000}M"
    if size >= 1_000 and size % 1_000 == 0:
        return f"{size // 1_000}k"
    return str(size)


def csv_of(kind: Callable[[str], Any]) -> Callable[[str], list[Any]]:
    return lambda text: [kind(part) for part in text.split(",") if part.strip()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Measure ingest, index build, recall latency and accuracy, list and "
        "forget latency, and memory, as functions of the number of memories.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--data", type=Path, help="Benchmark data directory (holds scifact/).")
    parser.add_argument("--smoke", action="store_true", help="Tiny sizes and built-in texts.")
    parser.add_argument(
        "--sizes", type=csv_of(parse_size), default="10k,100k,1M", help="Table sizes."
    )
    parser.add_argument(
        "--layouts", type=csv_of(str), default="one,spread", help="one and/or spread."
    )
    parser.add_argument("--tenants", type=int, default=1000, help="Tenants in the spread layout.")
    parser.add_argument("--runs", type=int, default=3, help="Timed passes; medians are reported.")
    parser.add_argument("--builds", type=int, default=1, help="Loads and index builds per size.")
    parser.add_argument("--queries", type=int, default=200, help="Queries per timed pass.")
    parser.add_argument("--writes", type=int, default=200, help="remember/forget calls per size.")
    parser.add_argument(
        "--embedded-calls", type=int, default=50, help="Calls that run the model, per size."
    )
    parser.add_argument("--sigma", type=float, default=0.03, help="Perturbation noise.")
    parser.add_argument(
        "--bases", type=parse_size, default=0, help="Use at most this many real vectors."
    )
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--maintenance-work-mem", default="4GB", help="For the HNSW build session.")
    parser.add_argument(
        "--build-workers", type=int, default=1, help="max_parallel_maintenance_workers."
    )
    parser.add_argument(
        "--m", type=int, default=0, help="HNSW m for the build (default: HNSW_M setting)."
    )
    parser.add_argument(
        "--ef-construction", type=int, default=0, help="Default: HNSW_EF_CONSTRUCTION."
    )
    parser.add_argument(
        "--ef-search-sweep", type=csv_of(int), default="", help="Also measure these ef_search."
    )
    parser.add_argument(
        "--scan-sweep",
        type=csv_of(str),
        default="",
        help="Also measure filtered recall with these iterative_scan:max_scan_tuples pairs, "
        "e.g. relaxed_order:20000,strict_order:20000,off:0.",
    )
    parser.add_argument(
        "--halfvec", action="store_true", help="Also build and measure a halfvec index."
    )
    parser.add_argument(
        "--index-sweep",
        type=csv_of(str),
        default="",
        help="After the main measurements, rebuild with each m:ef_construction pair "
        "(e.g. 8:64,16:32,16:128,24:64) and measure build time, size, recall@10, latency.",
    )
    parser.add_argument("--explain", action="store_true", help="Print EXPLAIN ANALYZE samples.")
    parser.add_argument(
        "--load-with-index",
        action="store_true",
        help="Bulk-load with the HNSW index in place (by default it is built after loading).",
    )
    parser.add_argument(
        "--check-perturbation",
        type=csv_of(float),
        default="",
        help="Instead of timing anything, compare nearest-neighbour similarities of real and "
        "perturbed vectors for these sigmas (numpy only), and at --sizes.",
    )
    parser.add_argument(
        "--cache", type=Path, default=corpus.DEFAULT_CACHE, help="Embedding cache directory."
    )
    parser.add_argument("--workdir", type=Path, help="Where the throwaway database lives.")
    parser.add_argument("--database-url", help="Use this (scratch!) database instead.")
    parser.add_argument(
        "--server-setting",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="Set this on the embedded server before starting (e.g. shared_buffers=2GB).",
    )
    parser.add_argument("--json", type=Path, help="Write the results here.")
    parser.add_argument("--plots", type=Path, help="Write PNG plots into this directory.")
    args = parser.parse_args(argv)
    if args.smoke:
        args.sizes = [240]
        args.tenants = 6
        args.runs, args.builds = 1, 1
        args.queries, args.writes, args.embedded_calls = 4, 4, 2
        args.ef_search_sweep = args.ef_search_sweep or [40]
        args.scan_sweep = args.scan_sweep or ["strict_order:20000"]
        args.maintenance_work_mem = "64MB"
    elif args.data is None:
        parser.error("--data is required unless --smoke")
    for layout in args.layouts:
        if layout not in ("one", "spread"):
            parser.error(f"unknown layout {layout!r}")

    started = time.monotonic()
    where = harness.configure(args.database_url, args.workdir)
    harness.configure_server(dict(item.split("=", 1) for item in args.server_setting))
    bench = Bench(args)
    report: dict[str, Any] = {
        "command": "python bench/scale.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "machine": harness.machine(),
        "database": {"where": where, **harness.database_versions()},
        "config": bench.config(),
        "results": [],
    }
    print(f"database: {where}; {report['database']}", flush=True)
    if args.check_perturbation:
        report["perturbation"] = check_perturbation(bench, args.check_perturbation, args.sizes)
        args.sizes = []
    try:
        for size in args.sizes:
            for layout in args.layouts:
                result = bench.run(size, layout)
                report["results"].append(result)
                print_result(result)
                if args.json:
                    args.json.write_text(json.dumps(report, indent=2) + "\n")
    finally:
        bench.cleanup()
    report["seconds"] = round(time.monotonic() - started, 1)
    print_summary(report["results"])
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
        print(f"wrote {args.json}")
    if args.plots:
        from bench import plots

        for path in plots.plot_scale([report], args.plots):
            print(f"wrote {path}")
    print(f"done in {report['seconds']:.0f} s")
    return 0


class Accuracy:
    """recall@k against exact answers, and how often the limit was filled."""

    def __init__(self) -> None:
        self.hits = self.total = self.filled = self.queries = 0

    def add(self, found: list[str], truth: list[str]) -> None:
        self.queries += 1
        self.hits += len(set(found) & set(truth))
        self.total += len(truth)
        # The exact answer may hold fewer than k rows (a small tenant, a filter).
        self.filled += len(found) >= len(truth)

    def report(self) -> dict[str, Any]:
        return {
            "recall_at_10": round(self.hits / self.total, 4) if self.total else None,
            "filled": round(self.filled / self.queries, 4) if self.queries else None,
        }


@dataclass
class Point:
    """One setting in a sweep: session settings to apply, and the right answers."""

    label: dict[str, Any]
    overrides: dict[str, str]
    truths: dict[tuple[int, int], list[str]]
    where: dict[str, Any] | None = None
    halfvec: bool = False


@dataclass
class Table:
    size: int
    layout: str
    users: list[str]  # user id of each tenant
    owner: np.ndarray  # tenant index of each row
    ids: list[str]
    contents: list[str]
    vectors: np.ndarray
    buckets: np.ndarray  # 0..99, for the metadata filters

    def rows_of(self, tenant: int) -> np.ndarray:
        return np.flatnonzero(self.owner == tenant)


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        from django.conf import settings

        from memories import embeddings

        self.args = args
        self.settings = settings
        self.rng = np.random.default_rng(args.seed)
        self.real = embeddings.get_embedder()
        self.real.load()
        self.model_id = self.real.model_id
        self.dimensions = int(self.real.dimensions)
        self.m = args.m or settings.HNSW_M
        self.ef_construction = args.ef_construction or settings.HNSW_EF_CONSTRUCTION
        cache = corpus.EmbeddingCache(
            None if args.smoke else args.cache,
            f"{self.model_id}-{embeddings.BUNDLED_ONNX_SHA256[:12]}",
        )
        if args.smoke:
            texts, queries = list(corpus.SMOKE_SENTENCES), list(corpus.SMOKE_QUERIES)
        else:
            scifact = corpus.load_scifact(args.data)
            texts = sorted({s for s in scifact.sentences if s})
            queries = sorted(set(scifact.claims.values()))
        order = self.rng.permutation(len(texts))
        self.texts = [texts[i] for i in order]
        self.text_vectors = corpus.embed_texts(self.real, self.texts, cache, progress="corpus")
        self.queries = queries
        self.query_vectors = corpus.embed_texts(self.real, queries, cache, progress="queries")
        from memories import validation

        self.stub = harness.stub_embedder(
            self.real,
            {validation.normalize(q): v for q, v in zip(queries, self.query_vectors, strict=True)},
            self.text_vectors,
        )
        # (table, tenant, filter) -> (row numbers, their vectors), for exact answers.
        self._candidates: dict[tuple[int, int, int], tuple[np.ndarray, np.ndarray]] = {}
        self.sampler = harness.MemorySampler()
        self.sampler.attach()
        self.sampler.start()

    def config(self) -> dict[str, Any]:
        s = self.settings
        return {
            "model": self.model_id,
            "dimensions": self.dimensions,
            "real_vectors": len(self.texts),
            "query_texts": len(self.queries),
            "sigma": self.args.sigma,
            "bases": self.args.bases or len(self.texts),
            "hnsw_m": self.m,
            "hnsw_ef_construction": self.ef_construction,
            "hnsw_ef_search": s.HNSW_EF_SEARCH,
            "hnsw_max_scan_tuples": s.HNSW_MAX_SCAN_TUPLES,
            "maintenance_work_mem": self.args.maintenance_work_mem,
            "build_workers": self.args.build_workers,
            "runs": self.args.runs,
            "queries_per_run": self.args.queries,
        }

    def cleanup(self) -> None:
        self.sampler.stop()
        self.reset()

    # The table ---------------------------------------------------------------------

    def reset(self) -> None:
        from django.db import connection

        from accounts.models import User
        from core import tenancy

        self._candidates.clear()
        with connection.cursor() as cursor:
            cursor.execute("TRUNCATE memories, forget_confirmations")
        with tenancy.operator():
            User.objects.filter(email__startswith="bench-").delete()

    def make_table(self, size: int, layout: str, *, prefix: str = "") -> Table:
        """Create the table's tenants and its rows (in memory); ``prefix`` names the tenants."""
        from accounts.models import User

        tenants = 1 if layout == "one" else min(self.args.tenants, size)
        users = User.objects.bulk_create(
            [
                User(email=BENCH_EMAIL.format(f"{prefix}{n}"), password="!")  # noqa: S106
                for n in range(tenants)
            ]
        )
        rng = np.random.default_rng(self.args.seed + size)
        bases = min(self.args.bases or len(self.texts), len(self.texts), size)
        contents = list(self.texts[:bases])
        vectors = np.empty((size, self.dimensions), dtype=np.float32)
        vectors[:bases] = self.text_vectors[:bases]
        extra = size - bases
        if extra:
            picks = rng.integers(0, bases, extra)
            for start in range(0, extra, 100_000):
                chunk = picks[start : start + 100_000]
                vectors[bases + start : bases + start + len(chunk)] = corpus.perturb(
                    self.text_vectors[chunk], self.args.sigma, rng
                )
            contents += [f"{self.texts[b]} (variant {n})" for n, b in enumerate(picks)]
        return Table(
            size=size,
            layout=layout,
            users=[str(u.id) for u in users],
            owner=rng.permutation(np.arange(size) % tenants),
            ids=[str(uuid.uuid4()) for _ in range(size)],
            contents=contents,
            vectors=vectors,
            buckets=rng.integers(0, 100, size),
        )

    def bulk_load(self, table: Table) -> dict[str, float]:
        """COPY into a staging table, then INSERT ... SELECT as the operator, per chunk.

        Row-level security is forced on ``memories``, so COPY FROM straight into
        it is refused to every role but a superuser; this is the bulk path the
        application's own roles can use.
        """
        from django.db import connection
        from psycopg.types import TypeInfo
        from psycopg.types.json import Jsonb

        from core import tenancy
        from memories import validation

        columns = (
            "id, user_id, namespace, content, content_hash, embedding, embedding_model,"
            " metadata, created_at, updated_at"
        )
        types = [
            "uuid",
            "uuid",
            "varchar",
            "text",
            "varchar",
            "vector",
            "varchar",
            "jsonb",
            "timestamptz",
            "timestamptz",
        ]
        # Distinct creation times, as real traffic has; list_memories orders by them.
        origin = datetime.now(UTC) - timedelta(seconds=table.size)
        copy_s = insert_s = 0.0
        started = time.perf_counter()
        chunk = 50_000
        users = [uuid.UUID(u) for u in table.users]
        for start in range(0, table.size, chunk):
            stop = min(start + chunk, table.size)
            with tenancy.operator():
                raw = connection.connection
                info = TypeInfo.fetch(raw, "vector")
                with raw.cursor() as cursor:
                    from pgvector.psycopg.vector import register_vector_info

                    register_vector_info(cursor, info)
                    cursor.execute(
                        "CREATE TEMP TABLE bench_staging (LIKE memories INCLUDING DEFAULTS)"
                        " ON COMMIT DROP"
                    )
                    t0 = time.perf_counter()
                    with cursor.copy(
                        f"COPY bench_staging ({columns}) FROM STDIN (FORMAT BINARY)"
                    ) as copy:
                        copy.set_types(types)
                        for row in range(start, stop):
                            text = table.contents[row]
                            moment = origin + timedelta(seconds=row)
                            bucket = int(table.buckets[row])
                            copy.write_row(
                                (
                                    uuid.UUID(table.ids[row]),
                                    users[table.owner[row]],
                                    "default",
                                    text,
                                    validation.content_hash(validation.normalize(text)),
                                    table.vectors[row],
                                    self.model_id,
                                    Jsonb({"b100": bucket, "b20": bucket % 20}),
                                    moment,
                                    moment,
                                )
                            )
                    t1 = time.perf_counter()
                    cursor.execute(
                        # columns is this script's own constant list of column names.
                        f"INSERT INTO memories ({columns}) SELECT {columns} FROM bench_staging"  # noqa: S608
                    )
                    t2 = time.perf_counter()
            copy_s += t1 - t0
            insert_s += t2 - t1
            if table.size >= 200_000:
                print(f"    loaded {stop:,}/{table.size:,}", flush=True)
        total = time.perf_counter() - started
        # What autovacuum does to a table that has been taking inserts for a
        # while: statistics for the planner, and a visibility map, without
        # which every index-only scan (recall's namespace count) visits the
        # heap. Timed apart from the load.
        t3 = time.perf_counter()
        with connection.cursor() as cursor:
            cursor.execute("VACUUM (ANALYZE) memories")
        return {
            "seconds": round(total, 2),
            "rows_per_s": round(table.size / total, 1),
            "copy_seconds": round(copy_s, 2),
            "insert_select_seconds": round(insert_s, 2),
            "vacuum_analyze_seconds": round(time.perf_counter() - t3, 2),
        }

    def drop_index(self) -> None:
        from memories import indexes

        indexes.drop_vector_index(self.model_id)

    def build_index(self, *, halfvec: bool = False) -> dict[str, Any]:
        from django.db import connection

        from memories import indexes

        notices: list[str] = []
        raw = connection.connection

        def keep(diagnostic: Any) -> None:
            notices.append(str(diagnostic.message_primary))

        raw.add_notice_handler(keep)
        settings = self.settings
        saved = settings.HNSW_M, settings.HNSW_EF_CONSTRUCTION
        settings.HNSW_M, settings.HNSW_EF_CONSTRUCTION = self.m, self.ef_construction
        try:
            with connection.cursor() as cursor:
                cursor.execute(
                    "SELECT set_config('maintenance_work_mem', %s, false),"
                    " set_config('max_parallel_maintenance_workers', %s, false)",
                    [self.args.maintenance_work_mem, str(self.args.build_workers)],
                )
                if halfvec:
                    name = indexes.index_name(self.model_id) + "_half"
                    sql = halfvec_index_sql(
                        self.model_id, self.dimensions, name, self.m, self.ef_construction
                    )
                else:
                    name = indexes.index_name(self.model_id)
                    indexes.drop_vector_index(self.model_id)
                    sql = indexes.create_sql(self.model_id, self.dimensions)
                notices.clear()  # only the build's own, such as "graph no longer fits"
                started = time.perf_counter()
                cursor.execute(sql)
                seconds = time.perf_counter() - started
                cursor.execute("RESET maintenance_work_mem; RESET max_parallel_maintenance_workers")
                cursor.execute("SELECT pg_relation_size(%s::regclass)", [name])
                index_bytes = cursor.fetchone()[0]
                cursor.execute(
                    "SELECT pg_table_size('memories'), pg_total_relation_size('memories')"
                )
                table_bytes, total_bytes = cursor.fetchone()
                cursor.execute(
                    "SELECT indexname, pg_relation_size(quote_ident(indexname)::regclass)"
                    " FROM pg_indexes WHERE tablename = 'memories' ORDER BY indexname"
                )
                every_index = {name: round(size / 2**20, 1) for name, size in cursor.fetchall()}
        finally:
            settings.HNSW_M, settings.HNSW_EF_CONSTRUCTION = saved
            raw.remove_notice_handler(keep)
        return {
            "name": name,
            "seconds": round(seconds, 2),
            "index_mib": round(index_bytes / 2**20, 1),
            "table_mib": round(table_bytes / 2**20, 1),
            "total_mib": round(total_bytes / 2**20, 1),
            "m": self.m,
            "ef_construction": self.ef_construction,
            "notices": notices,
            "every_index_mib": every_index,
        }

    # Queries ---------------------------------------------------------------------

    def raw_nearest(
        self,
        user_id: str,
        vector: np.ndarray,
        *,
        limit: int = 10,
        metadata_filter: dict[str, Any] | None = None,
        overrides: dict[str, str] | None = None,
        halfvec: bool = False,
        explain: bool = False,
        text: str = "",
        mode: str = "semantic",
    ) -> tuple[float, list[str]]:
        """Run the search's statement in a tenant transaction; time only the statement."""
        from django.db import connection

        from core import tenancy
        from memories import search

        prepared = search.Search(
            text=text,
            vector=vector,
            embedder=self.real,
            mode=mode,
            limit=limit,
            minimum=0.0,
            filters=search.Filters("default", metadata_filter or {}),
        )
        sql, params = search.statement(user_id, prepared)
        if halfvec:
            sql = sql.replace(f"vector({self.dimensions})", f"halfvec({self.dimensions})")
        with (
            tenancy.tenant(user_id, local_settings=search.transaction_settings(prepared)),
            connection.cursor() as cursor,
        ):
            for name, value in (overrides or {}).items():
                cursor.execute("SELECT set_config(%s, %s, true)", [name, value])
            if explain:
                cursor.execute("EXPLAIN (ANALYZE, BUFFERS) " + sql, params)
                return 0.0, [_VECTOR_LITERAL.sub("'[...]'", row[0]) for row in cursor.fetchall()]
            started = time.perf_counter()
            cursor.execute(sql, params)
            rows = cursor.fetchall()
            elapsed = (time.perf_counter() - started) * 1000.0
        return elapsed, [str(row[0]) for row in rows]

    def exact(
        self,
        table: Table,
        vector: np.ndarray,
        tenant: int,
        bucket_mod: int = 0,
        k: int = 10,
        minimum: float | None = 0.0,
    ) -> list[str]:
        """Return the true k nearest, with the similarity floor recall(threshold=0) applies."""
        key = (id(table), tenant if table.layout != "one" else 0, bucket_mod)
        if key not in self._candidates:
            if len(self._candidates) > 4096:
                self._candidates.clear()
            if table.layout == "one" and not bucket_mod:
                self._candidates[key] = (np.arange(table.size), table.vectors)
            else:
                rows = table.rows_of(tenant) if table.layout != "one" else np.arange(table.size)
                if bucket_mod:
                    rows = rows[(table.buckets[rows] % bucket_mod) == 7]
                self._candidates[key] = (rows, table.vectors[rows])
        candidates, matrix = self._candidates[key]
        scores = matrix @ vector
        if minimum is not None:
            candidates, scores = candidates[scores >= minimum], scores[scores >= minimum]
        top = candidates[np.argsort(-scores, kind="stable")[:k]]
        return [table.ids[i] for i in top]

    def exact_sql(self, user_id: str, vector: np.ndarray, k: int = 10) -> list[str]:
        """The exact scan in the database: no cast, so the partial index cannot serve it."""
        from django.db import connection
        from pgvector import Vector

        from core import tenancy

        with tenancy.tenant(user_id), connection.cursor() as cursor:
            cursor.execute("SET LOCAL enable_indexscan = off")
            cursor.execute(
                "SELECT id FROM memories WHERE user_id = %s AND embedding_model = %s"
                " ORDER BY embedding <=> %s::vector LIMIT %s",
                [user_id, self.model_id, Vector(vector).to_text(), k],
            )
            return [str(row[0]) for row in cursor.fetchall()]

    # One size ------------------------------------------------------------------------

    def run(self, size: int, layout: str) -> dict[str, Any]:
        label = f"{size_label(size)}/{layout}"
        print(f"\n== {label}", flush=True)
        result: dict[str, Any] = {"size": size, "layout": layout}
        loads, builds = [], []
        for n in range(max(1, self.args.builds)):
            self.reset()
            table = self.make_table(size, layout)
            if not self.args.load_with_index:
                # Building the graph once after loading is far cheaper than
                # inserting every row into it (see BENCHMARKS.md).
                self.drop_index()
            with self.sampler.phase(f"{label} load"):
                loads.append(self.bulk_load(table))
            print(f"  load {loads[-1]}", flush=True)
            with self.sampler.phase(f"{label} index"):
                builds.append(self.build_index())
            print(f"  index {builds[-1]}", flush=True)
            if n + 1 < self.args.builds:
                del table
        result["tenants"] = len(table.users)
        result["load"] = harness.median_of_runs(loads)
        result["index"] = {
            **harness.median_of_runs(builds),
            "notices": builds[-1]["notices"],
            "every_index_mib": builds[-1]["every_index_mib"],
        }

        with self.sampler.phase(f"{label} query"):
            result.update(self.measure_recall(table))
            if self.args.ef_search_sweep:
                result["ef_search_sweep"] = self.sweep_ef_search(table)
            if self.args.scan_sweep:
                result["scan_sweep"] = self.sweep_scans(table)
            if self.args.halfvec:
                result["halfvec"] = self.measure_halfvec(table)
            result["list"] = self.measure_list(table)
            if self.args.index_sweep:
                # After the reads it would disturb, before the writes that would
                # make the exact answers stale. The writes then use its last graph.
                result["index_sweep"] = self.sweep_index(table, label)
        with self.sampler.phase(f"{label} write"):
            result["remember"] = self.measure_remember(table)
            result["forget"] = self.measure_forget(table)
        # The machine is shared: how busy it was says how far to trust the times.
        result["load_average"] = [round(x, 2) for x in os.getloadavg()]
        result["memory"] = {
            phase.split(" ", 1)[1]: peaks
            for phase, peaks in self.sampler.peaks.items()
            if phase.startswith(label + " ")
        }
        return result

    def query_plan(self, table: Table, count: int) -> list[tuple[int, int]]:
        """Return (query index, tenant index) pairs, the same for every pass."""
        rng = np.random.default_rng(self.args.seed)
        picks = rng.choice(len(self.queries), size=count, replace=count > len(self.queries))
        tenants = rng.integers(0, len(table.users), count)
        return list(zip(picks.tolist(), tenants.tolist(), strict=True))

    def passes(self) -> Iterator[int]:
        yield from range(self.args.runs)

    def measure_modes(
        self, table: Table, plan: list[tuple[int, int]], out: dict[str, Any]
    ) -> dict[tuple[int, int], list[str]]:
        """Time recall's statement and service in every mode; return the semantic results."""
        from memories import services

        # The raw SQL (the database's part alone) and the service with the query
        # embedding stubbed out, in every search mode, taking turns query by
        # query, so that noise from a shared machine falls on all alike.
        # recall_raw_sql_ms and recall_service_ms are the semantic mode, as
        # they were before there were modes; "modes" holds all three.
        steps = [(kind, mode) for mode in MODES for kind in ("raw", "service")]
        runs: dict[tuple[str, str], list[dict[str, float]]] = {step: [] for step in steps}
        found: dict[tuple[int, int], list[str]] = {}
        shuffle = np.random.default_rng(self.args.seed)
        with harness.using_embedder(self.stub):
            for _ in self.passes():
                times: dict[tuple[str, str], list[float]] = {step: [] for step in steps}
                for q, t in plan:
                    # Whichever runs later finds the pages the earlier ones read
                    # in shared buffers, so the order changes every query.
                    for i in shuffle.permutation(len(steps)).tolist():
                        kind, mode = steps[i]
                        if kind == "raw":
                            ms, _ = self.raw_nearest(
                                table.users[t],
                                self.query_vectors[q],
                                text=self.queries[q],
                                mode=mode,
                            )
                            times[kind, mode].append(ms)
                            continue
                        ms, rows = harness.timed(
                            partial(
                                services.recall,
                                user_id=table.users[t],
                                query=self.queries[q],
                                limit=10,
                                threshold=0,
                                mode=mode,
                            )
                        )
                        times[kind, mode].append(ms)
                        if mode == "semantic":
                            found[(q, t)] = [r["id"] for r in rows]
                for step in steps:
                    runs[step].append(harness.percentiles(times[step]))
        out["recall_raw_sql_ms"] = harness.median_of_runs(runs["raw", "semantic"])
        out["recall_service_ms"] = harness.median_of_runs(runs["service", "semantic"])
        out["modes"] = {
            mode: {
                "raw_sql_ms": harness.median_of_runs(runs["raw", mode]),
                "service_ms": harness.median_of_runs(runs["service", mode]),
            }
            for mode in MODES
        }

        return found

    def measure_recall(self, table: Table) -> dict[str, Any]:
        from memories import services

        plan = self.query_plan(table, self.args.queries)
        out: dict[str, Any] = {}

        found = self.measure_modes(table, plan, out)

        # The service with the model embedding each query.
        embedded = plan[: self.args.embedded_calls]
        runs = []
        with harness.using_embedder(self.real):
            for _ in self.passes():
                times = [
                    harness.timed(
                        partial(
                            services.recall,
                            user_id=table.users[t],
                            query=self.queries[q],
                            limit=10,
                            threshold=0,
                            mode="semantic",
                        )
                    )[0]
                    for q, t in embedded
                ]
                runs.append(harness.percentiles(times))
        out["recall_service_embedded_ms"] = harness.median_of_runs(runs)

        # Accuracy against the exact answer.
        accuracy = Accuracy()
        for (q, t), ids in found.items():
            accuracy.add(ids, self.exact(table, self.query_vectors[q], t))
        out.update(accuracy.report())
        checks = plan[: min(5, len(plan))]
        agree = sum(
            set(self.exact_sql(table.users[t], self.query_vectors[q]))
            == set(self.exact(table, self.query_vectors[q], t, minimum=None))
            for q, t in checks
        )
        out["exact_sql_agrees"] = f"{agree}/{len(checks)}"
        if self.args.explain:
            q, t = plan[0]
            _, lines = self.raw_nearest(table.users[t], self.query_vectors[q], explain=True)
            out["explain"] = lines
            print("\n".join("    " + line for line in lines))

        # Selective metadata filters.
        out["filters"] = {}
        with harness.using_embedder(self.stub):
            for name, where in FILTERS.items():
                mod = 100 if "b100" in where else 20
                ms, accuracy, _ = self.time_filter(table, plan, where, mod, "semantic")
                q, t = plan[0]
                _, plan_lines = self.raw_nearest(
                    table.users[t], self.query_vectors[q], metadata_filter=where, explain=True
                )
                # Hybrid results are not the semantic top 10: for them, only
                # whether the limit was filled and every result matched.
                hybrid_ms, filled, outside = self.time_filter(table, plan, where, mod, "hybrid")
                out["filters"][name] = {
                    "ms": ms,
                    **accuracy.report(),
                    "plan": scan_kind(plan_lines),
                    "hybrid": {
                        "ms": hybrid_ms,
                        "filled": filled.report()["filled"],
                        "outside_filter": outside,
                    },
                }
        return out

    def time_filter(
        self, table: Table, plan: list[tuple[int, int]], where: dict[str, Any], mod: int, mode: str
    ) -> tuple[dict[str, Any], Accuracy, int]:
        """Time recall with a metadata filter in ``mode``.

        Return the median percentiles of the passes, the first pass's results
        against the exact filtered top 10, and how many results broke the filter.
        """
        from memories import services

        runs, accuracy, outside = [], Accuracy(), 0
        for n in self.passes():
            times = []
            for q, t in plan:
                ms, rows = harness.timed(
                    partial(
                        services.recall,
                        user_id=table.users[t],
                        query=self.queries[q],
                        limit=10,
                        threshold=0,
                        metadata_filter=where,
                        mode=mode,
                    )
                )
                times.append(ms)
                if n == 0:
                    truth = self.exact(table, self.query_vectors[q], t, mod)
                    accuracy.add([r["id"] for r in rows], truth)
                    outside += sum(
                        any(r["metadata"].get(k) != v for k, v in where.items()) for r in rows
                    )
            runs.append(harness.percentiles(times))
        return harness.median_of_runs(runs), accuracy, outside

    def sweep_ef_search(self, table: Table) -> list[dict[str, Any]]:
        plan = self.query_plan(table, self.args.queries)
        truths = {(q, t): self.exact(table, self.query_vectors[q], t) for q, t in plan}
        points = [
            Point({"ef_search": ef}, {"hnsw.ef_search": str(ef)}, truths)
            for ef in self.args.ef_search_sweep
        ]
        return self._sweep(table, plan, points)

    def sweep_scans(self, table: Table) -> list[dict[str, Any]]:
        plan = self.query_plan(table, self.args.queries)
        points = []
        for name, where in FILTERS.items():
            mod = 100 if "b100" in where else 20
            truths = {(q, t): self.exact(table, self.query_vectors[q], t, mod) for q, t in plan}
            for pair in self.args.scan_sweep:
                mode, _, tuples = pair.partition(":")
                overrides = {"hnsw.iterative_scan": mode}
                if tuples and tuples != "0":
                    overrides["hnsw.max_scan_tuples"] = tuples
                points.append(Point({"scan": pair, "filter": name}, overrides, truths, where))
        return self._sweep(table, plan, points)

    def _sweep(
        self, table: Table, plan: list[tuple[int, int]], points: list[Point]
    ) -> list[dict[str, Any]]:
        """Time raw SQL at each point, the points taking turns query by query."""
        runs: list[list[dict[str, float]]] = [[] for _ in points]
        accuracy = [Accuracy() for _ in points]
        for run in self.passes():
            times: list[list[float]] = [[] for _ in points]
            shuffle = np.random.default_rng(self.args.seed + run)
            for q, t in plan:
                # A point finds the pages that points before it read into shared
                # buffers, so the order is shuffled for every query.
                for i in shuffle.permutation(len(points)).tolist():
                    point = points[i]
                    ms, ids = self.raw_nearest(
                        table.users[t],
                        self.query_vectors[q],
                        metadata_filter=point.where,
                        overrides=point.overrides,
                        halfvec=point.halfvec,
                    )
                    times[i].append(ms)
                    if run == 0:
                        accuracy[i].add(ids, point.truths[(q, t)])
            for i in range(len(points)):
                runs[i].append(harness.percentiles(times[i]))
        out = []
        for point, point_runs, point_accuracy in zip(points, runs, accuracy, strict=True):
            result = {
                **point.label,
                "raw_sql_ms": harness.median_of_runs(point_runs),
                **point_accuracy.report(),
            }
            ms = result["raw_sql_ms"]
            print(
                f"    {point.label}: p50 {ms['p50']} p95 {ms['p95']} ms, "
                f"recall@10 {result['recall_at_10']}, filled {result['filled']}",
                flush=True,
            )
            out.append(result)
        return out

    def sweep_index(self, table: Table, label: str) -> list[dict[str, Any]]:
        """Rebuild the index per m:ef_construction, searching each at every ef_search."""
        plan = self.query_plan(table, self.args.queries)
        truths = {(q, t): self.exact(table, self.query_vectors[q], t) for q, t in plan}
        efs = self.args.ef_search_sweep or [self.settings.HNSW_EF_SEARCH]
        original = self.m, self.ef_construction
        out = []
        try:
            for pair in self.args.index_sweep:
                m, _, ef_construction = pair.partition(":")
                self.m, self.ef_construction = int(m), int(ef_construction)
                with self.sampler.phase(f"{label} index sweep"):
                    build = self.build_index()
                print(f"  index m={m} ef_construction={ef_construction}: {build}", flush=True)
                points = [
                    Point({"ef_search": ef}, {"hnsw.ef_search": str(ef)}, truths) for ef in efs
                ]
                out.append(
                    {
                        "m": self.m,
                        "ef_construction": self.ef_construction,
                        "build": build,
                        "search": self._sweep(table, plan, points),
                    }
                )
        finally:
            self.m, self.ef_construction = original
        return out

    def measure_halfvec(self, table: Table) -> dict[str, Any]:
        """Build a halfvec index beside the vector one and time both, taking turns."""
        from django.db import connection

        with self.sampler.phase(f"{size_label(table.size)}/{table.layout} halfvec index"):
            build = self.build_index(halfvec=True)
        plan = self.query_plan(table, self.args.queries)
        truths = {(q, t): self.exact(table, self.query_vectors[q], t) for q, t in plan}
        points = [
            Point({"storage": "vector"}, {}, truths),
            Point({"storage": "halfvec"}, {}, truths, halfvec=True),
        ]
        vector, half = self._sweep(table, plan, points)
        with connection.cursor() as cursor:
            cursor.execute(f"DROP INDEX {build['name']}")
        return {"index": build, "vector": vector, "halfvec": half}

    def measure_list(self, table: Table) -> dict[str, Any]:
        from memories import services

        out = {}
        per_tenant = table.size // len(table.users)
        offsets = [0] + ([1000] if per_tenant > 1020 else [])
        plan = self.query_plan(table, self.args.queries)
        for offset in offsets:
            runs = []
            for _ in self.passes():
                times = [
                    harness.timed(
                        partial(
                            services.list_memories, user_id=table.users[t], limit=20, offset=offset
                        )
                    )[0]
                    for _, t in plan
                ]
                runs.append(harness.percentiles(times))
            out[f"offset_{offset}_ms"] = harness.median_of_runs(runs)
        return out

    def measure_remember(self, table: Table) -> dict[str, Any]:
        rng = np.random.default_rng(self.args.seed + 1)
        out: dict[str, Any] = {}
        count = self.args.writes
        tenants = rng.integers(0, len(table.users), count)
        stamp = uuid.uuid4().hex[:8]
        with harness.using_embedder(self.stub):
            texts = [
                f"remember {stamp} {n}: {self.texts[n % len(self.texts)]}" for n in range(count)
            ]
            users = [table.users[tenants[n]] for n in range(count)]
            out["stubbed_ms"], out["stubbed_per_s"] = self._time_remember(users, texts)
            out["stubbed_async_commit_ms"] = self.measure_async_commit(table, tenants, stamp)
        with harness.using_embedder(self.real):
            calls = self.args.embedded_calls
            texts = [f"remember embedded {stamp} {n}: {self.texts[-1 - n]}" for n in range(calls)]
            users = [table.users[tenants[n % count]] for n in range(calls)]
            out["embedded_ms"], out["embedded_per_s"] = self._time_remember(users, texts)
        return out

    @staticmethod
    def _time_remember(users: list[Any], texts: list[str]) -> tuple[dict[str, Any], float]:
        """Call remember once per text; return its percentiles and calls per second."""
        from memories import services

        times = []
        started = time.perf_counter()
        for user_id, text in zip(users, texts, strict=True):
            ms, _ = harness.timed(
                partial(services.remember, user_id=user_id, tier="pro", content=text)
            )
            times.append(ms)
        return harness.percentiles(times), round(len(texts) / (time.perf_counter() - started), 1)

    def measure_async_commit(self, table: Table, tenants: np.ndarray, stamp: str) -> dict[str, Any]:
        """Time remember with synchronous_commit on and off, call by call in turn.

        Off, a commit returns before its WAL reaches the disk: a crash of the
        machine can lose the last few hundred milliseconds of acknowledged
        memories, never consistency. This measures what that would buy.
        """
        from django.db import connection

        from memories import services

        times: dict[str, list[float]] = {"on": [], "off": []}
        for n in range(2 * self.args.writes):
            mode = ("on", "off")[n % 2]
            with connection.cursor() as cursor:
                cursor.execute("SELECT set_config('synchronous_commit', %s, false)", [mode])
            text = f"remember {stamp} commit {n}: {self.texts[n % len(self.texts)]}"
            ms, _ = harness.timed(
                partial(
                    services.remember,
                    user_id=table.users[tenants[n % len(tenants)]],
                    tier="pro",
                    content=text,
                )
            )
            times[mode].append(ms)
        with connection.cursor() as cursor:
            cursor.execute("RESET synchronous_commit")
        return {mode: harness.percentiles(values) for mode, values in times.items()}

    def measure_forget(self, table: Table) -> dict[str, Any]:
        from memories import services

        rng = np.random.default_rng(self.args.seed + 2)
        count = self.args.writes
        victims = rng.choice(table.size, size=min(count, table.size // 2), replace=False)
        by_id = [
            harness.timed(
                partial(
                    services.forget_by_id, user_id=table.users[table.owner[row]], id=table.ids[row]
                )
            )[0]
            for row in victims
        ]
        preview, confirm, deleted = [], [], 0
        with harness.using_embedder(self.stub):
            for q, t in self.query_plan(table, max(1, count // 4)):
                ms, found = harness.timed(
                    partial(
                        services.forget_preview,
                        user_id=table.users[t],
                        query=self.queries[q],
                        limit=10,
                        threshold=0,
                    )
                )
                preview.append(ms)
                token = found["confirmation_token"]
                if token:
                    ms, done = harness.timed(
                        partial(
                            services.forget_confirm,
                            user_id=table.users[t],
                            confirmation_token=token,
                        )
                    )
                    confirm.append(ms)
                    deleted += done["deleted_count"]
        return {
            "by_id_ms": harness.percentiles(by_id),
            "preview_ms": harness.percentiles(preview),
            "confirm_ms": harness.percentiles(confirm),
            "deleted_by_query": deleted,
        }


def check_perturbation(bench: Bench, sigmas: list[float], sizes: list[int]) -> dict[str, Any]:
    """Compare neighbourhoods of real vectors with those of perturbed ones.

    Two statistics, each as percentiles: ``nn``, a probe row's similarity to
    its nearest other row; ``q1``/``q10``, a real query's similarity to its
    1st and 10th nearest row. Real sets are subsets of the corpus; synthetic
    sets of the same size keep 1/ratio of it as bases and perturb the rest,
    which is how the benchmark grows the table.
    """
    rng = np.random.default_rng(bench.args.seed)
    real = bench.text_vectors
    queries = bench.query_vectors[rng.choice(len(bench.query_vectors), 400, replace=False)]
    out: dict[str, Any] = {"real": {}, "synthetic": {}}

    def stats(vectors: np.ndarray, probes: np.ndarray) -> dict[str, Any]:
        nn = np.full(len(probes), -2.0, dtype=np.float32)
        top = np.full((len(queries), 10), -2.0, dtype=np.float32)
        for start in range(0, len(vectors), 50_000):
            block = vectors[start : start + 50_000]
            sims = block @ vectors[probes].T
            own = (probes >= start) & (probes < start + len(block))
            sims[probes[own] - start, np.flatnonzero(own)] = -2.0  # not itself
            nn = np.maximum(nn, sims.max(axis=0))
            qs = block @ queries.T
            both = np.concatenate([top, np.sort(qs, axis=0)[-10:].T], axis=1)
            top = -np.sort(-both, axis=1)[:, :10]

        def pct(values: np.ndarray) -> dict[str, float]:
            return {f"p{p}": round(float(np.percentile(values, p)), 3) for p in (10, 50, 90)}

        return {"rows": len(vectors), "nn": pct(nn), "q1": pct(top[:, 0]), "q10": pct(top[:, 9])}

    def probes_of(n: int, low: int = 0) -> np.ndarray:
        return rng.choice(np.arange(low, n), size=min(500, n - low), replace=False)

    for n in sorted({len(real) // 8, len(real) // 4, len(real) // 2, len(real)}):
        subset = real[rng.permutation(len(real))[:n]]
        out["real"][str(n)] = stats(subset, probes_of(n))
        print(f"  real {n:>9,}: {json.dumps(out['real'][str(n)])}", flush=True)
    for sigma in sigmas:
        for ratio in (2, 4):
            n = len(real)
            bases = n // ratio
            vectors = np.concatenate(
                [real[:bases], corpus.perturb(real[rng.integers(0, bases, n - bases)], sigma, rng)]
            )
            key = f"sigma={sigma} n={n} ratio={ratio}"
            out["synthetic"][key] = stats(vectors, probes_of(n, bases))
            print(f"  {key}: {json.dumps(out['synthetic'][key])}", flush=True)
        for size in sizes:
            if size <= len(real):
                continue
            extra = size - len(real)
            vectors = np.empty((size, real.shape[1]), dtype=np.float32)
            vectors[: len(real)] = real
            picks = rng.integers(0, len(real), extra)
            for start in range(0, extra, 100_000):
                chunk = picks[start : start + 100_000]
                vectors[len(real) + start : len(real) + start + len(chunk)] = corpus.perturb(
                    real[chunk], sigma, rng
                )
            key = f"sigma={sigma} n={size}"
            out["synthetic"][key] = stats(vectors, probes_of(size, len(real)))
            print(f"  {key}: {json.dumps(out['synthetic'][key])}", flush=True)
    return out


def halfvec_index_sql(model_id: str, dimensions: int, name: str, m: int, ef: int) -> str:
    from memories import indexes

    indexes.check_model_id(model_id)
    return (
        f"CREATE INDEX {name} ON memories USING hnsw "
        f"((embedding::halfvec({int(dimensions)})) halfvec_cosine_ops) "
        f"WITH (m = {int(m)}, ef_construction = {int(ef)}) "
        f"WHERE embedding_model = '{model_id}'"
    )


def scan_kind(plan: list[str]) -> str:
    """Name the scan that ran, from an analysed plan (branches not taken say "never executed")."""
    text = "\n".join(line for line in plan if "never executed" not in line)
    if "memories_pkey" in text:
        # The filter's nearest matches (recall_filtered_nearest), read again by id.
        return "matches+sort"
    if "memories_hnsw_" in text:
        return "hnsw"
    if "memories_metadata_gin" in text:
        return "gin+sort"
    if "memories_list_" in text or "memories_dedup" in text:
        return "btree+sort"
    return "seq+sort"


# Output -----------------------------------------------------------------------------


def print_result(result: dict[str, Any]) -> None:
    load, index = result["load"], result["index"]
    print(
        f"  load {load['rows_per_s']:,.0f} rows/s; index {index['seconds']:.1f} s, "
        f"{index['index_mib']:.0f} MiB; recall@10 {result['recall_at_10']}"
    )
    for key in ("recall_raw_sql_ms", "recall_service_ms", "recall_service_embedded_ms"):
        ms = result[key]
        print(f"  {key}: p50 {ms['p50']} p95 {ms['p95']} p99 {ms['p99']}")
    for mode, timings in result["modes"].items():
        raw, service = timings["raw_sql_ms"], timings["service_ms"]
        print(
            f"  {mode}: statement p50 {raw['p50']} p95 {raw['p95']}, "
            f"service p50 {service['p50']} p95 {service['p95']} p99 {service['p99']}"
        )
    for name, f in result["filters"].items():
        print(
            f"  filter {name}: p50 {f['ms']['p50']} p95 {f['ms']['p95']} ms, "
            f"recall@10 {f['recall_at_10']}, filled {f['filled']}, plan {f['plan']}"
        )
        h = f["hybrid"]
        print(
            f"  filter {name}, hybrid: p50 {h['ms']['p50']} p95 {h['ms']['p95']} ms, "
            f"filled {h['filled']}, outside the filter {h['outside_filter']}"
        )
    print(f"  list {json.dumps({k: v['p50'] for k, v in result['list'].items()})}")
    r = result["remember"]
    print(
        f"  remember stubbed p50 {r['stubbed_ms']['p50']} ms ({r['stubbed_per_s']}/s), "
        f"embedded p50 {r['embedded_ms']['p50']} ms ({r['embedded_per_s']}/s)"
    )
    f = result["forget"]
    print(
        f"  forget by_id p50 {f['by_id_ms']['p50']} ms, preview p50 {f['preview_ms']['p50']}"
        f" ms, confirm p50 {f['confirm_ms'].get('p50')} ms"
    )
    print(f"  memory {json.dumps(result['memory'])}", flush=True)


def print_summary(results: list[dict[str, Any]]) -> None:
    print()
    rows = []
    for r in results:
        rows.append(
            [
                f"{size_label(r['size'])}/{r['layout']}",
                r["load"]["rows_per_s"],
                r["index"]["seconds"],
                r["index"]["index_mib"],
                r["recall_raw_sql_ms"]["p50"],
                r["recall_service_ms"]["p50"],
                r["recall_service_ms"]["p95"],
                r["modes"]["hybrid"]["service_ms"]["p50"],
                r["modes"]["hybrid"]["service_ms"]["p95"],
                r["recall_service_embedded_ms"]["p50"],
                r["recall_at_10"],
                r["filters"]["1%"]["ms"]["p50"],
                r["filters"]["1%"]["recall_at_10"],
                r["remember"]["stubbed_ms"]["p50"],
            ]
        )
    harness.print_table(
        rows,
        [
            "size/layout",
            "load/s",
            "build s",
            "idx MiB",
            "sql p50",
            "svc p50",
            "svc p95",
            "hyb p50",
            "hyb p95",
            "+emb p50",
            "R@10",
            "1% p50",
            "1% R@10",
            "rem p50",
        ],
    )


if __name__ == "__main__":
    sys.exit(main())
