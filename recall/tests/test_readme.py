"""The README's first screens: what a new user copies has to work as written."""

from __future__ import annotations

import json
import os
import re

import anyio
import pytest
from django.conf import settings

from memories.mcp import build_server

README = (settings.BASE_DIR / "README.md").read_text()
INSTALL_NODE = (settings.BASE_DIR / ".ci" / "install-node").read_text()
INSPECTOR_PACKAGE = (
    settings.BASE_DIR / ".ci" / "node" / "node_modules" / "@modelcontextprotocol" / "inspector"
)


def tool_rows() -> dict[str, str]:
    """Return each tool's row(s) of the README's tool table, continuation rows joined."""
    rows: dict[str, str] = {}
    section = README.split("## The tools", 1)[1].split("\n\n", 2)[1]
    current = ""
    for line in section.splitlines()[2:]:
        cells = [cell.strip() for cell in line.strip().strip("|").split(" | ")]
        current = cells[0].strip("`") or current
        rows[current] = rows.get(current, "") + " " + " ".join(cells[1:])
    return rows


def test_every_npx_command_pins_the_version_ci_tests():
    tested = re.search(r"@modelcontextprotocol/inspector@([0-9.]+)", INSTALL_NODE)
    assert tested is not None
    commands = re.findall(r"npx (?:-y )?(\S+)", README)

    assert commands
    for package in commands:
        assert package == f"@modelcontextprotocol/inspector@{tested[1]}", package


def test_the_readme_states_the_node_version_the_inspector_requires():
    if not (INSPECTOR_PACKAGE / "package.json").exists():
        message = "MCP Inspector is not installed: run .ci/install-node"
        if os.environ.get("RECALL_REQUIRE_NODE") == "1":
            pytest.fail(message)
        pytest.skip(message)
    engines = json.loads((INSPECTOR_PACKAGE / "package.json").read_text())["engines"]["node"]
    major, minor = re.fullmatch(r">=(\d+)\.(\d+)\.\d+", engines).groups()

    assert f"Node {major}.{minor} or newer" in README


def test_the_tool_table_gives_every_default_an_agent_relies_on():
    rows = tool_rows()
    tools = anyio.run(build_server().list_tools)

    assert set(rows) == {tool.name for tool in tools}
    for tool in tools:
        for name, schema in tool.input_schema["properties"].items():
            default = schema.get("default")
            if default is None:
                continue
            described = re.findall(rf"`{name}` \(([^)]*)\)", rows[tool.name])
            # As an agent sees it: JSON's false, not Python's False.
            spelled = default if isinstance(default, str) else json.dumps(default)
            assert any(spelled in text for text in described), (tool.name, name, default)


def test_every_recall_command_the_readme_names_is_one_the_cli_runs():
    from recall import cli

    known = {"serve", "stdio", "worker", "doctor", "manage", *cli.ADMIN_COMMANDS}
    named = set(re.findall(r"(?:^|`|/bin/)recall ([a-z][a-z-]+)", README, re.M))
    targets = set(re.findall(r"`make ([a-z]+)`", README))
    makefile = (settings.BASE_DIR / "Makefile").read_text()

    assert {"serve", "doctor", "set-tier"} <= named
    assert named <= known, named - known
    for target in targets:
        assert re.search(rf"^{target}:", makefile, re.M), target


def test_troubleshooting_names_every_tenant_table_doctor_checks():
    from core import tenancy

    item = README.split("- **row-level security** enabled and forced", 1)[1].split("\n- ", 1)[0]

    assert set(re.findall(r"`([a-z_]+)`", item)) >= tenancy.TENANT_TABLES


def configuration_names() -> set[str]:
    """Return the names the README's tables give in a row's first cell.

    A cell may name several (`EMAIL_HOST`, `EMAIL_PORT`), or a family once:
    `RATE_LIMIT_STARTER` / `_PRO` / `_TEAM`.
    """
    names: set[str] = set()
    for line in README.splitlines():
        if not line.startswith("| `"):
            continue
        full = ""
        for token in re.findall(r"`(_?[A-Z][A-Z0-9_]*)`", line.split(" | ", 1)[0]):
            if token.startswith("_") and full:
                names.add(full.rsplit("_", 1)[0] + token)
            else:
                full = token
                names.add(token)
    return names


def test_every_setting_read_from_the_environment_is_in_the_configuration_table():
    source = (settings.BASE_DIR / "recall" / "settings.py").read_text()
    read = set(re.findall(r'env\.\w+\(\s*"([A-Z][A-Z0-9_]+)"', source))

    assert len(read) > 50  # the pattern still finds them
    assert sorted(read - configuration_names()) == []
