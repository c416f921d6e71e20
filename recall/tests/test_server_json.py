"""server.json, the manifest for the official MCP registry, against the registry's own schemas.

``deploy/mcp-registry/`` keeps the 2025-12-11 schema twice, unmodified: the
copy published at the ``$schema`` address, and the copy the registry's
validator embeds (its README says where each came from, and why they
differ), so this test needs no network. Beyond the schemas, the manifest has
to agree with the project: the version, the package and the settings it
really reads (tests/test_server_json_endpoints.py checks the endpoints on a
live server).
"""

from __future__ import annotations

import copy
import hashlib
import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from django.conf import settings
from jsonschema import Draft7Validator, FormatChecker

ROOT = settings.BASE_DIR
MANIFEST = json.loads((ROOT / "server.json").read_text())
SCHEMAS = ROOT / "deploy" / "mcp-registry"
PUBLISHED = SCHEMAS / "server.schema.json"
REGISTRYS = SCHEMAS / "registry-2025-12-11.json"
PROVENANCE = (SCHEMAS / "README.md").read_text()
README = (ROOT / "README.md").read_text()
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]

formats = FormatChecker()
# RFC 6570 (level 1 is all the registry uses): literals without spaces,
# quotes or angle brackets, and {name} expressions.
TEMPLATE = re.compile(r"(?:[^\s\"'<>\\^`{|}]|\{[A-Za-z0-9_.%]+\})+")


@formats.checks("uri")
def is_uri(value: object) -> bool:
    # jsonschema checks "uri" only with an optional package installed; this is
    # the part of RFC 3986 the registry relies on: a scheme and a host.
    if not isinstance(value, str):
        return True
    parts = urlsplit(value)
    return bool(parts.scheme and parts.netloc) and not re.search(r"\s", value)


@formats.checks("uri-template")
def is_uri_template(value: object) -> bool:
    # Likewise: a template whose expressions, filled in, give a URI (a leading
    # expression, as in "{baseUrl}/mcp", stands for a scheme and host).
    if not isinstance(value, str):
        return True
    filled = re.sub(r"\{[^}]*\}", "x", re.sub(r"^\{[^}]*\}", "https://x", value))
    return bool(TEMPLATE.fullmatch(value)) and is_uri(filled)


def validator(path: Path) -> Draft7Validator:
    return Draft7Validator(json.loads(path.read_text()), format_checker=formats)


VALIDATORS = {"published": validator(PUBLISHED), "registry's": validator(REGISTRYS)}


def problems(manifest: dict[str, Any], schema: str) -> list[str]:
    errors = VALIDATORS[schema].iter_errors(manifest)
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in errors]


@pytest.mark.parametrize("schema", VALIDATORS)
def test_the_manifest_validates_against_the_registrys_schema(schema):
    assert MANIFEST["$schema"] == VALIDATORS[schema].schema["$id"]
    assert problems(MANIFEST, schema) == []


@pytest.mark.parametrize("path", [PUBLISHED, REGISTRYS], ids=lambda path: path.name)
def test_each_schema_is_the_recorded_upstream_copy(path):
    data = path.read_bytes()
    row = next(line for line in PROVENANCE.splitlines() if line.startswith(f"| `{path.name}`"))

    # Replacing a schema is a deliberate change: its source, size and digest are recorded.
    assert hashlib.sha256(data).hexdigest() in row
    assert f"{len(data):,} bytes" in row
    assert "static.modelcontextprotocol.io/schemas/2025-12-11/" in PROVENANCE
    assert "under the MIT License" in " ".join(PROVENANCE.split())


@pytest.mark.parametrize("schema", VALIDATORS)
@pytest.mark.parametrize(
    ("change", "complaint"),
    [
        (lambda m: m.update(description="x" * 101), "is too long"),
        (lambda m: m["packages"][0].update(version="latest"), "should not be valid"),
        (lambda m: m.update(name="recall"), "does not match"),
        (lambda m: m["remotes"][0].update(url="recall.example.com/mcp"), "not valid under any"),
        (lambda m: m["remotes"][0].update(url="https://{host name}/mcp"), "not valid under any"),
        (lambda m: m["packages"][0].update(transport={"type": "pipe"}), "not valid under any"),
    ],
    ids=["long description", "latest", "bare name", "no scheme", "space", "transport"],
)
def test_both_schemas_refuse_what_the_registry_refuses(schema, change, complaint):
    manifest = copy.deepcopy(MANIFEST)
    change(manifest)

    assert any(complaint in problem for problem in problems(manifest, schema))


def test_the_manifest_describes_this_version_and_package():
    [package] = MANIFEST["packages"]

    assert MANIFEST["version"] == PROJECT["version"]
    assert (package["identifier"], package["version"]) == (PROJECT["name"], PROJECT["version"])
    assert package["transport"] == {"type": "stdio"}
    # `uvx recall stdio`: the package's `recall` command, and its stdio mode.
    assert PROJECT["scripts"]["recall"] == "recall.cli:main"
    positional = [arg for arg in package["packageArguments"] if arg["type"] == "positional"]
    assert [arg["value"] for arg in positional] == ["stdio"]
    # The PyPI package proves it belongs to this name with a line in its README.
    assert f"mcp-name: {MANIFEST['name']}" in README
    owner = MANIFEST["name"].removeprefix("io.github.").split("/")[0]
    assert MANIFEST["repository"]["url"].startswith(f"https://github.com/{owner}/")


def test_the_manifest_lists_every_mcp_endpoint_the_server_mounts():
    from oauth import resources

    paths = [urlsplit(remote["url"]).path for remote in MANIFEST["remotes"]]

    # tests/test_server_json_endpoints.py checks each one's credentials live.
    assert sorted(paths) == sorted(resources.PATHS)
    for remote in MANIFEST["remotes"]:
        assert remote["type"] == "streamable-http"
        assert set(re.findall(r"\{(\w+)\}", remote["url"])) <= set(remote["variables"])


def test_every_option_of_the_package_is_one_recall_stdio_takes():
    [package] = MANIFEST["packages"]
    named = [arg for arg in package["packageArguments"] if arg["type"] == "named"]
    usage = subprocess.run(
        [sys.executable, "-m", "recall", "stdio", "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout

    assert named
    for option in named:
        assert f"{option['name']} {{{','.join(option['choices'])}}}" in usage, usage
        assert option["default"] in option["choices"]


def test_every_environment_variable_is_a_documented_setting():
    [package] = MANIFEST["packages"]
    configuration = README.split("## Configuration", 1)[1].split("\n## ", 1)[0]

    for variable in package["environmentVariables"]:
        assert f"`{variable['name']}`" in configuration, variable["name"]
    required = {v["name"] for v in package["environmentVariables"] if v.get("isRequired")}
    assert required == {"RECALL_API_KEY"}
