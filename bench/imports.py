"""Measure `recall import --from`: memories per second, vectors reused and re-embedded, peak RSS.

    python bench/imports.py --json bench/results/imports.json      # 100k records
    python bench/imports.py --smoke                                # 400, seconds

Two sources of the same generated memories (made-up sentences, deterministic
by ``--seed``) are written once into ``--workdir`` and kept for later runs:

- ``mcp-memory-service``: its SQLite-vec database, with each memory's vector
  from the bundled all-MiniLM-L6-v2 (what mcp-memory-service stores with its
  default model), laid out in vec0's shadow tables as sqlite-vec lays it out;
- ``mem0``: the JSON ``Memory.get_all()`` returns, ``{"results": [...]}``.

Each case runs in a process of its own, on its own throwaway database, for a
fresh peak RSS: the mcp-memory-service database with its vectors reused (the
sample check passes), the mem0 JSON re-embedded by the local model, and each
source a second time, when every record is a duplicate. Reported: seconds,
records per second, vectors reused and embedded, and the import process's
peak RSS (sampled every 0.2 s) with the PostgreSQL server's PSS beside it.
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

_ROOT = str(Path(__file__).resolve().parent.parent)
if sys.path[0] == str(Path(__file__).resolve().parent):
    sys.path[0] = _ROOT
elif _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

from bench import harness  # noqa: E402

CASES = ("mcp-memory-service", "mem0")
SUBJECTS = [
    "The user", "Dana", "The team", "The client", "Our landlord", "The research group",
    "My sister", "The on-call engineer", "The product manager", "The bakery on Rua Augusta",
]  # fmt: skip
VERBS = [
    "prefers", "asked about", "decided to move", "keeps forgetting", "wants to review",
    "scheduled", "cancelled", "is worried about", "recommended", "finished",
]  # fmt: skip
OBJECTS = [
    "the quarterly budget", "green tea in the afternoon", "the staging database migration",
    "a trip to Kyoto in April", "the pull request about rate limits", "vegetarian recipes",
    "the dentist appointment", "the new onboarding guide", "running before work",
    "the invoice export", "a standing desk", "the backup rotation policy",
]  # fmt: skip
DETAILS = [
    "before the end of the month", "because the old one kept timing out", "on Tuesdays",
    "after the last incident review", "with help from the design team", "for the second time",
    "without telling anyone", "as agreed in the planning meeting", "once the budget is approved",
    "and wants a reminder the day before",
]  # fmt: skip


def sentences(count: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    out = []
    for n in range(count):
        words = (rng.choice(SUBJECTS), rng.choice(VERBS), rng.choice(OBJECTS), rng.choice(DETAILS))
        out.append(f"{' '.join(words)} (note {n}).")
    return out


def build_sources(workdir: Path, count: int, seed: int) -> dict[str, Path]:
    """Write (or find, from an earlier run) both sources for ``count`` records."""
    workdir.mkdir(parents=True, exist_ok=True)
    mem0 = workdir / f"mem0-{count}-{seed}.json"
    mcp = workdir / f"mcp-memory-service-{count}-{seed}.db"
    texts: list[str] | None = None
    if not mem0.exists():
        texts = sentences(count, seed)
        with (workdir / "mem0.tmp").open("w", encoding="utf-8") as out:
            out.write('{"results": [\n')
            for n, text in enumerate(texts):
                record = {
                    "id": f"00000000-0000-4000-8000-{n:012d}",
                    "memory": text,
                    "hash": f"{n:032x}",
                    "metadata": {"n": n},
                    "created_at": f"2024-{1 + n % 12:02d}-{1 + n % 28:02d}T10:00:00+00:00",
                    "updated_at": None,
                    "user_id": "dana",
                }
                out.write(("," if n else "") + json.dumps(record) + "\n")
            out.write("]}\n")
        (workdir / "mem0.tmp").rename(mem0)
    if not mcp.exists():
        texts = texts or sentences(count, seed)
        harness.configure(workdir=workdir)  # the model, without a database it needs
        from memories import embeddings
        from memories.tests.importing import mcp_memory_service_db

        embedder = embeddings.get_embedder()
        started = time.monotonic()
        rows = (
            {"content": text, "tags": "bench", "memory_type": "note", "metadata": {"n": n},
             "created_at": 1_700_000_000.0 + n}
            for n, text in enumerate(texts)
        )  # fmt: skip
        mcp_memory_service_db(workdir / "mcp.tmp", rows, embedder.embed, batch=1024)
        (workdir / "mcp.tmp").rename(mcp)
        print(f"built {mcp.name} in {time.monotonic() - started:.0f} s", file=sys.stderr)
    return {"mem0": mem0, "mcp-memory-service": mcp}


def run_case(fmt: str, path: Path, workdir: Path, writers: int) -> dict[str, Any]:
    """One case in this process: a fresh database, the import, then the same again."""
    harness.configure(workdir=workdir)
    from accounts import services as accounts
    from core import context
    from memories import embeddings
    from memories.importers import Source
    from memories.importers.run import Options, run_import

    embeddings.get_embedder().load()
    user = accounts.create_user(email="bench@example.com", tier="unlimited")
    sampler = harness.MemorySampler(interval=0.2)
    sampler.attach()
    sampler.start()
    results: dict[str, Any] = {
        "format": fmt,
        "writers": writers,
        "file_mib": round(path.stat().st_size / 2**20, 1),
    }
    for phase in ("first", "again"):
        with sampler.phase(phase), context.acting_as("import"):
            started = time.monotonic()
            report = run_import(
                user_id=user.id, source=Source.at(path), options=Options(fmt), writers=writers
            )
            seconds = time.monotonic() - started
        results[phase] = {
            "seconds": round(seconds, 1),
            "records_per_second": round(report.read / seconds, 1),
            "imported": report.imported,
            "duplicates": report.duplicates,
            "refused": report.refused,
            "reused": report.reused,
            "embedded": report.embedded,
            "vectors": report.vectors,
        }
    sampler.stop()
    results["peaks"] = sampler.peaks
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--smoke", action="store_true", help="400 records.")
    parser.add_argument(
        "--workdir",
        type=Path,
        default=Path("~/.cache/recall-bench/imports").expanduser(),
        help="Where the generated sources are kept between runs, and the throwaway databases.",
    )
    parser.add_argument("--cases", default=",".join(CASES), help="Which of " + ", ".join(CASES))
    parser.add_argument(
        "--writers", type=int, default=2, help="Writer threads, as `recall import --from` runs (2)."
    )
    parser.add_argument("--json", type=Path, help="Write the results here.")
    parser.add_argument("--case", help=argparse.SUPPRESS)
    parser.add_argument("--source", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    count = 400 if args.smoke else args.records

    if args.case:  # a child: one case, its results as JSON on stdout
        print(json.dumps(run_case(args.case, args.source, args.workdir, args.writers)))
        return 0

    sources = build_sources(args.workdir, count, args.seed)
    cases: list[dict[str, Any]] = []
    results: dict[str, Any] = {
        "command": "python bench/imports.py " + " ".join(argv or sys.argv[1:]),
        "records": count,
        "machine": harness.machine(),
        "cases": cases,
    }
    for fmt in args.cases.split(","):
        done = subprocess.run(
            [sys.executable, __file__, "--case", fmt, "--source", str(sources[fmt]),
             "--workdir", str(args.workdir), "--writers", str(args.writers)],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        if done.returncode != 0:
            print(done.stderr[-4000:], file=sys.stderr)
            return 1
        cases.append(json.loads(done.stdout.strip().splitlines()[-1]))
    rows = []
    for case in cases:
        for phase in ("first", "again"):
            run = case[phase]
            peaks = case["peaks"].get(phase, {})
            rows.append([
                case["format"], phase, run["seconds"], run["records_per_second"], run["imported"],
                run["duplicates"], run["reused"], run["embedded"],
                peaks.get("python_rss_mib"), peaks.get("server_pss_mib"),
            ])  # fmt: skip
    harness.print_table(
        rows,
        ["source", "run", "seconds", "records/s", "imported", "duplicates", "reused",
         "embedded", "peak RSS MiB", "PostgreSQL PSS MiB"],
    )  # fmt: skip
    for case in cases:
        for decision in case["first"]["vectors"]:
            print(f"{case['format']}: {decision}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
