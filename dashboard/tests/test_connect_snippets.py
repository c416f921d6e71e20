"""One Claude Desktop story: the dashboard, the README and the banner tell the same one.

Claude Desktop connects either over stdio on the machine that runs Recall
(what the first-run banner prints) or through mcp-remote from elsewhere
(what the dashboard shows). Each place that offers one says when to use the
other, and the mcp-remote configuration is the same in the dashboard and
the README.
"""

from __future__ import annotations

import html
import io
import json
import re
from typing import Any

from django.conf import settings

from recall import startup

README = (settings.BASE_DIR / "README.md").read_text()
SECRET = re.compile(r"recall_live_[A-Za-z0-9_-]{32}")


def snippet(page: str, name: str) -> dict[str, Any]:
    [block] = re.findall(rf'<pre data-snippet="{name}">(.*?)</pre>', page, flags=re.S)
    return json.loads(html.unescape(block))


def readme_block_after(marker: str) -> dict[str, Any]:
    after = README[README.index(marker) :]
    block = after.split("```json\n", 1)[1].split("```", 1)[0]
    return json.loads(block)


def test_the_dashboards_claude_desktop_configuration_is_the_readmes(cast, alice_client):
    page = alice_client.post("/keys/", {"name": "desktop", "tier": "free"}).content.decode()
    raw = SECRET.search(page)[0]

    shown = snippet(page, "claude-desktop")["mcpServers"]["recall"]
    documented = readme_block_after("*From another computer*")["mcpServers"]["recall"]

    assert shown["command"] == documented["command"] == "npx"
    assert shown["args"] == [
        "-y",
        "mcp-remote",
        "http://testserver/mcp",
        "--allow-http",  # http to a host other than this machine
        "--header",
        "Authorization:${AUTH_HEADER}",
    ]
    assert [a for a in shown["args"] if a != "--allow-http"][3:] == documented["args"][3:]
    assert shown["args"][:2] == documented["args"][:2]
    assert shown["env"] == {"AUTH_HEADER": f"Bearer {raw}"}
    assert set(documented["env"]) == {"AUTH_HEADER"}


def test_the_dashboard_says_when_the_stdio_configuration_is_the_better_one(cast, alice_client):
    page = alice_client.get("/usage/").content.decode()

    [note] = re.findall(r"<p [^>]*data-snippet-note>(.*?)</p>", page, flags=re.S)
    assert "On the machine that runs Recall" in note
    assert "recall stdio" in note
    assert "needs no Node.js" in note


def test_the_banner_says_where_the_other_configuration_is(db):
    out = io.StringIO()
    first = startup.FirstRun(
        email="admin@localhost", password="pw", api_key="recall_live_" + "x" * 32, tier="free"
    )

    startup.announce(first, out)

    banner = out.getvalue()
    assert '"args": [\n        "-m",\n        "recall",\n        "stdio"' in banner
    assert "Claude Desktop on another computer reaches this server through mcp-remote" in banner
    assert "dashboard's Keys page" in banner
    assert "*On the machine that runs Recall*" in README
    assert "the first-run banner prints" in README.split("*On the machine that runs Recall*")[1]
