"""Measure retrieval quality through the product's own path: remember, then recall.

    python bench/retrieval.py --data DIR --json retrieval.json
    python bench/retrieval.py --data DIR --benchmarks locomo --cross-validate
    python bench/retrieval.py --smoke      # seconds, built-in sample, no data

LoCoMo (``locomo10.json``, else ``locomo10-dev.json``): every turn becomes a
memory of its conversation's tenant, content ``"<speaker>: <text>"``, with the
dia_id, session and session date in metadata. Each question is a ``recall``
(limit 50); a retrieved memory is relevant when its turn's dia_id is in the
question's evidence. Rows:

- ``turns``: exactly what the product's default ``recall`` does: the server's
  search mode (``RECALL_SEARCH_MODE``) and the model's default threshold;
- ``turns+hybrid``, ``turns+semantic``, ``turns+lexical``: each search mode,
  at the default threshold.

Reported per category (1-4), overall over 1-4, and for category 5
(adversarial) on its own:

- ``recall@k``: the fraction of a question's evidence turns found in the top
  k, averaged over questions. This is mcp-memory-service's "R@k" definition
  (scripts/benchmarks/locomo_evaluator.py, ``recall_at_k``);
- ``hit@k``: the share of questions with at least one evidence turn in the top
  k (what some peers call recall_any@k);
- ``mrr``: 1 / rank of the first evidence turn within the 50, else 0;
  ``mrr@10`` the same within the first 10;
- ``nDCG@10``: binary relevance, ideal DCG over min(|evidence|, 10) hits.

``--cross-validate`` then re-ranks the LoCoMo turns under every setting of
the hybrid ranking's constants in ``GRID`` and chooses them by
leave-one-conversation-out: for each conversation, the setting best on the
others (hit@5 + MRR@10, categories 1-4) is scored on it. The pooled held-out
figure is what to expect on conversations the constants never saw.

SciFact: every abstract (title and abstract) becomes a memory of one tenant;
each training claim is a query, relevant documents are its ``cited_doc_ids``.
Rows per mode (``default``; ``hybrid``; ``dense``, the semantic mode; ``bm25``,
the lexical mode), each from ``recall`` (limit 50), and recall@100 from the
same search's statement (``search.statement``) read 100 deep, because the
service caps limit at 50.

Latency is the service call per mode, with the query embedding cached (so
excluded). LoCoMo content variants (``--variants``): ``caption`` appends the
image caption to turns that share a photo, ``date`` prefixes the session
date, and ``observations`` stores the dataset's per-session observations (the
facts mcp-memory-service's harness ingests) instead of turns.

Embeddings are cached by text under ``--cache`` (``--no-cache`` to run the
model for every call); a cached vector is the one the model returned for that
text, so the results are those of the uncached path.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import re
import sys
import time
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from memories.services import Recalled

# Run as a script, Python puts bench/ first on sys.path, where bench/http.py
# would shadow the standard library's http; the project root goes there instead.
_ROOT = str(Path(__file__).resolve().parent.parent)
if sys.path[0] == str(Path(__file__).resolve().parent):
    sys.path[0] = _ROOT
elif _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

from bench import corpus, harness, similarity  # noqa: E402

KS = (1, 5, 10, 50)
LOCOMO_VARIANTS = ("turns", "caption", "date", "observations")
MODES = ("hybrid", "semantic", "lexical")
_DIA = re.compile(r"D:?(\d+):(\d+)")
# The hybrid ranking's constants (memories/search.py) that --cross-validate
# chooses among; every combination, BM25's (k1, b) pairs being Anserini's and
# Lucene's defaults. The two signals' weights are the score's
# (memories/scoring.py), fitted by bench/calibration.py.
GRID: dict[str, tuple[Any, ...]] = {
    "K1_B": ((0.9, 0.4), (1.2, 0.75)),
    "LIFT": (0.0, 0.25, 0.5, 0.75),
    "WINDOW": (1, 2),
}


DATA_HELP = """\
data (not in this repository: both licences forbid commercial use):
  locomo10.json   LoCoMo, CC BY-NC 4.0: data/locomo10.json of
                  github.com/snap-research/LoCoMo (sha256 79fa87e9...8ff4).
                  A locomo10-dev.json with only some conversations is used
                  when the full file is absent.
  scifact/        SciFact, CC BY-NC 2.0 (github.com/allenai/scifact), as CSV:
                  corpus.csv (doc_id, title, abstract, structured) and
                  claims_train.csv (id, claim, ..., cited_doc_ids).
