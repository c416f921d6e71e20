"""Measure cosine similarities of related and unrelated pairs with the local model.

The numbers behind ``memories.embeddings.LOCAL_THRESHOLD``. Related pairs:

- LoCoMo: a question and each of its evidence turns, as ``"<speaker>: <text>"``
  (categories 1-4; category 5 is adversarial and asks about things never said);
- SciFact: a training claim and each cited abstract (title and abstract), and
  a claim and each sentence labelled as its evidence.

Unrelated pairs: the same queries against random turns of the same
conversation that are not evidence, and random abstracts and abstract
sentences the claim does not cite.

The data's licences forbid copying it into the repository, so it is read from
``--data DIR`` (laid out as ``python bench/retrieval.py --help`` says).

    python bench/similarity.py --data DIR [--json out.json]

It embeds about 13,000 texts, most of them whole abstracts: some 7 minutes on
two cores.
"""

from __future__ import annotations

import argparse
import ast
import csv
import json
import random
import re
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

PERCENTILES = (5, 25, 50, 75, 95)
THRESHOLDS = tuple(round(0.2 + 0.05 * step, 2) for step in range(11))
# Quoted items of the abstracts' list repr, which has no commas between items.
_QUOTED = re.compile(r"'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Print similarity distributions of related and unrelated pairs, and "
        "what each candidate recall threshold keeps and cuts."
    )
    parser.add_argument("--data", type=Path, required=True, help="Benchmark data directory.")
    parser.add_argument("--json", type=Path, help="Also write the numbers to this file.")
    parser.add_argument("--seed", type=int, default=7, help="Seed for the unrelated samples.")
    parser.add_argument(
        "--negatives", type=int, default=5, help="Unrelated pairs per query and source."
    )
    parser.add_argument(
        "--model-dir", help="An ONNX sentence-transformer directory instead of the bundled model."
    )
    args = parser.parse_args(argv)

    # Run from a checkout without installing: the project root holds `memories`.
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from memories.embeddings import LocalEmbedder

    embedder = LocalEmbedder(args.model_dir)
    rng = random.Random(args.seed)
    started = time.monotonic()

    sources: dict[str, dict[str, list[float]]] = {}
    queries, turns, related, unrelated = locomo_pairs(args.data, rng, args.negatives)
    sources["locomo"] = score(embedder, queries, turns, related, unrelated)
    claims, docs, sentences, pairs = scifact_pairs(args.data, rng, args.negatives)
    sources["scifact_abstract"] = score(embedder, claims, docs, pairs[0], pairs[1])
    sources["scifact_sentence"] = score(embedder, claims, sentences, pairs[2], pairs[3])
    sources["all"] = {
        kind: [value for name in list(sources) for value in sources[name][kind]]
        for kind in ("related", "unrelated")
    }

    report: dict[str, Any] = {
        "model": embedder.model_id,
        "seed": args.seed,
        "negatives_per_query": args.negatives,
        "sources": {name: summarise(scores) for name, scores in sources.items()},
    }
    for name, summary in report["sources"].items():
        print_summary(name, summary)
    print(f"\n{embedder.model_id}: {time.monotonic() - started:.0f} s")
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
        print(f"wrote {args.json}")
    return 0


def locomo_pairs(
    data: Path, rng: random.Random, negatives: int
) -> tuple[list[str], list[str], list[tuple[int, int]], list[tuple[int, int]]]:
    conversations = json.loads((data / "locomo10-dev.json").read_text())
    queries: list[str] = []
    turns: list[str] = []
    related: list[tuple[int, int]] = []
    unrelated: list[tuple[int, int]] = []
    for conversation in conversations:
        sessions = conversation["conversation"]
        where: dict[str, int] = {}
        for key, session in sessions.items():
            if not re.fullmatch(r"session_\d+", key):
                continue
            for turn in session:
                where[turn["dia_id"]] = len(turns)
                turns.append(f"{turn['speaker']}: {turn['text']}")
        own = list(where.values())
        for qa in conversation["qa"]:
            evidence = {where[dia_id] for dia_id in qa.get("evidence", []) if dia_id in where}
            if qa.get("category") == 5 or not evidence:
                continue
            query = len(queries)
            queries.append(qa["question"])
            related.extend((query, turn) for turn in sorted(evidence))
            others = [turn for turn in own if turn not in evidence]
            unrelated.extend((query, turn) for turn in rng.sample(others, negatives))
    return queries, turns, related, unrelated


def scifact_claims(
    data: Path,
) -> tuple[dict[int, str], dict[int, set[int]], dict[int, set[tuple[int, int]]]]:
    """Return SciFact's training claims, the abstracts each cites, and its evidence sentences."""
    claims: dict[int, str] = {}
    cited: dict[int, set[int]] = {}
    evidence: dict[int, set[tuple[int, int]]] = {}
    with (data / "scifact" / "claims_train.csv").open(newline="") as f:
        for row in csv.DictReader(f):
            claim = int(row["id"])
            claims[claim] = row["claim"]
            cited.setdefault(claim, set()).update(
                int(d) for d in re.findall(r"\d+", row["cited_doc_ids"])
            )
            if row["evidence_doc_id"]:
                evidence_doc = int(row["evidence_doc_id"])
                evidence.setdefault(claim, set()).update(
                    (evidence_doc, int(s)) for s in re.findall(r"\d+", row["evidence_sentences"])
                )
    return claims, cited, evidence


