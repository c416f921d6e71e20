"""The detector, pair by pair: look-alikes it links, updates it finds.

    python bench/pairs.py                  # bench/data/knowledge_updates/pairs.json
    python bench/pairs.py --json OUT       # also write the figures and every wrong link
    python bench/pairs.py --list-missed    # print the updates it does not link

Each pair is an older and a newer memory, judged on its own with
``memories.supersession.judge`` at the two texts' cosine under the bundled
local model, as the write path judges a candidate. Look-alikes are two facts
true at once ("Farah is fluent in Arabic." / "... in French.", "Car
insurance renews in March." / "Home insurance renews in October."): each is
judged both ways round, and a link is a false supersession. Updates are an
older fact and its replacement, in styles from a change word said outright
to a subject said in other words.

No server, no database: seconds. ``bench/knowledge.py`` measures what a
search then shows; this shows the rules alone, on templates its set lacks.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any

_ROOT = str(Path(__file__).resolve().parent.parent)
if sys.path[0] == str(Path(__file__).resolve().parent):
    sys.path[0] = _ROOT  # bench/http.py would shadow the standard library's http
elif _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

import numpy as np  # noqa: E402

from bench import corpus  # noqa: E402
from bench.knowledge import local_embedder, vectors_for  # noqa: E402

PAIRS = Path(__file__).resolve().parent / "data" / "knowledge_updates" / "pairs.json"


def judged(pairs: list[tuple[str, str, str]], vectors: dict[str, Any]) -> list[dict[str, Any]]:
    from memories.supersession import Candidate, judge

    out = []
    for group, old, new in pairs:
        similarity = float(np.dot(vectors[old], vectors[new]))
        decision = judge(new, Candidate("older", old, similarity))
        out.append(
            {
                "group": group,
                "old": old,
                "new": new,
                "similarity": round(similarity, 3),
                "verdict": decision.verdict,
                "reason": decision.reason,
            }
        )
    return out


def measure(data: dict[str, Any], vectors: dict[str, Any]) -> dict[str, Any]:
    looks = [(p["domain"], p["old"], p["new"]) for p in data["lookalikes"]]
    looks += [(domain, new, old) for domain, old, new in looks]  # the other order too
    updates = [(p["style"], p["old"], p["new"]) for p in data["updates"]]
    look_results, update_results = judged(looks, vectors), judged(updates, vectors)
    false = [r for r in look_results if r["verdict"] == "supersede"]
    found = Counter(r["group"] for r in update_results if r["verdict"] == "supersede")
    styles = Counter(r["group"] for r in update_results)
    return {
        "lookalike_judgements": len(look_results),
        "false_supersessions": len(false),
        "updates": len(update_results),
        "updates_linked": sum(found.values()),
        "by_style": {s: f"{found[s]}/{n}" for s, n in sorted(styles.items())},
        "false": false,
        "missed": [r for r in update_results if r["verdict"] != "supersede"],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=Path, default=PAIRS, help="The pairs (JSON).")
    parser.add_argument(
        "--cache", type=Path, default=corpus.DEFAULT_CACHE, help="Embedding cache directory."
    )
    parser.add_argument("--json", type=Path, help="Write the figures and the wrong links here.")
    parser.add_argument("--list-missed", action="store_true", help="Print the missed updates.")
    parser.add_argument("--smoke", action="store_true", help="No embedding cache on disk.")
    args = parser.parse_args(argv)

    data = json.loads(args.pairs.read_text())
    pairs = data["lookalikes"] + data["updates"]
    texts = [pair[side] for pair in pairs for side in ("old", "new")]
    model, cache = local_embedder(None if args.smoke else args.cache)
    vectors = vectors_for(model, cache, texts)
    cache.save()
    report = measure(data, vectors)

    print(
        f"look-alikes linked (false supersession): {report['false_supersessions']} of "
        f"{report['lookalike_judgements']} judgements "
        f"({len(data['lookalikes'])} pairs, both orders)"
    )
    for r in report["false"]:
        print(f"  {r['old']!r} -> {r['new']!r}: {r['reason']}")
    print(f"updates linked: {report['updates_linked']} of {report['updates']}")
    print("  by style: " + ", ".join(f"{s} {v}" for s, v in report["by_style"].items()))
    if args.list_missed:
        for r in report["missed"]:
            print(f"  missed [{r['group']}] {r['old']!r} -> {r['new']!r}: {r['reason']}")
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