"""


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    pass


def locomo_file(data: Path) -> Path:
    """Return the full LoCoMo file if the folder has it, else the dev subset."""
    full = data / "locomo10.json"
    return full if full.exists() else data / "locomo10-dev.json"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Retrieval quality of remember/recall on LoCoMo and SciFact.",
        epilog=DATA_HELP,
        formatter_class=_HelpFormatter,
    )
    parser.add_argument(
        "--data",
        type=Path,
        help="Folder holding locomo10.json (or locomo10-dev.json) and scifact/.",
    )
    parser.add_argument("--smoke", action="store_true", help="Built-in tiny sample, no data.")
    parser.add_argument(
        "--benchmarks", default="locomo,scifact", help="Comma-separated: locomo, scifact."
    )
    parser.add_argument(
        "--variants",
        default="turns",
        help=f"LoCoMo memory contents, comma-separated from {', '.join(LOCOMO_VARIANTS)}.",
    )
    parser.add_argument(
        "--cache", type=Path, default=corpus.DEFAULT_CACHE, help="Embedding cache directory."
    )
    parser.add_argument("--no-cache", action="store_true", help="Run the model for every call.")
    parser.add_argument(
        "--cross-validate",
        action="store_true",
        help="Also choose the hybrid ranking's constants by leave-one-conversation-out "
        "on the LoCoMo turns, and score the choice on the held-out conversations.",
    )
    parser.add_argument("--workdir", type=Path, help="Where the throwaway database lives.")
    parser.add_argument("--database-url", help="Use this (scratch!) database instead.")
    parser.add_argument("--json", type=Path, help="Write the results here.")
    args = parser.parse_args(argv)
    if not args.smoke and args.data is None:
        parser.error("--data is required unless --smoke")
    benchmarks = [b.strip() for b in args.benchmarks.split(",") if b.strip()]
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    for variant in variants:
        if variant not in LOCOMO_VARIANTS:
            parser.error(f"unknown variant {variant!r}")

    started = time.monotonic()
    where = harness.configure(args.database_url, args.workdir)
    from django.conf import settings

    from memories import embeddings

    real = embeddings.get_embedder()
    real.load()
    cache = corpus.EmbeddingCache(
        None if (args.smoke or args.no_cache) else args.cache,
        f"{real.model_id}-{embeddings.BUNDLED_ONNX_SHA256[:12]}",
    )
    embedder = real if args.no_cache else harness.cached_embedder(real, cache)
    report: dict[str, Any] = {
        "command": "python bench/retrieval.py "
        + " ".join(argv if argv is not None else sys.argv[1:]),
        "machine": harness.machine(),
        "database": {"where": where, **harness.database_versions()},
        "model": real.model_id,
        "default_threshold": default_threshold(),
        "model_similarity_threshold": real.default_threshold,
        "default_mode": settings.RECALL_SEARCH_MODE,
    }
    runner = Runner(embedder, cache, prewarm=not args.no_cache)
    try:
        with harness.using_embedder(embedder):
            if "locomo" in benchmarks:
                raw = (
                    corpus.SMOKE_LOCOMO
                    if args.smoke
                    else json.loads(locomo_file(args.data).read_text())
                )
                report["locomo"] = runner.locomo(raw, variants)
                report["locomo"]["file"] = "smoke" if args.smoke else locomo_file(args.data).name
                if args.cross_validate:
                    report["cross_validation"] = runner.cross_validate()
            if "scifact" in benchmarks:
                data = corpus.smoke_scifact() if args.smoke else corpus.load_scifact(args.data)
                report["scifact"] = runner.scifact(data)
    finally:
        cache.save()
        runner.cleanup()
    report["similarity"] = {
        name: similarity.summarise(scores)
        for name, scores in runner.similarities.items()
        if scores["related"] and scores["unrelated"]
    }
    report["default_threshold_effect"] = {
        name: average(rows) for name, rows in runner.threshold_rows.items()
    }
    report["latency_ms"] = {
        name: {mode: harness.percentiles(times) for mode, times in by_mode.items()}
        for name, by_mode in runner.latencies.items()
    }
    report["seconds"] = round(time.monotonic() - started, 1)
    print_report(report)
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
        print(f"wrote {args.json}")
    return 0


# Metrics ---------------------------------------------------------------------------


@dataclass
class Ranked:
    """One query's ranked results, each result the set of evidence keys it stands for."""

    results: list[frozenset[str]]
    relevant: set[str]
    similarities: list[float] = field(default_factory=list)

    def first_rank(self) -> int | None:
        for rank, keys in enumerate(self.results, start=1):
            if keys & self.relevant:
                return rank
        return None

    def recall(self, k: int) -> float:
        found: set[str] = set()
        for keys in self.results[:k]:
            found |= keys & self.relevant
        return len(found) / len(self.relevant)

    def hit(self, k: int) -> float:
        rank = self.first_rank()
        return 1.0 if rank is not None and rank <= k else 0.0

    def mrr(self, k: int | None = None) -> float:
        rank = self.first_rank()
        return 1.0 / rank if rank and (k is None or rank <= k) else 0.0

    def ndcg(self, k: int = 10) -> float:
        dcg = sum(
            1.0 / math.log2(rank + 1)
            for rank, keys in enumerate(self.results[:k], start=1)
            if keys & self.relevant
        )
        ideal = sum(1.0 / math.log2(rank + 1) for rank in range(1, min(len(self.relevant), k) + 1))
        return dcg / ideal

    def metrics(self, ks: Iterable[int] = KS) -> dict[str, float]:
        out: dict[str, float] = {}
        for k in ks:
            out[f"recall@{k}"] = self.recall(k)
            out[f"hit@{k}"] = self.hit(k)
        out["mrr"] = self.mrr()
        out["mrr@10"] = self.mrr(10)
        out["ndcg@10"] = self.ndcg(10)
        return out


