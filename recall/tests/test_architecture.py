"""The house rules that keep the layout honest, checked on the source itself.

Each rule reads the project's modules with ``ast`` (tests, migrations and
benchmarks aside) and fails naming the file and line that breaks it.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
APPS = ("accounts", "billing", "dashboard", "memories", "recall")


@dataclass(frozen=True)
class Module:
    path: str  # relative to the repository, with forward slashes
    tree: ast.Module


def modules(root: Path = ROOT) -> Iterator[Module]:
    """Yield every application module: no tests, migrations or benchmarks."""
    for app in APPS:
        for file in sorted((root / app).rglob("*.py")):
            relative = file.relative_to(root).as_posix()
            parts = relative.split("/")
            if "tests" in parts or "migrations" in parts or relative == "recall/testing.py":
                continue
            yield Module(relative, ast.parse(file.read_text(encoding="utf-8"), relative))


def strings(tree: ast.AST) -> Iterator[ast.Constant]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            yield node


def names(tree: ast.AST) -> Iterator[tuple[str, int]]:
    """Yield every name the code uses, bare (``f``) or as an attribute (``m.f``)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            yield node.id, node.lineno
        elif isinstance(node, ast.Attribute):
            yield node.attr, node.lineno
        elif isinstance(node, ast.ImportFrom):
            for alias in node.names:
                yield alias.name, node.lineno


# One admission rule for rate limits ------------------------------------------------

ADMISSION = "accounts/admission.py"
LIMITER = "accounts/ratelimit.py"


def refusal_wordings(root: Path = ROOT) -> list[str]:
    return [
        f"{module.path}:{node.lineno}"
        for module in modules(root)
        for node in strings(module.tree)
        if "Rate limit for the" in node.value
    ]


def limiter_callers(root: Path = ROOT) -> list[str]:
    found = {
        (module.path, line, name)
        for module in modules(root)
        if module.path not in (ADMISSION, LIMITER)
        for name, line in names(module.tree)
        if name in ("get_rate_limiter", "limit_for_tier", "RateDecision")
    }
    return [f"{path}:{line} uses {name}" for path, line, name in sorted(found)]


def test_the_rate_limit_refusal_is_worded_in_one_place():
    assert [where.split(":")[0] for where in refusal_wordings()] == [ADMISSION]


def test_transports_reach_the_rate_limiter_only_through_admission():
    assert limiter_callers() == []


def test_the_admission_rules_catch_a_transport_that_limits_on_its_own(tmp_path):
    planted = tmp_path / "memories" / "mcp.py"
    planted.parent.mkdir()
    planted.write_text(
        "from accounts.ratelimit import get_rate_limiter, limit_for_tier\n"
        "def refuse(caller):\n"
        "    decision = get_rate_limiter().check('k', *limit_for_tier(caller.tier))\n"
        "    return f'Rate limit for the {caller.tier} tier exceeded.'\n"
    )

    assert refusal_wordings(tmp_path) == ["memories/mcp.py:4"]
    assert limiter_callers(tmp_path) == [
        "memories/mcp.py:1 uses get_rate_limiter",
        "memories/mcp.py:1 uses limit_for_tier",
        "memories/mcp.py:3 uses get_rate_limiter",
        "memories/mcp.py:3 uses limit_for_tier",
    ]
