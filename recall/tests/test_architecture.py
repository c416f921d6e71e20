"""The house rules that keep the layout honest, checked on the source itself.

Each rule reads the project's modules with ``ast`` (tests, migrations and
benchmarks aside) and fails naming the file and line that breaks it.
"""

from __future__ import annotations

import ast
import enum
import inspect
import re
import typing
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from django.apps import apps
from django.db import connection

from core import tenancy

ROOT = Path(__file__).resolve().parents[2]
APPS = ("accounts", "billing", "core", "dashboard", "memories", "oauth", "recall")


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
            if "tests" in parts or "migrations" in parts:
                continue
            yield Module(relative, ast.parse(file.read_text(encoding="utf-8"), relative))


def strings(tree: ast.AST) -> Iterator[tuple[str, int]]:
    """Yield every string literal (f-strings' literal parts too) with its line."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            yield node.value, node.lineno


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
        f"{module.path}:{line}"
        for module in modules(root)
        for text, line in strings(module.tree)
        if "Rate limit for the" in text
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


# An app's tables only through its services ---------------------------------------

# The tables under forced row-level security (core/tenancy.py). Every read
# or write of them must choose the tenant or the operator path, and an app's
# services are where that choice is made: so only the owning app's services,
# models and admin (which runs on the operator path) may touch them.
GUARDED_TABLES = set(tenancy.TENANT_TABLES)
# Tables without a model: the lexical index, derived from memories by triggers.
DERIVED_TABLES = {
    "search_documents": "memories",
    "search_terms": "memories",
    "search_namespaces": "memories",
    "search_metadata": "memories",
    "search_generations": "memories",
}
# search.py is the memories app's search service: recall, forget's preview and
# every retrieval tool rank through it, in the tenant transaction services open;
# results.py is its cache, which checks an answer in the same kind of transaction.
OWNER_MODULES = ("services.py", "search.py", "results.py", "models.py", "admin.py")
MANAGERS = {"objects", "_default_manager", "_base_manager"}
# Raw SQL naming a table: FROM t, JOIN t, INTO t, UPDATE t, TABLE t.
SQL_TABLE = re.compile(r"\b(?:from|join|into|update|table)\s+(?:only\s+)?\"?([a-z_]+)", re.I)


def guarded_models() -> dict[str, str]:
    """Return the guarded tables' model names, each with the app that owns it."""
    return {
        model.__name__: model._meta.app_label
        for model in apps.get_models()
        if model._meta.db_table in GUARDED_TABLES
    }


def table_owners() -> dict[str, str]:
    return {
        **DERIVED_TABLES,
        **{
            model._meta.db_table: model._meta.app_label
            for model in apps.get_models()
            if model._meta.db_table in GUARDED_TABLES
        },
    }


def may_touch(path: str, app: str) -> bool:
    parts = path.split("/")
    # An app's services may be a package of modules (memories/services/).
    return parts in ([app, name] for name in OWNER_MODULES) or parts[:2] == [app, "services"]


def model_name(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def table_trespasses(root: Path = ROOT) -> list[str]:
    """Return every place outside the owner's services, models and admin that touches a table."""
    models, tables = guarded_models(), table_owners()
    found: set[tuple[str, int, str]] = set()
    for module in modules(root):
        for node in ast.walk(module.tree):
            if not isinstance(node, ast.expr):
                continue
            touched = None
            if isinstance(node, ast.Attribute) and node.attr in MANAGERS:
                name = model_name(node.value)
                if name in models:
                    touched = (models[name], f"{name}.{node.attr}")
            elif isinstance(node, ast.Call):
                name = model_name(node.func)
                if name in models:
                    touched = (models[name], f"{name}(...)")
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                for table in SQL_TABLE.findall(node.value):
                    if table.lower() in tables:
                        touched = (tables[table.lower()], f"SQL on {table.lower()}")
            if touched is not None and not may_touch(module.path, touched[0]):
                found.add((module.path, node.lineno, touched[1]))
    return [f"{path}:{line} {what}" for path, line, what in sorted(found)]


def test_the_guarded_tables_are_the_ones_under_row_level_security(db):
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT relname FROM pg_class WHERE relforcerowsecurity AND relkind = 'r'"
            " AND relnamespace = 'public'::regnamespace"
        )
        forced = {name for (name,) in cursor.fetchall()}

    assert forced == GUARDED_TABLES
    assert set(guarded_models()) == {
        "Memory",
        "ForgetConfirmation",
        "MemoryHistory",
        "Job",
        "ImportChunk",
        "ApiKey",
        "Agent",
        "UsageEvent",
    }