def average(rows: Sequence[dict[str, float]]) -> dict[str, float]:
    if not rows:
        return {"questions": 0}
    out = {key: round(sum(r[key] for r in rows) / len(rows), 4) for key in rows[0]}
    out["questions"] = len(rows)
    return out


# The runs ----------------------------------------------------------------------------


class Runner:
    def __init__(self, embedder: Any, cache: corpus.EmbeddingCache, *, prewarm: bool) -> None:
        self.embedder = embedder
        self.cache = cache
        self.prewarm = prewarm
        self.users: list[str] = []
        # Similarity of the retrieved results, relevant or not (semantic, threshold 0).
        self.similarities: dict[str, dict[str, list[float]]] = {}
        # What the default path returns: per benchmark, per question.
        self.threshold_rows: dict[str, list[dict[str, float]]] = defaultdict(list)
        # Service-call milliseconds, per benchmark and mode.
        self.latencies: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
        # The LoCoMo turns as stored, for --cross-validate.
        self.stored: list[Conversation] = []

    def cleanup(self) -> None:
        from accounts.models import User
        from core import tenancy

        with tenancy.operator():
            User.objects.filter(id__in=self.users).delete()

    def user(self, label: str) -> str:
        from accounts.models import User

        slug = re.sub(r"[^a-z0-9]+", "-", label.lower())
        email = f"bench-retrieval-{slug}-{time.time_ns()}@example.com"
        user = User.objects.create_user(email)
        self.users.append(str(user.id))
        return str(user.id)

    def warm(self, texts: Iterable[str]) -> None:
        """Fill the cache in batches: the same vectors remember() would compute one by one."""
        if not self.prewarm:
            return
        from memories import validation

        real = getattr(self.embedder, "wrapped", self.embedder)
        corpus.embed_texts(
            real, [validation.normalize(t) for t in texts], self.cache, progress="embedding"
        )

    def store(
        self, user_id: str, namespace: str, items: list[tuple[str, dict[str, Any]]]
    ) -> list[str]:
        """remember() every (content, metadata); return the memory id of each."""
        from memories import services

        self.warm(content for content, _ in items)
        ids = []
        for content, metadata in items:
            result = services.remember(
                user_id=user_id,
                tier="pro",
                content=content,
                namespace=namespace,
                metadata=metadata,
            )
            ids.append(result["id"])
        return ids

    def recall(
        self,
        benchmark: str,
        user_id: str,
        namespace: str,
        query: str,
        mode: str | None = None,
        threshold: float | None = None,
    ) -> list[Recalled]:
        """Call recall as a client would (limit 50), timing it under ``benchmark``."""
        from memories import services

        started = time.perf_counter()
        found = services.recall(
            user_id=user_id,
            query=query,
            namespace=namespace,
            limit=50,
            mode=mode,
            threshold=threshold,
        )
        if threshold is None:
            elapsed = (time.perf_counter() - started) * 1000.0
            self.latencies[benchmark][mode or "default"].append(elapsed)
        return found

    def ranked(
        self, benchmark: str, user_id: str, namespace: str, query: str
    ) -> dict[str, list[Recalled]]:
        """Return the default path's results and each mode's, at the default threshold."""
        from django.conf import settings

        out = {mode: self.recall(benchmark, user_id, namespace, query, mode) for mode in MODES}
        # The default path is the configured mode's call with no mode given;
        # it is timed, and must find what that mode found.
        out["default"] = self.recall(benchmark, user_id, namespace, query)
        assert [r["id"] for r in out["default"]] == [
            r["id"] for r in out[settings.RECALL_SEARCH_MODE]
        ]
        return out

    # LoCoMo ---------------------------------------------------------------------------

    def locomo(self, raw: list[dict[str, Any]], variants: list[str]) -> dict[str, Any]:
        conversations = corpus.parse_locomo(raw)
        observations = {item["sample_id"]: item.get("observation", {}) for item in raw}
        captions = {
            (item["sample_id"], turn["dia_id"]): turn.get("blip_caption", "")
            for item in raw
            for key, session in item["conversation"].items()
            if re.fullmatch(r"session_\d+", key)
            for turn in session
        }
        per_variant: dict[str, dict[str, list[dict[str, float]]]] = {}
        unresolved = excluded = 0
        for conversation in conversations:
            user_id = self.user(conversation.sample_id)
            known = {turn.dia_id for turn in conversation.turns}
            bodies = {
                v: self.locomo_memories(conversation, v, observations, captions) for v in variants
            }
            self.warm(q.question for q in conversation.questions)
            for variant, items in bodies.items():
                started = time.monotonic()
                ids = self.store(user_id, variant, [(content, meta) for content, meta, _ in items])
                keys: dict[str, set[str]] = defaultdict(set)
                for memory_id, (_, _, dia_ids) in zip(ids, items, strict=True):
                    # Identical contents are one memory (deduplication): it stands for both.
                    keys[memory_id].update(dia_ids)
                questions = []
                for question in conversation.questions:
                    evidence = resolve(question.evidence)
                    if variant == variants[0]:
                        unresolved += len(evidence - known)
                    evidence &= known
                    if not evidence:
                        excluded += variant == variants[0]
                        continue
                    questions.append((question, evidence))
                    by_mode = self.ranked("locomo", user_id, variant, question.question)
                    for mode, found in by_mode.items():
                        name = variant if mode == "default" else f"{variant}+{mode}"
                        result = Ranked([frozenset(keys[r["id"]]) for r in found], evidence)
                        row = result.metrics()
                        # Turns do not replace each other: an evidence turn in the top 5
                        # marked may_be_replaced_by (memories/ordering.py) is a wrong mark.
                        row["evidence_marked@5"] = float(
                            any(
                                r.get("may_be_replaced_by") and keys[r["id"]] & evidence
                                for r in found[:5]
                            )
                        )
                        bucket = per_variant.setdefault(name, defaultdict(list))
                        bucket[str(question.category)].append(row)
                    if variant == "turns" and question.category != 5:
                        self.record(
                            "locomo", user_id, variant, question.question, by_mode, keys, evidence
                        )
                if variant == "turns":
                    self.stored.append(
                        Conversation(conversation.sample_id, user_id, keys, questions)
                    )
                print(
                    f"  locomo {conversation.sample_id} {variant}: {len(items)} memories, "
                    f"{len(conversation.questions)} questions, {time.monotonic() - started:.0f} s",
                    flush=True,
                )
        out: dict[str, Any] = {
            "questions_without_evidence": excluded,
            "evidence_refs_not_found": unresolved,
        }
        for name, buckets in per_variant.items():
            main = [row for cat in ("1", "2", "3", "4") for row in buckets.get(cat, [])]
            everything = main + buckets.get("5", [])
            out[name] = {
                "overall_1_4": average(main),
                "by_category": {cat: average(rows) for cat, rows in sorted(buckets.items())},
                "category_5": average(buckets.get("5", [])),
                # mcp-memory-service averages over every category, 5 included.
                "all_categories": average(everything),
            }
        return out

    def locomo_memories(
        self,
        conversation: corpus.Conversation,
        variant: str,
        observations: dict[str, Any],
        captions: dict[tuple[str, str], str],
    ) -> list[tuple[str, dict[str, Any], set[str]]]:
        """Return (content, metadata, dia_ids it stands for) per memory to store."""
        items: list[tuple[str, dict[str, Any], set[str]]] = []
        if variant == "observations":
            for key, by_speaker in observations.get(conversation.sample_id, {}).items():
                session = int(re.findall(r"\d+", key)[0])
                for facts in by_speaker.values():
                    for fact in facts:
                        text, refs = fact[0], fact[1] if len(fact) > 1 else ""
                        dia_ids = resolve([refs] if isinstance(refs, str) else refs)
                        items.append((text, {"session": session}, dia_ids))
            return items
        for turn in conversation.turns:
            content = turn.content
            if variant == "caption":
                caption = captions.get((conversation.sample_id, turn.dia_id))
                if caption:
                    content = f"{content} [shares a photo: {caption}]"
            elif variant == "date":
                content = f"[{turn.date}] {content}"
            metadata = {"dia_id": turn.dia_id, "session": turn.session, "date": turn.date}
            items.append((content, metadata, {turn.dia_id}))
        return items

    # Cross-validation -----------------------------------------------------------------

    def cross_validate(self) -> dict[str, Any]:
        """Choose the hybrid constants leaving each conversation out; score it on that one."""
        from memories import search

        settings_grid = grid_settings()
        scores: list[list[list[dict[str, float]]]] = []  # setting -> conversation -> rows
        saved = {name: getattr(search, name) for name in ("K1", "B", "LIFT", "WINDOW")}
        started = time.monotonic()
        try:
            for n, setting in enumerate(settings_grid, start=1):
                for name, value in setting.items():
                    setattr(search, name, value)
                per_conversation = []
                for conversation in self.stored:
                    rows = []
                    for question, evidence in conversation.questions:
                        if question.category == 5:
                            continue
                        found = self.recall(
                            "cross-validation",
                            conversation.user_id,
                            "turns",
                            question.question,
                            "hybrid",
                        )
                        ranked = [frozenset(conversation.keys[r["id"]]) for r in found]
                        rows.append(Ranked(ranked, evidence).metrics((5, 10)))
                    per_conversation.append(rows)
                scores.append(per_conversation)
                print(
                    f"  cross-validation {n}/{len(settings_grid)} {setting}: "
                    f"{average([r for rows in per_conversation for r in rows])}",
                    flush=True,
                )
        finally:
            for name, value in saved.items():
                setattr(search, name, value)
        return choose_by_leaving_one_out(
            settings_grid, scores, [c.sample_id for c in self.stored], saved, started
        )

    # SciFact --------------------------------------------------------------------------

    def scifact(self, data: corpus.SciFact) -> dict[str, Any]:
        started = time.monotonic()
        user_id = self.user("scifact")
        doc_ids = sorted(data.docs)
        ids = self.store(user_id, "default", [(data.docs[d], {"doc_id": d}) for d in doc_ids])
        keys = {memory_id: frozenset({str(d)}) for memory_id, d in zip(ids, doc_ids, strict=True)}
        print(f"  scifact: {len(ids)} memories, {time.monotonic() - started:.0f} s", flush=True)
        claims = sorted(data.claims)
        self.warm(data.claims[c] for c in claims)
        rows: dict[str, list[dict[str, float]]] = defaultdict(list)
        # The modes under the names this report has always used.
        names = {"default": "default", "hybrid": "hybrid", "semantic": "dense", "lexical": "bm25"}
        skipped = 0
        for claim in claims:
            relevant = {str(d) for d in data.cited.get(claim, set()) if d in data.docs}
            if not relevant:
                skipped += 1
                continue
            text = data.claims[claim]
            by_mode = self.ranked("scifact", user_id, "default", text)
            for mode, found in by_mode.items():
                metrics = Ranked([keys[r["id"]] for r in found], relevant).metrics((1, 5, 10, 50))
                hundred = self.deep(user_id, text, None if mode == "default" else mode)
                metrics["recall@100"] = Ranked([keys[i] for i in hundred], relevant).recall(100)
                rows[names[mode]].append(metrics)
            self.record("scifact", user_id, "default", text, by_mode, keys, relevant)
        out: dict[str, Any] = {name: average(r) for name, r in rows.items()}
        out["claims_without_relevant_docs"] = skipped
        out["seconds"] = round(time.monotonic() - started, 1)
        return out

    def deep(self, user_id: str, query: str, mode: str | None) -> list[str]:
        """Return the ids the search's own statement ranks first, 100 deep."""
        from core import tenancy
        from memories import search
        from memories.embeddings.cache import scope

        prepared = search.prepare(
            search.SearchArgs.parse(query=query, namespace="default", mode=mode),
            cache_scope=scope(user_id),
        )
        with tenancy.tenant(user_id, local_settings=search.SEARCH_SETTINGS):
            return [str(hit.memory.id) for hit in search.run(user_id, prepared, limit=100)]

    # Similarities and the default threshold ------------------------------------------

    def record(
        self,
        name: str,
        user_id: str,
        namespace: str,
        query: str,
        by_mode: Mapping[str, Sequence[Recalled]],
        keys: Mapping[str, Any],
        relevant: set[str],
    ) -> None:
        """Keep the similarities of the nearest 50 and what the default path returned."""
        nearest = self.recall(name, user_id, namespace, query, "semantic", threshold=0)
        scores = self.similarities.setdefault(name, {"related": [], "unrelated": []})
        for result in nearest:
            kind = "related" if keys[result["id"]] & relevant else "unrelated"
            scores[kind].append(float(result["similarity"]))
        for mode, found in by_mode.items():
            ranked = Ranked([frozenset(keys[r["id"]]) for r in found], relevant)
            self.threshold_rows[f"{name} {mode}"].append(
                {
                    "empty": 0.0 if found else 1.0,
                    "returned": float(len(found)),
                    "below_threshold": float(
                        sum(r["similarity"] < self.embedder.default_threshold for r in found)
                    ),
                    "hit@5": ranked.hit(5),
                    "recall@5": ranked.recall(5),
                }
            )


