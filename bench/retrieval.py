"""Measure retrieval quality through the product's own path: remember, then recall.

    python bench/retrieval.py --data DIR --json retrieval.json
    python bench/retrieval.py --smoke      # seconds, built-in sample, no data

LoCoMo (``locomo10-dev.json``): every turn becomes a memory of its
conversation's tenant, content ``"<speaker>: <text>"``, with the dia_id,
session and session date in metadata. Each question is a ``recall`` (limit 50,
threshold 0); a retrieved memory is relevant when its turn's dia_id is in the
question's evidence. Reported per category (1-4), overall over 1-4, and for
category 5 (adversarial) on its own:

- ``recall@k``: the fraction of a question's evidence turns found in the top
  k, averaged over questions. This is mcp-memory-service's "R@k" definition
  (scripts/benchmarks/locomo_evaluator.py, ``recall_at_k``);
- ``hit@k``: the share of questions with at least one evidence turn in the top
  k (what some peers call recall_any@k);
- ``MRR``: 1 / rank of the first evidence turn within the 50, else 0;
- ``nDCG@10``: binary relevance, ideal DCG over min(|evidence|, 10) hits.

SciFact: every abstract (title and abstract) becomes a memory of one tenant;
each training claim is a query, relevant documents are its ``cited_doc_ids``.
nDCG@10 and MRR come from ``recall`` (limit 50), recall@100 from the SQL that
``recall`` runs (``services.nearest_sql``), called with limit 100 because the
service caps limit at 50.

Besides the product's dense ranking (``dense``), two prototypes are measured
to size what would close a gap; neither is in the product:

- ``hybrid``: dense top 50 fused with BM25 top 50 over the same memories by
  reciprocal rank fusion (k = 60);
- LoCoMo content variants (``--variants``): ``caption`` appends the image
  caption to turns that share a photo, ``date`` prefixes the session date, and
  ``observations`` stores the dataset's per-session observations (the facts
  mcp-memory-service's harness ingests) instead of turns.

Embeddings are cached by text under ``--cache`` (``--no-cache`` to run the
model for every call); a cached vector is the one the model returned for that
text, so the results are those of the uncached path.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Run as a script, Python puts bench/ first on sys.path, where bench/http.py
# would shadow the standard library's http; the project root goes there instead.
_ROOT = str(Path(__file__).resolve().parent.parent)
if sys.path[0] == str(Path(__file__).resolve().parent):
    sys.path[0] = _ROOT
elif _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

from bench import corpus, harness, similarity  # noqa: E402

KS = (1, 5, 10, 50)
RRF_K = 60
LOCOMO_VARIANTS = ("turns", "caption", "date", "observations")
_DIA = re.compile(r"D:?(\d+):(\d+)")
_WORD = re.compile(r"[a-z0-9]+")
# Function words only: BM25 needs no more than this to stop "the" matching.
_STOP = """
    a an and are as at be by did do does for from had has have he her his how i in is it its
    me my of on or our she so that the their them they this to was we were what when where
    which who whom why will with you your
