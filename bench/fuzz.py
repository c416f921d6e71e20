"""Fuzz the MCP endpoints at length: tests/test_fuzz_*.py's hypothesis suites, more cases.

    python bench/fuzz.py                      # 1,500 cases per test: 16,500 in all
    python bench/fuzz.py --cases 5000         # per test
    python bench/fuzz.py --cases 200 -k tools # one suite

CI runs the same tests with 100 cases each. This runs them through pytest,
against the same real server the suite starts (uvicorn on a loopback port,
a throwaway embedded PostgreSQL), and prints how many requests each test
sent and what came back. Exit status is pytest's: non-zero if any invariant
broke, with hypothesis's shrunk example and a blob to replay it.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SUITES = ["tests/test_fuzz_tools.py", "tests/test_fuzz_http.py"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", type=int, default=1500, help="cases per fuzz test")
    parser.add_argument("-k", dest="select", help="pytest -k expression, to run some tests")
    args = parser.parse_args(argv)
    command = [sys.executable, "-m", "pytest", "-q", *SUITES, f"--fuzz-cases={args.cases}"]
    if args.select:
        command += ["-k", args.select]
    return subprocess.call(command, cwd=REPO)


if __name__ == "__main__":
    raise SystemExit(main())