@dataclass
class Conversation:
    sample_id: str
    user_id: str
    keys: Mapping[str, Any]  # memory id -> dia_ids it stands for
    questions: list[tuple[corpus.Question, set[str]]]


def default_threshold() -> float:
    from memories import search

    return search.default_threshold()


def grid_settings() -> list[dict[str, Any]]:
    """Every combination of GRID, once each (the window means nothing without a lift)."""
    out = []
    for (k1, b), lift, window in itertools.product(*GRID.values()):
        if lift == 0 and window != GRID["WINDOW"][0]:
            continue
        out.append({"K1": k1, "B": b, "LIFT": lift, "WINDOW": window})
    return out


def choose_by_leaving_one_out(
    settings_grid: list[dict[str, Any]],
    scores: list[list[list[dict[str, float]]]],
    samples: list[str],
    shipped: dict[str, Any],
    started: float,
) -> dict[str, Any]:
    """For each conversation, pick the setting best on the others and score it there."""

    def objective(rows: list[dict[str, float]]) -> float:
        summary = average(rows)
        return summary["hit@5"] + summary["mrr@10"] if rows else 0.0

    folds, held_out = [], []
    for fold, sample in enumerate(samples):
        best = max(
            range(len(settings_grid)),
            key=lambda i: objective(
                [row for c, rows in enumerate(scores[i]) if c != fold for row in rows]
            ),
        )
        held_out += scores[best][fold]
        folds.append(
            {
                "held_out": sample,
                "chosen": settings_grid[best],
                "score": average(scores[best][fold]),
            }
        )
    everywhere = [
        {"setting": setting, "dev": average([r for rows in scores[i] for r in rows])}
        for i, setting in enumerate(settings_grid)
    ]
    everywhere.sort(key=lambda item: -(item["dev"]["hit@5"] + item["dev"]["mrr@10"]))
    return {
        "grid": GRID,
        "shipped": shipped,
        "folds": folds,
        "pooled_held_out": average(held_out),
        "best_on_dev": everywhere[:5],
        "seconds": round(time.monotonic() - started, 1),
    }


