"""Study an absolute relevance score for recall, to replace the per-query min-max one.

    python bench/calibration.py --data DIR --json calibration.json
    python bench/calibration.py --smoke

Today ``score`` (hybrid mode) is the candidates' cosine and BM25, each
min-max normalised over the candidate pool and averaged, then lifted by
neighbours: a lone match scores 0.0, and no two queries' scores compare.
This script stores LoCoMo dev turns (one namespace per conversation),
SciFact abstracts (one namespace) and the knowledge-update dev set (one
namespace) through ``remember``, reads every question's whole hybrid
candidate pool from the search's own statement (``search.statement``,
with the pool's ``coverage``: BM25 over the query's total IDF, the figure
the threshold already reads), and fits

    score = 1 / (1 + exp(-(A * similarity + B * coverage + C)))

with the neighbours' lift of ``recall_rank()`` (each of the 5 best lifts the
memories up to 2 places before and after it halfway to its own score)
applied to the linear part, before the logistic. Every term is the
memory's own, so the value means the same in any query and namespace. The
ratio B / A orders the results: it is chosen on a grid for LoCoMo hit@5 +
MRR@10 and SciFact nDCG@10 together; A and C then scale it: a logistic
regression with both classes weighted equally over the candidates
(relevant or not), so 0.5 is where relevant and unrelated are equally
likely, before any prior.

Reported: ranking by today's score and by the proposal (LoCoMo hit@5,
MRR@10, categories 1-4; SciFact nDCG@10; the knowledge set's hit@5), with
a two-fold check (fit on half the queries, score on the other half); and
the values the proposal gives: relevant matches (each one's own score is
what it would score alone in a namespace), unrelated best matches (each
benchmark's questions asked of another benchmark's namespace, where
nothing is relevant), and today's threshold (0.35 on similarity or
coverage) against thresholds on the new score.

The lift is re-applied from the pool's creation order, so a memory that
lifts in the proposal but was not among today's lifted neighbours is
missing from the pool (an approximation that can only cost the proposal).
"""

from __future__ import annotations

import argparse
import json
import pickle
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_ROOT = str(Path(__file__).resolve().parent.parent)
if sys.path[0] == str(Path(__file__).resolve().parent):
    sys.path[0] = _ROOT
elif _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

import numpy as np  # noqa: E402

from bench import corpus, harness  # noqa: E402
from bench import knowledge_set as ks  # noqa: E402
from bench.retrieval import Ranked, Runner, locomo_file, resolve  # noqa: E402

RATIOS = (0.0, 0.25, 0.5, 0.75, 0.9, 1.0, 1.1, 1.25, 1.5, 2.0, 3.0)
PROVIDERS, WINDOW, LIFT = 5, 2, 0.5  # as memories/search.py


@dataclass
class Query:
    """One question's whole candidate pool, as the hybrid statement saw it."""

    benchmark: str  # locomo, scifact, knowledge
    group: str  # conversation, or the benchmark
    ids: list[str]
    similarity: np.ndarray
    coverage: np.ndarray
    today: np.ndarray  # today's score (lift included)
    position: np.ndarray  # creation order within the namespace
    relevant: np.ndarray  # bool per candidate
    keys: list[frozenset[str]]  # what each candidate stands for
    wanted: set[str]  # the relevant keys
    category: int = 0


def pool(user_id: str, namespace: str, text: str) -> list[dict[str, Any]]:
    """Return every candidate of the hybrid search with its similarity, coverage and score."""
    from django.db import connection

    from core import tenancy
    from memories import search
    from memories.embeddings import cache

    args = search.SearchArgs(text, search.Filters(namespace), threshold=0.0, mode="hybrid")
    prepared = search.prepare(args, cache_scope=cache.scope(user_id, None))
    sql, params = search.statement(user_id, prepared, limit=1000)
    wider = sql.replace("r.similarity, r.score\n", "r.similarity, r.score, r.coverage\n", 1)
    assert wider != sql, "the hybrid statement changed: update bench/calibration.py"
    opening = search.transaction_settings(prepared)
    with tenancy.tenant(user_id, local_settings=opening), connection.cursor() as cursor:
        cursor.execute(wider, params)
        names = [c.name for c in cursor.description]
        rows = [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]
    return rows