def test_only_the_owning_apps_services_models_and_admin_touch_its_tables():
    assert table_trespasses() == []


# Every app's tables, not only the guarded ones ------------------------------------------

OUR_APPS = ("accounts", "billing", "memories", "oauth")
# Modules that must touch an app's tables outside its services, each for a reason:
# django-oauth-toolkit calls them with its own requests and expects them to
# read and write its models (the grant flow, token checks, the consent page).
EXEMPT = {
    "oauth/validators.py": "django-oauth-toolkit's request validator: saves grants and tokens",
    "oauth/tokens.py": "the MCP SDK's token verifier: reads tokens as the toolkit stores them",
}


def owned_models() -> dict[str, str]:
    """Return every model of the project's apps by class name, with the app that owns it."""
    return {
        model.__name__: model._meta.app_label
        for model in apps.get_models()
        if model._meta.app_label in OUR_APPS
    }


def owned_tables() -> dict[str, str]:
    return {
        **DERIVED_TABLES,
        **{
            model._meta.db_table: model._meta.app_label
            for model in apps.get_models()
            if model._meta.app_label in OUR_APPS
        },
    }


def ownership_trespasses(root: Path = ROOT, exempt: dict[str, str] = EXEMPT) -> list[str]:
    """Return every place outside an app's services, models and admin that touches its tables."""
    models, tables = owned_models(), owned_tables()
    found: set[tuple[str, int, str]] = set()
    for module in modules(root):
        if module.path in exempt:
            continue
        for node in ast.walk(module.tree):
            if not isinstance(node, ast.expr):
                continue
            touched = None
            if isinstance(node, ast.Attribute) and node.attr in MANAGERS:
                name = model_name(node.value)
                if name in models:
                    touched = (models[name], f"{name}.{node.attr}")
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                for table in SQL_TABLE.findall(node.value):
                    if table.lower() in tables:
                        touched = (tables[table.lower()], f"SQL on {table.lower()}")
            if touched is not None and not may_touch(module.path, touched[0]):
                found.add((module.path, node.lineno, touched[1]))
    return [f"{path}:{line} {what}" for path, line, what in sorted(found)]


def test_every_apps_tables_are_touched_only_through_its_services():
    assert ownership_trespasses() == []


def test_the_ownership_rule_covers_every_app_and_names_its_exemptions(tmp_path):
    file = tmp_path / "dashboard" / "forms.py"
    file.parent.mkdir(parents=True)
    file.write_text(
        "from accounts.models import User\n"
        "def taken(email):\n"
        "    return User.objects.filter(email=email).exists()\n"
    )
    (tmp_path / "oauth").mkdir()
    (tmp_path / "oauth" / "validators.py").write_text(
        "from oauth.models import Grant\nGrant.objects.all()\n"
    )

    assert ownership_trespasses(tmp_path) == ["dashboard/forms.py:3 User.objects"]
    assert set(owned_models()) >= {"User", "Subscription", "Application", "Memory"}


# The import graph -------------------------------------------------------------------------

# The base layer: what every app and the project stand on.
BASE = "core"
MAX_LINES = 800


def imports(root: Path = ROOT) -> dict[str, set[str]]:
    """Return each product module's imports of other product modules, by path."""
    found = {module.path: module for module in modules(root)}

    def resolve(name: str) -> str | None:
        path = name.replace(".", "/")
        for candidate in (f"{path}.py", f"{path}/__init__.py"):
            if candidate in found:
                return candidate
        return None

    graph: dict[str, set[str]] = {}
    for path, module in found.items():
        targets: set[str] = set()
        for node in ast.walk(module.tree):
            if isinstance(node, ast.Import):
                targets.update(t for alias in node.names if (t := resolve(alias.name)))
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                for alias in node.names:
                    target = resolve(f"{node.module}.{alias.name}") or resolve(node.module)
                    if target:
                        targets.add(target)
        targets.discard(path)
        graph[path] = targets
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Return the import cycles: strongly connected groups of two or more modules."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


def base_imports_up(graph: dict[str, set[str]]) -> list[str]:
    return sorted(
        f"{path} imports {target}"
        for path, targets in graph.items()
        if path.startswith(f"{BASE}/")
        for target in targets
        if not target.startswith(f"{BASE}/")
    )


