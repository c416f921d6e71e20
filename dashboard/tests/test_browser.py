"""The dashboard in a real browser, against the real server.

Headless Chromium (Debian's, driven by Playwright; no browser is downloaded)
signs in, creates a key, and watches the key's MCP calls arrive on the usage
page; then it revokes the key and the MCP endpoint refuses it. A screenshot
of each page is kept under artifacts/screenshots/.

The test skips when Playwright or Chromium is missing; with
RECALL_NO_SKIPS=1, as in CI, that skip is a failure (see conftest.py).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.contrib.auth.hashers import PBKDF2PasswordHasher

from tests.support import LiveServer

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

CHROMIUM = os.environ.get("RECALL_TEST_CHROMIUM", "/usr/bin/chromium")
SCREENSHOTS = Path(settings.BASE_DIR) / "artifacts" / "screenshots"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


@pytest.fixture
def password(cast) -> str:
    """Give Alice a password the server can check.

    The tests' own hasher (MD5, for speed) is not among the server's.
    """
    password = "a-browser-password-1"
    cast.alice.password = PBKDF2PasswordHasher().encode(password, "browsertestsalt")
    cast.alice.save(update_fields=["password"])
    return password


@pytest.fixture
def server(transactional_db) -> Iterator[LiveServer]:
    with LiveServer() as live:
        yield live


@pytest.fixture
def page(server) -> Iterator[Any]:
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("Playwright is not installed (pip install playwright)")
    if not shutil.which(CHROMIUM):
        pytest.skip(f"Chromium is not at {CHROMIUM} (apt-get install chromium)")
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    # From here on this thread runs Playwright's event loop, so the test
    # itself must not touch the database: everything goes through HTTP.
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS
        )
        context = browser.new_context(viewport={"width": 1280, "height": 860})
        page = context.new_page()
        page.set_default_timeout(15_000)
        yield page
        context.close()
        browser.close()


def shoot(page: Any, name: str) -> None:
    page.screenshot(path=str(SCREENSHOTS / f"{name}.png"), full_page=True)


def mcp(server: LiveServer, raw_key: str, tool: str, arguments: dict[str, Any]) -> Any:
    """POST one JSON-RPC tools/call to /mcp, as any MCP client would."""
    body = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {"name": tool, "arguments": arguments},
    }
    request = urllib.request.Request(  # noqa: S310 - a loopback URL of our own
        server.mcp_url,
        data=json.dumps(body).encode(),
        method="POST",
        headers={
            "Authorization": f"Bearer {raw_key}",
            "Content-Type": "application/json",
            "Accept": "application/json, text/event-stream",
            "MCP-Protocol-Version": "2025-11-25",
        },
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:  # noqa: S310
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read() or b"{}")


def chart_count(page: Any, tool: str) -> int:
    counts = page.locator(f'svg.chart rect[data-tool="{tool}"]').evaluate_all(
        "rects => rects.map(r => Number(r.dataset.count))"
    )
    return sum(counts)


def test_a_user_creates_a_key_sees_its_calls_and_revokes_it(password, server, page):
    # 1. Sign in.
    page.goto(server.url + "/")
    assert page.url.startswith(server.url + "/login/")
    shoot(page, "1-sign-in")
    page.fill("#id_username", "alice@example.com")
    page.fill("#id_password", password)
    page.click("button[type=submit]")
    page.wait_for_url(server.url + "/usage/")
    assert page.locator("[data-stat=calls]").inner_text() == "0"
    assert server.mcp_url in page.content()  # the empty state says where to connect
    shoot(page, "2-usage-empty")

    # 2. Create a key and see it, once.
    page.click("nav >> text=Keys")
    page.fill("#id_name", "browser test")
    page.click("button:has-text('Create key')")
    raw = page.locator("#new-key").inner_text().strip()
    assert re.fullmatch(r"recall_live_[A-Za-z0-9_-]{32}", raw)
    shoot(page, "3-keys-new-key")
    page.goto(server.url + "/keys/")
    assert raw not in page.content()
    assert page.locator("tr:has-text('browser test') .badge.ok").inner_text() == "live"

    # 3. Call /mcp with it.
    status, listed = mcp(server, raw, "list_memories", {})
    assert status == 200, listed
    assert "error" not in listed
    status, stored = mcp(
        server, raw, "remember", {"content": "The user prefers dark mode in every editor."}
    )
    assert status == 200, stored
    assert not stored["result"].get("isError"), stored

    # 4. The usage page counts the calls (the server writes usage in the background).
    deadline = time.monotonic() + 15
    while True:
        page.goto(server.url + "/usage/")
        seen = chart_count(page, "list_memories") + chart_count(page, "remember")
        if seen >= 2 or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert chart_count(page, "list_memories") == 1
    assert chart_count(page, "remember") == 1
    assert page.locator("[data-stat=calls]").inner_text() == "2"
    shoot(page, "4-usage")

    page.goto(server.url + "/memories/")
    assert "dark mode" in page.locator(".memory .content").first.inner_text()
    shoot(page, "5-memories")
    page.goto(server.url + "/plan/")
    assert page.locator("[data-current-tier]").inner_text() == "Free"
    shoot(page, "6-plan")

    # 5. Revoke the key: the MCP endpoint refuses it from now on.
    page.goto(server.url + "/keys/")
    page.once("dialog", lambda dialog: dialog.accept())
    page.locator("tr:has-text('browser test') button:has-text('Revoke')").click()
    page.wait_for_selector("text=Key revoked")
    assert page.locator("tr:has-text('browser test') .badge.off").inner_text() == "revoked"
    shoot(page, "7-keys-revoked")
    status, refused = mcp(server, raw, "list_memories", {})
    assert status == 401
    assert refused["error"]["data"]["error"]["code"] == "unauthorized"


def test_a_user_reviews_a_memorys_history_and_downloads_their_memories(
    cast, password, server, page
):
    raw = cast.alice_key.raw
    status, stored = mcp(server, raw, "remember", {"content": "The user's bike is red."})
    assert status == 200, stored
    memory_id = stored["result"]["structuredContent"]["id"]
    mcp(server, raw, "update_memory", {"id": memory_id, "content": "The user's bike is blue."})

    page.goto(server.url + "/login/")
    page.fill("#id_username", "alice@example.com")
    page.fill("#id_password", password)
    page.click("button[type=submit]")
    page.wait_for_url(server.url + "/usage/")

    # The memory's history: both versions, newest first, made through /mcp.
    page.goto(server.url + "/memories/")
    page.click(f"a[href='/memories/{memory_id}/history/']")
    versions = page.locator("[data-version]")
    assert versions.count() == 2
    assert "blue" in versions.nth(0).inner_text()
    assert "red" in versions.nth(1).inner_text()
    assert "by mcp" in versions.nth(0).inner_text()
    shoot(page, "8-memory-history")

    # Download my memories: the browser saves one JSON line per memory.
    page.goto(server.url + "/memories/")
    with page.expect_download() as waiting:
        page.click("text=Download my memories")
    download = waiting.value
    assert download.suggested_filename.endswith(".jsonl")
    [record] = [json.loads(line) for line in Path(download.path()).read_text().splitlines()]
    assert record["content"] == "The user's bike is blue."
    assert [v["action"] for v in record["history"]] == ["created", "updated"]

    # Delete it; it is listed among the recent changes, history still readable.
    page.once("dialog", lambda dialog: dialog.accept())
    page.locator(f"[data-memory-id='{memory_id}'] button:has-text('Delete')").click()
    page.wait_for_selector("text=Memory deleted")
    page.goto(server.url + "/memories/changes/")
    assert page.locator(".badge.action-deleted").count() == 1
    shoot(page, "9-recent-changes")