def collect(
    runner: Runner,
    benchmark: str,
    group: str,
    user_id: str,
    namespace: str,
    order: dict[str, int],
    keys: dict[str, frozenset[str]],
    questions: Sequence[tuple[str, set[str], int]],
) -> list[Query]:
    out = []
    runner.warm(q for q, _, _ in questions)
    for text, wanted, category in questions:
        rows = pool(user_id, namespace, text)
        ids = [str(r["id"]) for r in rows]
        out.append(
            Query(
                benchmark,
                group,
                ids,
                np.array([float(r["similarity"]) for r in rows]),
                np.array([float(r["coverage"] or 0.0) for r in rows]),
                np.array([float(r["score"]) for r in rows]),
                np.array([order[i] for i in ids]),
                np.array([bool(keys[i] & wanted) for i in ids], dtype=bool),
                [keys[i] for i in ids],
                wanted,
                category,
            )
        )
    return out


# Scores and rankings ------------------------------------------------------------------


def logistic(z: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-z))


def absolute(q: Query, a: float, b: float, c: float) -> np.ndarray:
    """The proposal: a logistic of similarity and coverage, lifted by neighbours in logit space.

    The lift works on the linear part (each of the 5 best raises the memories
    within 2 places halfway to its own), then the logistic maps it to 0-1; so
    the ranking depends on B / A alone, and A and C only set what a value means.
    """
    own = a * q.similarity + b * q.coverage + c
    if not len(own):
        return own
    best = np.argsort(-own, kind="stable")[:PROVIDERS]
    lifted = own.copy()
    for p in best:
        near = np.abs(q.position - q.position[p]) <= WINDOW
        lifted = np.where(near, np.maximum(lifted, own + LIFT * (own[p] - own)), lifted)
    return logistic(lifted)


def ranked(q: Query, scores: np.ndarray, kept: np.ndarray | None = None) -> Ranked:
    order = sorted(range(len(q.ids)), key=lambda i: (-scores[i], -q.similarity[i], q.ids[i]))
    if kept is not None:
        order = [i for i in order if kept[i]]
    return Ranked([q.keys[i] for i in order], q.wanted)


def quality(queries: Sequence[Query], scorer: Any, keep: Any = None) -> dict[str, float]:
    """LoCoMo hit@5 and MRR@10 (1-4), SciFact nDCG@10, knowledge hit@5, for one scorer.

    ``keep(q, scores)``, when given, says which candidates pass a threshold.
    """
    out: dict[str, list[float]] = {}
    for q in queries:
        scores = scorer(q)
        r = ranked(q, scores, None if keep is None else keep(q, scores))
        if q.benchmark == "locomo":
            if q.category == 5:
                continue
            out.setdefault("locomo_hit@5", []).append(r.hit(5))
            out.setdefault("locomo_mrr@10", []).append(r.mrr(10))
        elif q.benchmark == "scifact":
            out.setdefault("scifact_ndcg@10", []).append(r.ndcg(10))
        else:
            out.setdefault("knowledge_hit@5", []).append(r.hit(5))
    return {k: round(float(np.mean(v)), 4) for k, v in out.items()}


def objective(figures: dict[str, float]) -> float:
    return (
        figures.get("locomo_hit@5", 0)
        + figures.get("locomo_mrr@10", 0)
        + 2 * figures.get("scifact_ndcg@10", 0)
    )


