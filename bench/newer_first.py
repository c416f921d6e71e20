"""What newer-first ordering (memories/ordering.py) costs a search, and how often it acts.

    python bench/newer_first.py --json OUT                    # the knowledge-update set
    python bench/newer_first.py --data ../shared/data --json OUT   # and LoCoMo's dev turns

Every search runs ``ordering.newer_first`` on its results, in the search's
transaction: it reorders and marks (``may_be_replaced_by``). This script
stores the knowledge-update set (dev and test, each in stream order in one
namespace) with ``remember`` and asks every question with ``recall`` (limit
10, the server's mode), and with ``--data`` the LoCoMo dev conversations as
bench/retrieval.py stores them, every question in every mode; it times the
rule itself in each search (the detector's text rules, and the cosine
statement when a pair passes them), and counts the
searches where the statement ran, where the order changed and where a
result was marked.

Quality (current@1, look-alikes, LoCoMo hit@5) is bench/knowledge.py's and
bench/retrieval.py's; this is the cost.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

# Run as a script, Python puts bench/ first on sys.path, where bench/http.py
# would shadow the standard library's http: the repository root goes first.
_ROOT = str(Path(__file__).resolve().parent.parent)
if sys.path[0] == str(Path(__file__).resolve().parent):
    sys.path[0] = _ROOT
elif _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

from bench import corpus, harness, retrieval  # noqa: E402
from bench import knowledge_set as ks  # noqa: E402


class Meter:
    """Wraps ``ordering.newer_first`` and ``search.pair_cosines`` to time and count them."""

    def __init__(self) -> None:
        self.rule_ms: list[float] = []
        self.statement_ms: list[float] = []
        self.reordered = 0
        self.marked = 0
        self.marks = 0

    def install(self) -> None:
        from memories import ordering, search

        rule, cosines = ordering.newer_first, search.pair_cosines

        def timed_rule(found: list[Any], read: Callable[..., Any]) -> ordering.Arranged[Any]:
            started = time.perf_counter()
            out = rule(found, read)
            self.rule_ms.append((time.perf_counter() - started) * 1000.0)
            self.reordered += [h.memory.id for h in out.found] != [h.memory.id for h in found]
            self.marked += bool(out.restated)
            self.marks += len(out.restated)
            return out

        def timed_cosines(
            user_id: Any, *, agent_id: Any = None, task_id: str | None = None
        ) -> Callable[..., Mapping[tuple[str, str], float]]:
            read = cosines(user_id, agent_id=agent_id, task_id=task_id)

            def timed(pairs: Sequence[tuple[str, str]]) -> Mapping[tuple[str, str], float]:
                started = time.perf_counter()
                out = read(pairs)
                self.statement_ms.append((time.perf_counter() - started) * 1000.0)
                return out

            return timed

        ordering.newer_first = timed_rule  # type: ignore[assignment]
        search.pair_cosines = timed_cosines

    def report(self) -> dict[str, Any]:
        searches = len(self.rule_ms)
        return {
            "searches": searches,
            "rule_ms": harness.percentiles(self.rule_ms),
            "rule_ms_max": round(max(self.rule_ms, default=0.0), 3),
            "statement_share": round(len(self.statement_ms) / searches, 4) if searches else 0.0,
            "statement_ms": harness.percentiles(self.statement_ms),
            "reordered_share": round(self.reordered / searches, 4) if searches else 0.0,
            # Searches where an older result is marked may_be_replaced_by, and the marks.
            "marked_share": round(self.marked / searches, 4) if searches else 0.0,
            "marks": self.marks,
        }


def knowledge(runner: retrieval.Runner, meter: Meter) -> dict[str, Any]:
    from memories import services

    out = {}
    for name in ("dev", "test"):
        split = ks.load(name)
        user_id = runner.user(f"newer-first-{name}")
        items = ks.stream(split)
        runner.store(user_id, "knowledge", [(item.content, {}) for item in items])
        runner.warm(q.text for q in split.questions)
        meter.__init__()  # type: ignore[misc]
        for question in split.questions:
            services.recall(user_id=user_id, query=question.text, namespace="knowledge", limit=10)
        out[name] = meter.report()
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", type=Path, help="Folder with LoCoMo (locomo10-dev.json).")
    parser.add_argument("--cache", type=Path, default=corpus.DEFAULT_CACHE)
    parser.add_argument("--workdir", type=Path, help="Where the throwaway database lives.")
    parser.add_argument("--json", type=Path, help="Write the results here.")
    args = parser.parse_args(argv)

    where = harness.configure(None, args.workdir)
    from memories import embeddings

    real = embeddings.get_embedder()
    real.load()
    cache = corpus.EmbeddingCache(
        args.cache, f"{real.model_id}-{embeddings.BUNDLED_ONNX_SHA256[:12]}"
    )
    embedder = harness.cached_embedder(real, cache)
    report: dict[str, Any] = {
        "command": "python bench/newer_first.py "
        + " ".join(argv if argv is not None else sys.argv[1:]),
        "machine": harness.machine(),
        "database": {"where": where, **harness.database_versions()},
    }
    meter = Meter()
    meter.install()
    runner = retrieval.Runner(embedder, cache, prewarm=True)
    try:
        with harness.using_embedder(embedder):
            report["knowledge"] = knowledge(runner, meter)
            if args.data is not None:
                meter.__init__()  # type: ignore[misc]
                raw = json.loads(retrieval.locomo_file(args.data).read_text())
                runner.locomo(raw, ["turns"])
                report["locomo"] = meter.report()
    finally:
        cache.save()
        runner.cleanup()
    rows = [
        [
            name,
            r["searches"],
            r["rule_ms"]["p50"],
            r["rule_ms"]["p95"],
            r["rule_ms_max"],
            r["statement_share"],
            r["statement_ms"].get("p50", ""),
            r["reordered_share"],
            r["marked_share"],
        ]
        for name, r in [
            *[(f"knowledge {k}", v) for k, v in report["knowledge"].items()],
            *([("locomo dev, every mode", report["locomo"])] if "locomo" in report else []),
        ]
    ]
    harness.print_table(
        rows,
        [
            "set",
            "searches",
            "rule p50 ms",
            "p95",
            "max",
            "statement share",
            "its p50",
            "reordered",
            "marked",
        ],
    )
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
