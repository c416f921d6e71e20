"""Measure priority as a tie-break in recall: what it can gain, and what it can cost.

    python bench/priority.py --data ../shared/data --json bench/results/priority.json
    python bench/priority.py --smoke        # seconds, built-in sample, no data

LoCoMo turns are stored through ``remember`` (as in ``bench/retrieval.py``),
one tenant per conversation, and every question (categories 1-4) is asked
through the product's ``recall`` (limit 50, threshold 0) under five
assignments of priority to the same memories:

- ``none``: every memory medium (the ranking without priority);
- ``random``: a priority drawn uniformly per memory, unrelated to relevance;
- ``helpful``: the evidence turns of some question high, the rest medium:
  priority that agrees with relevance, the best case;
- ``adversarial``: evidence turns low and every other memory critical:
  priority that contradicts relevance, the worst case;
- ``critical-distractors``: only the non-evidence memories critical.

For each it reports hit@1/5/10, MRR and, against ``none``, how many
questions' first relevant result moved up or down, and the largest
rank (``recall``'s ordering: the score, lifted beside a strong match in
hybrid mode) by which a memory was lifted over one ranked above it without
priority. The rule in ``memories/search.py`` bounds that
lift below 0.01; this measures it.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

_ROOT = str(Path(__file__).resolve().parent.parent)
if sys.path[0] == str(Path(__file__).resolve().parent):
    sys.path[0] = _ROOT
elif _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

from bench import corpus, harness  # noqa: E402
from bench.retrieval import Ranked, average, locomo_file, resolve  # noqa: E402

SCHEMES = ("none", "random", "helpful", "adversarial", "critical-distractors")
LEVELS = ("critical", "high", "medium", "low")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, help="Folder holding locomo10(-dev).json.")
    parser.add_argument("--smoke", action="store_true", help="Built-in tiny sample, no data.")
    parser.add_argument(
        "--cache", type=Path, default=corpus.DEFAULT_CACHE, help="Embedding cache directory."
    )
    parser.add_argument("--workdir", type=Path, help="Where the throwaway database lives.")
    parser.add_argument("--database-url", help="Use this (scratch!) database instead.")
    parser.add_argument("--json", type=Path, help="Write the results here.")
    args = parser.parse_args(argv)
    if not args.smoke and args.data is None:
        parser.error("--data is required unless --smoke")

    started = time.monotonic()
    where = harness.configure(args.database_url, args.workdir)
    from memories import embeddings

    real = embeddings.get_embedder()
    real.load()
    cache = corpus.EmbeddingCache(
        None if args.smoke else args.cache,
        f"{real.model_id}-{embeddings.BUNDLED_ONNX_SHA256[:12]}",
    )
    raw = corpus.SMOKE_LOCOMO if args.smoke else json.loads(locomo_file(args.data).read_text())
    report: dict[str, Any] = {
        "command": "python bench/priority.py "
        + " ".join(argv if argv is not None else sys.argv[1:]),
        "machine": harness.machine(),
        "database": {"where": where, **harness.database_versions()},
        "model": real.model_id,
        "file": "smoke" if args.smoke else locomo_file(args.data).name,
    }
    try:
        with harness.using_embedder(harness.cached_embedder(real, cache)):
            report.update(run(corpus.parse_locomo(raw), cache, real))
    finally:
        cache.save()
    report["seconds"] = round(time.monotonic() - started, 1)
    print_report(report)
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
        print(f"wrote {args.json}")
    return 0


def run(conversations: list[corpus.Conversation], cache: Any, real: Any) -> dict[str, Any]:
    from accounts import services as accounts_services
    from accounts.models import User
    from core import tenancy
    from memories import services, validation

    rows: dict[str, list[dict[str, float]]] = defaultdict(list)
    moves: dict[str, dict[str, int]] = {s: {"up": 0, "down": 0, "same": 0} for s in SCHEMES}
    lifts: dict[str, list[float]] = defaultdict(list)
    users = []
    rng = random.Random(5)
    try:
        for conversation in conversations:
            user = accounts_services.create_user(
                email=f"bench-priority-{conversation.sample_id}-{time.time_ns()}@example.com",
                tier="pro",
            )
            users.append(user.id)
            texts = [turn.content for turn in conversation.turns]
            corpus.embed_texts(real, [validation.normalize(t) for t in texts], cache)
            ids_by_dia: dict[str, str] = {}
            for turn in conversation.turns:
                stored = services.remember(user_id=user.id, tier="pro", content=turn.content)
                ids_by_dia[turn.dia_id] = stored["id"]
            keys: dict[str, set[str]] = defaultdict(set)
            for dia, memory_id in ids_by_dia.items():
                keys[memory_id].add(dia)
            known = set(ids_by_dia)
            questions = []
            for question in conversation.questions:
                evidence = resolve(question.evidence) & known
                if question.category != 5 and evidence:
                    questions.append((question.question, evidence))
            evidence_ids = {ids_by_dia[d] for _, ev in questions for d in ev}
            baseline: dict[str, Ranked] = {}
            for scheme in SCHEMES:
                assign(user.id, scheme, set(keys), evidence_ids, rng)
                for text, evidence in questions:
                    found = ranks(user.id, text)
                    ranked = Ranked(
                        [frozenset(keys[str(f.memory.id)]) for f in found],
                        evidence,
                        [f.rank for f in found],
                    )
                    rows[scheme].append(ranked.metrics((1, 5, 10)))
                    if scheme == "none":
                        baseline[text] = ranked
                        continue
                    lifts[scheme].append(largest_lift(ranked))
                    before, after = baseline[text].first_rank(), ranked.first_rank()
                    key = (
                        "same"
                        if before == after
                        else ("up" if (after or 99) < (before or 99) else "down")
                    )
                    moves[scheme][key] += 1
            print(f"  {conversation.sample_id}: {len(questions)} questions", flush=True)
    finally:
        with tenancy.operator():
            User.objects.filter(id__in=users).delete()
    return {
        "schemes": {
            scheme: {
                **average(rows[scheme]),
                **({"first_relevant_moved": moves[scheme]} if scheme != "none" else {}),
                **(
                    {"largest_lift": round(max(lifts[scheme], default=0.0), 4)}
                    if scheme != "none"
                    else {}
                ),
            }
            for scheme in SCHEMES
        }
    }


def assign(
    user_id: Any, scheme: str, ids: set[str], evidence: set[str], rng: random.Random
) -> None:
    """Give the user's memories the scheme's priorities, one UPDATE per priority."""
    from django.db import connection

    from core import tenancy

    chosen: dict[str, list[str]] = defaultdict(list)
    for memory_id in sorted(ids):
        if scheme == "none":
            level = "medium"
        elif scheme == "random":
            level = rng.choice(LEVELS)
        elif scheme == "helpful":
            level = "high" if memory_id in evidence else "medium"
        elif scheme == "adversarial":
            level = "low" if memory_id in evidence else "critical"
        else:  # critical-distractors
            level = "medium" if memory_id in evidence else "critical"
        chosen[level].append(memory_id)
    with tenancy.tenant(user_id), connection.cursor() as cursor:
        for level, members in chosen.items():
            cursor.execute(
                "UPDATE memories SET priority = %s WHERE id = ANY(%s::uuid[])", [level, members]
            )


def ranks(user_id: Any, text: str) -> list[Any]:
    """recall's results (limit 50, threshold 0) with the rank each is ordered by.

    Since issue 22 a result's score is its own and its rank the list's order
    (a memory beside a strong match is lifted); priority breaks ties on the
    rank, so the rank is what a priority's lift is measured on.
    """
    from django.test import override_settings

    from memories import search

    args = search.SearchArgs.parse(query=text, namespace="default", limit=50, threshold=0)
    # The ranking and its priority tie-break alone: newer first (memories/
    # ordering.py) moves restatements on purpose, whatever their priority.
    with override_settings(RECALL_NEWER_FIRST=False):
        return search.search(user_id=user_id, args=args).found


def largest_lift(ranked: Ranked) -> float:
    """Return the largest score by which a result sits above a better-scored one."""
    worst = 0.0
    best_below = -1.0
    for similarity in reversed(ranked.similarities):
        if best_below > similarity:
            worst = max(worst, best_below - similarity)
        best_below = max(best_below, similarity)
    return worst


def print_report(report: dict[str, Any]) -> None:
    rows = []
    for scheme, figures in report["schemes"].items():
        moved = figures.get("first_relevant_moved", {})
        rows.append(
            [
                scheme,
                figures.get("hit@1"),
                figures.get("hit@5"),
                figures.get("hit@10"),
                figures.get("mrr"),
                f"{moved.get('up', '')}/{moved.get('down', '')}" if moved else "",
                figures.get("largest_lift", ""),
            ]
        )
    harness.print_table(
        rows, ["scheme", "hit@1", "hit@5", "hit@10", "MRR", "first hit up/down", "max lift"]
    )


if __name__ == "__main__":
    raise SystemExit(main())