def fit_scale(queries: Sequence[Query], ratio: float) -> tuple[float, float]:
    """Fit A and C for z = similarity + ratio * coverage, both classes weighted equally."""
    z = np.concatenate([q.similarity + ratio * q.coverage for q in queries])
    y = np.concatenate([q.relevant for q in queries]).astype(float)
    weight = np.where(y == 1, 0.5 / max(y.sum(), 1), 0.5 / max((1 - y).sum(), 1))
    x = np.stack([z, np.ones_like(z)], axis=1)
    w = np.array([5.0, -3.0])
    ridge = np.diag([1e-4, 0.0])  # keeps the slope finite when the classes barely overlap
    for _ in range(200):  # Newton's method, weighted, with capped steps
        p = logistic(x @ w)
        gradient = x.T @ (weight * (p - y)) + ridge @ w
        hessian = x.T @ (x * (weight * p * (1 - p))[:, None]) + ridge + 1e-9 * np.eye(2)
        step = np.linalg.solve(hessian, gradient)
        step *= min(1.0, 5.0 / max(float(np.abs(step).max()), 1e-12))
        w -= step
        if np.abs(step).max() < 1e-10:
            break
    return float(w[0]), float(w[1])


def fit(queries: Sequence[Query]) -> dict[str, Any]:
    """Choose the ratio for ranking, then the scale and offset for calibration."""
    grid = []
    for ratio in RATIOS:
        scale, offset = fit_scale(queries, ratio)
        a, b, c = scale, scale * ratio, offset
        figures = quality(queries, lambda q, a=a, b=b, c=c: absolute(q, a, b, c))
        grid.append({"ratio": ratio, "A": a, "B": b, "C": c, **figures})
    best = max(grid, key=objective)
    return {"chosen": best, "grid": grid}


def values(queries: Sequence[Query], a: float, b: float, c: float) -> dict[str, Any]:
    """What the proposal's score says: relevant matches, best unrelated, by benchmark."""
    out: dict[str, Any] = {}
    for name in sorted({q.benchmark for q in queries}):
        mine = [q for q in queries if q.benchmark == name]
        own = [logistic(a * q.similarity + b * q.coverage + c) for q in mine]
        relevant = np.concatenate([s[q.relevant] for s, q in zip(own, mine, strict=True)])
        first = [
            float(s[q.relevant].max()) for s, q in zip(own, mine, strict=True) if q.relevant.any()
        ]
        out[name] = {
            "relevant_matches": len(relevant),
            "relevant_at_least_0.5": round(float((relevant >= 0.5).mean()), 4),
            "best_relevant_at_least_0.5": round(float(np.mean(np.array(first) >= 0.5)), 4),
            "relevant_percentiles": percentiles(relevant),
            "best_relevant_percentiles": percentiles(np.array(first)),
        }
    return out


def percentiles(x: np.ndarray) -> dict[str, float]:
    if not len(x):
        return {}
    return {f"p{p}": round(float(np.percentile(x, p)), 3) for p in (1, 5, 25, 50, 75, 95, 99)}


def unrelated(cross: dict[str, list[Query]], a: float, b: float, c: float) -> dict[str, Any]:
    """The best match's score when nothing in the namespace is relevant (cross-benchmark)."""
    out: dict[str, Any] = {}
    for label, pools in cross.items():
        kept = [q for q in pools if len(q.ids)]
        best = np.array(
            [float(logistic(a * q.similarity + b * q.coverage + c).max()) for q in kept]
        )
        out[label] = {
            "queries": len(kept),
            "proposal_best": percentiles(best),
            "proposal_best_at_least_0.5": round(float(np.mean(best >= 0.5)), 4),
            "today_best": percentiles(np.array([float(q.today.max()) for q in kept])),
            "best_similarity": percentiles(np.array([float(q.similarity.max()) for q in kept])),
        }
    return out


def cross_pools(
    runner: Runner, label: str, user_id: str, namespace: str, texts: list[str]
) -> list[Query]:
    """Pools of questions asked of a namespace where nothing is relevant to them."""
    runner.warm(texts)
    out = []
    for text in texts:
        rows = pool(user_id, namespace, text)
        out.append(
            Query(
                label,
                label,
                [str(r["id"]) for r in rows],
                np.array([float(r["similarity"]) for r in rows]),
                np.array([float(r["coverage"] or 0.0) for r in rows]),
                np.array([float(r["score"]) for r in rows]),
                np.zeros(len(rows), dtype=int),
                np.zeros(len(rows), dtype=bool),
                [frozenset() for _ in rows],
                set(),
            )
        )
    return out