def scifact_pairs(
    data: Path, rng: random.Random, negatives: int
) -> tuple[list[str], list[str], list[str], list[list[tuple[int, int]]]]:
    abstracts: dict[int, tuple[str, list[str]]] = {}
    with (data / "scifact" / "corpus.csv").open(newline="") as f:
        for row in csv.DictReader(f):
            abstracts[int(row["doc_id"])] = (row["title"], split_abstract(row["abstract"]))
    claims, cited, evidence = scifact_claims(data)

    claim_ids = sorted(claims)
    doc_ids = sorted(abstracts)
    docs: list[str] = []
    sentences: list[str] = []
    doc_index: dict[int, int] = {}
    sentence_index: dict[tuple[int, int], int] = {}

    def doc(doc_id: int) -> int:
        if doc_id not in doc_index:
            title, body = abstracts[doc_id]
            doc_index[doc_id] = len(docs)
            docs.append(f"{title} {' '.join(body)}")
        return doc_index[doc_id]

    def sentence(key: tuple[int, int]) -> int:
        if key not in sentence_index:
            sentence_index[key] = len(sentences)
            sentences.append(abstracts[key[0]][1][key[1]])
        return sentence_index[key]

    doc_related: list[tuple[int, int]] = []
    doc_unrelated: list[tuple[int, int]] = []
    sentence_related: list[tuple[int, int]] = []
    sentence_unrelated: list[tuple[int, int]] = []
    for query, claim in enumerate(claim_ids):
        known = [d for d in cited[claim] if d in abstracts]
        doc_related.extend((query, doc(d)) for d in known)
        for d, s in sorted(evidence.get(claim, ())):
            if d in abstracts and s < len(abstracts[d][1]):
                sentence_related.append((query, sentence((d, s))))
        for d in sample_excluding(rng, doc_ids, cited[claim], negatives):
            doc_unrelated.append((query, doc(d)))
        if claim in evidence:
            for d in sample_excluding(rng, doc_ids, cited[claim], negatives):
                s = rng.randrange(len(abstracts[d][1]))
                sentence_unrelated.append((query, sentence((d, s))))
    pairs = [doc_related, doc_unrelated, sentence_related, sentence_unrelated]
    return [claims[c] for c in claim_ids], docs, sentences, pairs


def split_abstract(raw: str) -> list[str]:
    # Each item is a Python string literal; literal_eval evaluates nothing else.
    found = [ast.literal_eval(token) for token in _QUOTED.findall(raw)]
    return [item for item in found if item.strip()] or [raw]


def sample_excluding(
    rng: random.Random, population: list[int], excluded: set[int], count: int
) -> list[int]:
    chosen: list[int] = []
    while len(chosen) < count:
        pick = rng.choice(population)
        if pick not in excluded and pick not in chosen:
            chosen.append(pick)
    return chosen


def score(
    embedder: Any,
    queries: list[str],
    texts: list[str],
    related: Iterable[tuple[int, int]],
    unrelated: Iterable[tuple[int, int]],
) -> dict[str, list[float]]:
    query_vectors = embedder.embed(queries)
    text_vectors = embedder.embed(texts)

    def cosines(pairs: Iterable[tuple[int, int]]) -> list[float]:
        return [float(query_vectors[q] @ text_vectors[t]) for q, t in pairs]

    return {"related": cosines(related), "unrelated": cosines(unrelated)}


def summarise(scores: dict[str, list[float]]) -> dict[str, Any]:
    related = np.asarray(scores["related"])
    unrelated = np.asarray(scores["unrelated"])
    return {
        "pairs": {"related": int(related.size), "unrelated": int(unrelated.size)},
        "percentiles": {
            kind: {f"p{p}": round(float(np.percentile(values, p)), 3) for p in PERCENTILES}
            for kind, values in (("related", related), ("unrelated", unrelated))
        },
        "thresholds": {
            f"{t:.2f}": {
                "related_kept": round(float((related >= t).mean()), 3),
                "unrelated_cut": round(float((unrelated < t).mean()), 3),
            }
            for t in THRESHOLDS
        },
    }


def print_summary(name: str, summary: dict[str, Any]) -> None:
    pairs = summary["pairs"]
    print(f"\n== {name}: {pairs['related']} related, {pairs['unrelated']} unrelated pairs")
    header = "  ".join(f"{'p' + str(p):>6}" for p in PERCENTILES)
    print(f"{'':10}{header}")
    for kind, values in summary["percentiles"].items():
        print(f"{kind:10}" + "  ".join(f"{v:6.3f}" for v in values.values()))
    print(f"{'threshold':>10}  {'related kept':>12}  {'unrelated cut':>13}")
    for threshold, shares in summary["thresholds"].items():
        print(f"{threshold:>10}  {shares['related_kept']:12.1%}  {shares['unrelated_cut']:13.1%}")


if __name__ == "__main__":
    sys.exit(main())