def oversized(root: Path = ROOT) -> list[str]:
    return [
        f"{module.path}: {lines} lines"
        for module in modules(root)
        if (lines := len((root / module.path).read_text(encoding="utf-8").splitlines())) > MAX_LINES
    ]


def test_no_product_modules_import_each_other_in_a_cycle():
    assert cycles(imports()) == []


def test_the_base_layer_imports_no_app_and_not_the_project():
    assert base_imports_up(imports()) == []


def test_no_product_module_is_over_800_lines():
    assert oversized() == []


def test_the_import_rules_catch_a_cycle_an_upward_import_and_a_long_module(tmp_path):
    def plant(path: str, source: str) -> None:
        file = tmp_path / path
        file.parent.mkdir(parents=True, exist_ok=True)
        file.write_text(source)

    plant("memories/jobs.py", "from memories import services\n")
    plant("memories/services.py", "from memories.jobs import wake\n")
    plant("core/errors.py", "from accounts.models import User\n")
    plant("accounts/models.py", "x = 1\n" * (MAX_LINES + 1))
    graph = imports(tmp_path)

    assert cycles(graph) == [["memories/jobs.py", "memories/services.py"]]
    assert base_imports_up(graph) == ["core/errors.py imports accounts/models.py"]
    assert oversized(tmp_path) == [f"accounts/models.py: {MAX_LINES + 1} lines"]


def test_the_table_rule_catches_queries_and_sql_from_other_modules(tmp_path):
    def plant(path: str, source: str) -> None:
        file = tmp_path / path
        file.parent.mkdir(parents=True, exist_ok=True)
        file.write_text(source)

    plant(
        "dashboard/views.py",
        "from memories.models import Memory\n"
        "def namespaces(user_id):\n"
        "    return Memory.objects.filter(user_id=user_id).values('namespace')\n",
    )
    plant(
        "billing/usage.py",
        "from billing import models\n"
        "def write(cursor, events):\n"
        "    cursor.execute('UPDATE api_keys SET last_used_at = now() WHERE id = %s', [1])\n"
        "    models.UsageEvent._default_manager.bulk_create(models.UsageEvent() for e in events)\n",
    )
    plant(
        "billing/services.py",
        "from memories.models import Memory\n"
        "def quota(user_id):\n"
        "    return Memory.objects.filter(user_id=user_id).count()\n",
    )
    plant(
        "memories/services.py",
        "from memories.models import Memory\n"
        "def count():\n"
        "    return Memory.objects.count()  # its own table: allowed\n",
    )
    plant("memories/tests/test_x.py", "Memory.objects.all()  # tests are free to\n")

    assert table_trespasses(tmp_path) == [
        "billing/services.py:3 Memory.objects",
        "billing/usage.py:3 SQL on api_keys",
        "billing/usage.py:4 UsageEvent(...)",
        "billing/usage.py:4 UsageEvent._default_manager",
        "dashboard/views.py:3 Memory.objects",
    ]


# Types at the service boundary ------------------------------------------------------------


def loose_types(namespace: object) -> list[str]:
    """Return each public function or type of ``namespace`` whose annotations hold ``Any``.

    Raw input is ``object`` (validated inside); what comes back is a typed
    value (a dataclass, a TypedDict, an enum). A missing annotation counts too.
    """

    def holds_any(hint: object) -> bool:
        return hint is Any or any(holds_any(arg) for arg in typing.get_args(hint))

    found = []
    for name in sorted(getattr(namespace, "__all__", ())):
        value = getattr(namespace, name)
        if inspect.isfunction(value):
            hints = typing.get_type_hints(value)
            unannotated = [
                p
                for p in inspect.signature(value).parameters
                if p not in hints and p not in ("self", "cls")
            ]
            found += [f"{name}({p}) is not annotated" for p in unannotated]
        elif inspect.isclass(value) and not issubclass(value, enum.Enum):
            hints = typing.get_type_hints(value)
        else:
            continue
        found += [f"{name}: {key}" for key, hint in hints.items() if holds_any(hint)]
    return found


def test_the_memory_services_take_and_return_typed_values():
    from memories import services

    assert loose_types(services) == []


def test_the_boundary_rule_catches_any_and_unannotated_parameters():
    class Planted:
        __all__ = ["loose", "bare"]

        @staticmethod
        def loose(*, query: Any) -> dict[str, Any]:
            return {}

        @staticmethod
        def bare(*, query) -> int:
            return 0

    assert loose_types(Planted) == [
        "bare(query) is not annotated",
        "loose: query",
        "loose: return",
    ]