def thresholds(queries: Sequence[Query], a: float, b: float, c: float) -> list[dict[str, Any]]:
    """Relevant kept and unrelated cut by today's threshold and by thresholds on the proposal."""
    s = np.concatenate([q.similarity for q in queries])
    cov = np.concatenate([q.coverage for q in queries])
    y = np.concatenate([q.relevant for q in queries]).astype(bool)
    new = logistic(a * s + b * cov + c)
    kept = (s >= 0.35) | (cov >= 0.35)
    rows = [
        {
            "rule": "today: similarity or coverage >= 0.35",
            "relevant_kept": round(float(kept[y].mean()), 4),
            "unrelated_cut": round(float((~kept)[~y].mean()), 4),
        }
    ]
    for t in (0.2, 0.3, 0.4, 0.5, 0.6):
        rows.append(
            {
                "rule": f"proposal >= {t}",
                "relevant_kept": round(float((new >= t)[y].mean()), 4),
                "unrelated_cut": round(float((new < t)[~y].mean()), 4),
            }
        )
    return rows


# Storing the benchmarks -------------------------------------------------------------------


def store_locomo(runner: Runner, raw: list[dict[str, Any]]) -> tuple[list[Query], list[Any]]:
    queries: list[Query] = []
    namespaces = []
    for conversation in corpus.parse_locomo(raw):
        user_id = runner.user(conversation.sample_id)
        # The metadata bench/retrieval.py stores: its strings are searched too.
        items = [
            (t.content, {"dia_id": t.dia_id, "session": t.session, "date": t.date})
            for t in conversation.turns
        ]
        ids = runner.store(user_id, "turns", items)
        keys: dict[str, frozenset[str]] = {}
        order: dict[str, int] = {}
        for n, (memory_id, turn) in enumerate(zip(ids, conversation.turns, strict=True)):
            keys[memory_id] = keys.get(memory_id, frozenset()) | {turn.dia_id}
            order.setdefault(memory_id, n)
        known = {t.dia_id for t in conversation.turns}
        questions = [
            (q.question, resolve(q.evidence) & known, q.category)
            for q in conversation.questions
            if resolve(q.evidence) & known
        ]
        queries += collect(
            runner, "locomo", conversation.sample_id, user_id, "turns", order, keys, questions
        )
        namespaces.append((user_id, "turns", [q.question for q in conversation.questions]))
        print(f"  locomo {conversation.sample_id}: {len(questions)} questions", flush=True)
    return queries, namespaces


def store_scifact(runner: Runner, data: corpus.SciFact) -> tuple[list[Query], Any]:
    user_id = runner.user("scifact")
    doc_ids = sorted(data.docs)
    ids = runner.store(user_id, "default", [(data.docs[d], {"doc_id": d}) for d in doc_ids])
    keys = {m: frozenset({str(d)}) for m, d in zip(ids, doc_ids, strict=True)}
    order = {m: n for n, m in enumerate(ids)}
    questions = [
        (data.claims[c], {str(d) for d in data.cited.get(c, set())}, 0)
        for c in sorted(data.claims)
        if data.cited.get(c)
    ]
    queries = collect(runner, "scifact", "scifact", user_id, "default", order, keys, questions)
    print(f"  scifact: {len(questions)} claims", flush=True)
    return queries, (user_id, "default", [data.claims[c] for c in sorted(data.claims)])


