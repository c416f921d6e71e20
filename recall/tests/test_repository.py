"""What the repository holds: sources, never what a machine built from them."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def git(*args: str) -> list[str]:
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True)
    return done.stdout.splitlines()


def test_no_committed_file_is_one_the_ignore_rules_exclude():
    # A virtualenv committed before its ignore rule (.ci/audit-venv) named the
    # interpreter of the checkout that built it, so a fresh clone's audit ran
    # a pip-audit whose interpreter did not exist there.
    assert git("ls-files", "--cached", "--ignored", "--exclude-standard") == []