"""
STOPWORDS = frozenset(_STOP.split())


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
        "default_threshold": real.default_threshold,
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

    def mrr(self) -> float:
        rank = self.first_rank()
        return 1.0 / rank if rank else 0.0

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
        out["ndcg@10"] = self.ndcg(10)
        return out


def average(rows: Sequence[dict[str, float]]) -> dict[str, float]:
    if not rows:
        return {"questions": 0}
    out = {key: round(sum(r[key] for r in rows) / len(rows), 4) for key in rows[0]}
    out["questions"] = len(rows)
    return out


# BM25 and fusion -------------------------------------------------------------------


def tokens(text: str) -> list[str]:
    return [w for w in _WORD.findall(text.lower()) if w not in STOPWORDS]


class BM25:
    def __init__(self, documents: dict[str, str], k1: float = 1.2, b: float = 0.75) -> None:
        self.k1, self.b = k1, b
        self.terms = {key: Counter(tokens(text)) for key, text in documents.items()}
        self.lengths = {key: sum(c.values()) for key, c in self.terms.items()}
        self.average = sum(self.lengths.values()) / max(len(self.lengths), 1)
        frequency: Counter[str] = Counter()
        for counts in self.terms.values():
            frequency.update(counts.keys())
        n = len(self.terms)
        self.idf = {t: math.log(1 + (n - f + 0.5) / (f + 0.5)) for t, f in frequency.items()}

    def search(self, query: str, limit: int) -> list[str]:
        words = [w for w in tokens(query) if w in self.idf]
        scores: dict[str, float] = {}
        for key, counts in self.terms.items():
            score = 0.0
            norm = self.k1 * (1 - self.b + self.b * self.lengths[key] / self.average)
            for word in words:
                tf = counts.get(word)
                if tf:
                    score += self.idf[word] * tf * (self.k1 + 1) / (tf + norm)
            if score > 0:
                scores[key] = score
        return sorted(scores, key=lambda key: -scores[key])[:limit]


def fuse(*rankings: list[str], limit: int = 50) -> list[str]:
    """Reciprocal rank fusion."""
    scores: dict[str, float] = defaultdict(float)
    for ranking in rankings:
        for rank, key in enumerate(ranking, start=1):
            scores[key] += 1.0 / (RRF_K + rank)
    return sorted(scores, key=lambda key: -scores[key])[:limit]


# The runs ----------------------------------------------------------------------------


class Runner:
    def __init__(self, embedder: Any, cache: corpus.EmbeddingCache, *, prewarm: bool) -> None:
        self.embedder = embedder
        self.cache = cache
        self.prewarm = prewarm
        self.users: list[str] = []
        # Similarity of the retrieved results, relevant or not (dense, threshold 0).
        self.similarities: dict[str, dict[str, list[float]]] = {}
        # What the default threshold would leave: per benchmark, per question.
        self.threshold_rows: dict[str, list[dict[str, float]]] = defaultdict(list)

    def cleanup(self) -> None:
        from accounts.models import User
        from recall import tenancy

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

    def dense(self, user_id: str, namespace: str, query: str) -> list[dict[str, Any]]:
        from memories import services

        return services.recall(
            user_id=user_id, query=query, namespace=namespace, limit=50, threshold=0
        )

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
                texts: dict[str, str] = {}
                for memory_id, (content, _, dia_ids) in zip(ids, items, strict=True):
                    # Identical contents are one memory (deduplication): it stands for both.
                    keys[memory_id].update(dia_ids)
                    texts[memory_id] = content
                bm25 = BM25(texts)
                for question in conversation.questions:
                    evidence = resolve(question.evidence)
                    if variant == variants[0]:
                        unresolved += len(evidence - known)
                    evidence &= known
                    if not evidence:
                        excluded += variant == variants[0]
                        continue
                    found = self.dense(user_id, variant, question.question)
                    dense_ids = [r["id"] for r in found]
                    ranked = Ranked([frozenset(keys[i]) for i in dense_ids], evidence)
                    lexical = bm25.search(question.question, 50)
                    fused = fuse(dense_ids, lexical)
                    hybrid = Ranked([frozenset(keys[i]) for i in fused], evidence)
                    category = question.category
                    for name, result in ((variant, ranked), (f"{variant}+hybrid", hybrid)):
                        bucket = per_variant.setdefault(name, defaultdict(list))
                        bucket[str(category)].append(result.metrics())
                    if variant == "turns" and category != 5:
                        self.record_similarities("locomo", found, keys, evidence)
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

    # SciFact --------------------------------------------------------------------------

    def scifact(self, data: corpus.SciFact) -> dict[str, Any]:
        from django.db import connection

        from memories import embeddings, services
        from recall import tenancy

        started = time.monotonic()
        user_id = self.user("scifact")
        doc_ids = sorted(data.docs)
        ids = self.store(user_id, "default", [(data.docs[d], {"doc_id": d}) for d in doc_ids])
        keys = {memory_id: frozenset({str(d)}) for memory_id, d in zip(ids, doc_ids, strict=True)}
        bm25 = BM25({memory_id: data.docs[d] for memory_id, d in zip(ids, doc_ids, strict=True)})
        print(f"  scifact: {len(ids)} memories, {time.monotonic() - started:.0f} s", flush=True)
        claims = sorted(data.claims)
        self.warm(data.claims[c] for c in claims)
        embedder = embeddings.get_embedder()
        rows: dict[str, list[dict[str, float]]] = defaultdict(list)
        skipped = 0
        for claim in claims:
            relevant = {str(d) for d in data.cited.get(claim, set()) if d in data.docs}
            if not relevant:
                skipped += 1
                continue
            text = data.claims[claim]
            found = self.dense(user_id, "default", text)
            dense_ids = [r["id"] for r in found]
            ranked = Ranked([keys[i] for i in dense_ids], relevant)
            sql, params = services.nearest_sql(
                user_id=user_id,
                model_id=embedder.model_id,
                dimensions=embedder.dimensions,
                vector=embedder.embed_one(text),
                namespace="default",
                limit=100,
                minimum=0.0,
                metadata_filter={},
            )
            with (
                tenancy.tenant(user_id, local_settings=services.SEARCH_SETTINGS),
                connection.cursor() as cursor,
            ):
                cursor.execute(sql, params)
                hundred = [str(row[0]) for row in cursor.fetchall()]
            deep = Ranked([keys[i] for i in hundred], relevant)
            metrics = ranked.metrics((1, 5, 10, 50))
            metrics["recall@100"] = deep.recall(100)
            rows["dense"].append(metrics)
            fused = fuse(dense_ids, bm25.search(text, 50))
            rows["hybrid"].append(
                Ranked([keys[i] for i in fused], relevant).metrics((1, 5, 10, 50))
            )
            rows["bm25"].append(
                Ranked([keys[i] for i in bm25.search(text, 50)], relevant).metrics((1, 5, 10, 50))
            )
            self.record_similarities("scifact", found, keys, relevant)
        out: dict[str, Any] = {name: average(r) for name, r in rows.items()}
        out["claims_without_relevant_docs"] = skipped
        out["seconds"] = round(time.monotonic() - started, 1)
        return out

    # Similarities ---------------------------------------------------------------------

    def record_similarities(
        self,
        name: str,
        found: list[dict[str, Any]],
        keys: dict[str, Any],
        relevant: set[str],
    ) -> None:
        from memories import services

        scores = self.similarities.setdefault(name, {"related": [], "unrelated": []})
        for result in found:
            kind = "related" if keys[result["id"]] & relevant else "unrelated"
            scores[kind].append(float(result["similarity"]))
        # What recall returns at the default threshold: the same list, cut.
        default = services.default_threshold()
        kept = [r for r in found if r["similarity"] >= default]
        ranked = Ranked([frozenset(keys[r["id"]]) for r in kept], relevant)
        self.threshold_rows[name].append(
            {
                "empty": 0.0 if kept else 1.0,
                "returned": float(len(kept)),
                "hit@5": ranked.hit(5),
                "recall@5": ranked.recall(5),
            }
        )


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
            f"\nLoCoMo ({report['model']}); questions without resolvable evidence: "
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
                        metrics["mrr"],
                        metrics["ndcg@10"],
                    ]
                )
        harness.print_table(
            rows, ["variant", "slice", "n", "R@5", "R@10", "hit@5", "hit@10", "MRR", "nDCG@10"]
        )
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
        similarity.print_summary(f"{name}: retrieved results (top 50, dense)", summary)
    threshold = report["default_threshold"]
    for name, effect in report.get("default_threshold_effect", {}).items():
        print(
            f"\n{name} at the default threshold {threshold}: {effect['empty']:.1%} of queries "
            f"get nothing, {effect['returned']:.1f} of 50 returned on average, "
            f"recall@5 {effect['recall@5']:.3f}, hit@5 {effect['hit@5']:.3f}"
        )
    print(f"\ndone in {report['seconds']:.0f} s")


if __name__ == "__main__":
    sys.exit(main())