def store_knowledge(runner: Runner, split: ks.Split) -> tuple[list[Query], Any]:
    user_id = runner.user("knowledge")
    ids = runner.store(user_id, "ku", [(i.content, {}) for i in split.items])
    keys = {m: frozenset({i.key}) for m, i in zip(ids, split.items, strict=True)}
    order = {m: n for n, m in enumerate(ids)}
    questions = [(q.text, {q.target, *q.outdated}, 0) for q in split.questions]
    queries = collect(runner, "knowledge", "knowledge", user_id, "ku", order, keys, questions)
    return queries, (user_id, "ku", [q.text for q in split.questions])


# Main -------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Fit an absolute relevance score on LoCoMo, SciFact and the knowledge set.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--data", type=Path, help="Folder with locomo10(-dev).json and scifact/.")
    parser.add_argument("--smoke", action="store_true", help="Built-in samples, no data.")
    parser.add_argument("--cache", type=Path, default=corpus.DEFAULT_CACHE)
    parser.add_argument("--json", type=Path, help="Write the results here.")
    parser.add_argument(
        "--pools",
        type=Path,
        help="Keep the candidate pools in this file (a pickle; not data to share): read it "
        "instead of storing the benchmarks again when it exists.",
    )
    args = parser.parse_args(argv)
    if not args.smoke and args.data is None:
        parser.error("--data is required unless --smoke")

    started = time.monotonic()
    if args.pools and args.pools.exists():
        with args.pools.open("rb") as f:
            queries, cross = pickle.load(f)  # noqa: S301 (a file this script wrote)
        model = "(from --pools)"
    else:
        queries, cross, model = gather(args)
        if args.pools:
            with args.pools.open("wb") as f:
                pickle.dump((queries, cross), f)
    report: dict[str, Any] = {
        "command": "python bench/calibration.py "
        + " ".join(argv if argv is not None else sys.argv[1:]),
        "machine": harness.machine(),
        "model": model,
        **analyse(queries, cross),
    }
    report["seconds"] = round(time.monotonic() - started, 1)
    print_report(report)
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
        print(f"wrote {args.json}")
    return 0


def gather(args: argparse.Namespace) -> tuple[list[Query], dict[str, list[Query]], str]:
    """Store the three benchmarks and read every question's candidate pool."""
    harness.configure()
    from memories import embeddings

    real = embeddings.get_embedder()
    real.load()
    cache = corpus.EmbeddingCache(
        None if args.smoke else args.cache,
        f"{real.model_id}-{embeddings.BUNDLED_ONNX_SHA256[:12]}",
    )
    embedder = harness.cached_embedder(real, cache)
    runner = Runner(embedder, cache, prewarm=True)
    try:
        with harness.using_embedder(embedder):
            raw = (
                corpus.SMOKE_LOCOMO
                if args.smoke
                else json.loads(locomo_file(args.data).read_text())
            )
            locomo, locomo_spaces = store_locomo(runner, raw)
            data = corpus.smoke_scifact() if args.smoke else corpus.load_scifact(args.data)
            scifact, scifact_space = store_scifact(runner, data)
            knowledge, knowledge_space = store_knowledge(
                runner, ks.smoke("dev") if args.smoke else ks.load("dev")
            )
            talk, talk_ns, talk_questions = locomo_spaces[0]
            papers, papers_ns, claims = scifact_space
            cross = {
                "scifact claims in a LoCoMo conversation": cross_pools(
                    runner, "unrelated", talk, talk_ns, claims[:200]
                ),
                "LoCoMo questions in SciFact": cross_pools(
                    runner, "unrelated", papers, papers_ns, talk_questions[:200]
                ),
                "knowledge questions in a LoCoMo conversation": cross_pools(
                    runner, "unrelated", talk, talk_ns, knowledge_space[2]
                ),
            }
    finally:
        cache.save()
        runner.cleanup()
    return locomo + scifact + knowledge, cross, real.model_id