def resolve(evidence: Iterable[str]) -> set[str]:
    """Return the dia_ids named in evidence entries, tolerating "D8:6; D9:17" and "D:11:26"."""
    found = set()
    for entry in evidence:
        for session, turn in _DIA.findall(str(entry)):
            found.add(f"D{int(session)}:{int(turn)}")
    return found


# Output -------------------------------------------------------------------------------


def print_report(report: dict[str, Any]) -> None:
    locomo = report.get("locomo")
    if locomo:
        print(
            f"\nLoCoMo ({report['model']}, default mode {report['default_mode']}, threshold "
            f"{report['default_threshold']}); questions without resolvable evidence: "
            f"{locomo['questions_without_evidence']}"
        )
        rows = []
        for name, result in locomo.items():
            if not isinstance(result, dict):
                continue
            for label, metrics in (
                ("1-4", result["overall_1_4"]),
                *((f"cat {c}", m) for c, m in result["by_category"].items()),
                ("all 1-5", result["all_categories"]),
            ):
                rows.append(
                    [
                        name,
                        label,
                        metrics["questions"],
                        metrics["recall@5"],
                        metrics["recall@10"],
                        metrics["hit@5"],
                        metrics["hit@10"],
                        metrics["mrr@10"],
                        metrics["mrr"],
                        metrics["ndcg@10"],
                    ]
                )
        harness.print_table(
            rows,
            ["rows", "slice", "n", "R@5", "R@10", "hit@5", "hit@10", "MRR@10", "MRR", "nDCG@10"],
        )
    folds = report.get("cross_validation")
    if folds:
        print("\nLeave-one-conversation-out choice of the hybrid constants (categories 1-4)")
        rows = [
            [
                fold["held_out"],
                " ".join(f"{k}={v}" for k, v in fold["chosen"].items()),
                fold["score"]["hit@5"],
                fold["score"]["mrr@10"],
            ]
            for fold in folds["folds"]
        ]
        pooled = folds["pooled_held_out"]
        rows.append(["pooled", "", pooled["hit@5"], pooled["mrr@10"]])
        harness.print_table(rows, ["held out", "chosen on the others", "hit@5", "MRR@10"])
    scifact = report.get("scifact")
    if scifact:
        print(f"\nSciFact train claims ({report['model']})")
        rows = [
            [
                name,
                m["questions"],
                m["ndcg@10"],
                m["recall@10"],
                m.get("recall@100", "-"),
                m["mrr"],
            ]
            for name, m in scifact.items()
            if isinstance(m, dict)
        ]
        harness.print_table(rows, ["ranking", "n", "nDCG@10", "R@10", "R@100", "MRR"])
    for name, summary in report.get("similarity", {}).items():
        similarity.print_summary(f"{name}: retrieved results (top 50, semantic)", summary)
    threshold = report["default_threshold"]
    for name, effect in report.get("default_threshold_effect", {}).items():
        print(
            f"\n{name} at the default threshold {threshold}: {effect['empty']:.1%} of queries "
            f"get nothing, {effect['returned']:.1f} of 50 returned on average "
            f"({effect['below_threshold']:.1f} below the model's similarity threshold), "
            f"recall@5 {effect['recall@5']:.3f}, hit@5 {effect['hit@5']:.3f}"
        )
    latency = report.get("latency_ms", {})
    if latency:
        print("\nrecall latency, ms (service call, query embedding cached)")
        rows = [
            [name, mode, t["n"], t["p50"], t["p95"]]
            for name, by_mode in latency.items()
            for mode, t in by_mode.items()
            if t.get("n")
        ]
        harness.print_table(rows, ["benchmark", "mode", "n", "p50", "p95"])
    print(f"\ndone in {report['seconds']:.0f} s")


if __name__ == "__main__":
    sys.exit(main())