def analyse(queries: list[Query], cross: dict[str, list[Query]]) -> dict[str, Any]:
    report: dict[str, Any] = {"today": quality(queries, lambda q: q.today)}
    # The product's default threshold: similarity or coverage at least 0.35.
    report["today_at_its_threshold"] = quality(
        queries, lambda q: q.today, lambda q, _: (q.similarity >= 0.35) | (q.coverage >= 0.35)
    )
    fitted = fit(queries)
    best = fitted["chosen"]
    a, b, c = best["A"], best["B"], best["C"]
    report["proposal"] = {
        "A": round(a, 3),
        "B": round(b, 3),
        "C": round(c, 3),
        **{k: v for k, v in best.items() if k not in ("A", "B", "C")},
    }
    report["grid"] = fitted["grid"]
    report["proposal_at_threshold"] = {
        str(t): quality(
            queries,
            lambda q, a=a, b=b, c=c: absolute(q, a, b, c),
            lambda q, scores, t=t: scores >= t,
        )
        for t in (0.1, 0.2, 0.3, 0.5)
    }
    report["two_fold"] = two_fold(queries)
    report["values"] = values(queries, a, b, c)
    report["thresholds"] = thresholds(queries, a, b, c)
    report["unrelated"] = unrelated(cross, a, b, c)
    report["lone_match_examples"] = {
        f"similarity {s}, coverage {cv}": round(float(logistic(a * s + b * cv + c)), 3)
        for s, cv in ((0.6, 0.0), (0.6, 1.0), (0.45, 0.5), (0.3, 0.0), (0.8, 1.0))
    }
    return report


def two_fold(queries: Sequence[Query]) -> list[dict[str, Any]]:
    """Fit on even-numbered queries, score on odd ones, and the other way round."""
    out = []
    for part in (0, 1):
        train = [q for n, q in enumerate(queries) if n % 2 == part]
        held = [q for n, q in enumerate(queries) if n % 2 != part]
        best = fit(train)["chosen"]
        a, b, c = best["A"], best["B"], best["C"]
        out.append(
            {
                "fitted_on": "even" if part == 0 else "odd",
                "ratio": best["ratio"],
                "held_out_today": quality(held, lambda q: q.today),
                "held_out_proposal": quality(held, lambda q, a=a, b=b, c=c: absolute(q, a, b, c)),
            }
        )
    return out


def print_report(report: dict[str, Any]) -> None:
    p = report["proposal"]
    print(
        f"\nproposal: score = 1 / (1 + exp(-({p['A']} * similarity + {p['B']} * coverage "
        f"+ {p['C']}))), then the neighbours' lift"
    )
    rows = [
        ["today, threshold 0", *report["today"].values()],
        ["today, its threshold", *report["today_at_its_threshold"].values()],
        ["proposal, threshold 0", *(p[k] for k in report["today"])],
        *(
            [f"proposal, score >= {t}", *figures.values()]
            for t, figures in report["proposal_at_threshold"].items()
        ),
    ]
    harness.print_table(rows, ["ranking", *report["today"].keys()])
    for fold in report["two_fold"]:
        print(f"  two-fold, fitted on {fold['fitted_on']} (ratio {fold['ratio']}):")
        print(f"    held out, today:    {fold['held_out_today']}")
        print(f"    held out, proposal: {fold['held_out_proposal']}")
    for name, v in report["values"].items():
        print(
            f"  {name}: relevant matches >= 0.5: {v['relevant_at_least_0.5']:.1%}; best relevant "
            f">= 0.5: {v['best_relevant_at_least_0.5']:.1%}; best relevant "
            f"{v['best_relevant_percentiles']}"
        )
    for name, v in report["unrelated"].items():
        print(
            f"  unrelated, {name}: best match >= 0.5: {v['proposal_best_at_least_0.5']:.1%}; "
            f"{v['proposal_best']} (today {v['today_best']})"
        )
    for row in report["thresholds"]:
        print(
            f"  {row['rule']}: relevant kept {row['relevant_kept']:.1%}, "
            f"unrelated cut {row['unrelated_cut']:.1%}"
        )
    print(f"  lone matches: {report['lone_match_examples']}")


if __name__ == "__main__":
    sys.exit(main())
