"""The dashboard in a real browser, against the real server.

Headless Chromium (Debian's, driven by Playwright; no browser is downloaded)
signs in, creates a key, and watches the key's MCP calls arrive on the usage
page; then it revokes the key and the MCP endpoint refuses it. A screenshot
of each page is kept under artifacts/screenshots/.

Every test also watches the console: no page may break its
Content-Security-Policy (core/csp.py), and what the pages run (confirm before
a delete, a filter that submits itself, the admin's scripts) still runs.

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

from core import csp
from dashboard.tests.conftest import ADMIN_PAGES, DASHBOARD_PAGES
from tests.browser import accept_dialogs, csp_violations
from tests.support import LiveServer, store_memory

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


@pytest.fixture
def violations(page) -> list[str]:
    return csp_violations(page)


def sign_in(page: Any, server: LiveServer, password: str) -> None:
    page.goto(server.url + "/login/")
    page.fill("#id_username", "alice@example.com")
    page.fill("#id_password", password)
    page.click("button[type=submit]")
    page.wait_for_url(server.url + "/usage/")


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


def test_a_user_creates_a_key_sees_its_calls_and_revokes_it(password, server, page, violations):
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

    # 5. Revoke the key, once asked to confirm: the MCP endpoint refuses it from now on.
    page.goto(server.url + "/keys/")
    asked = accept_dialogs(page)
    page.locator("tr:has-text('browser test') button:has-text('Revoke')").click()
    page.wait_for_selector("text=Key revoked")
    assert asked == ["Revoke this key? Clients using it stop working at once."]
    assert page.locator("tr:has-text('browser test') .badge.off").inner_text() == "revoked"
    shoot(page, "7-keys-revoked")
    status, refused = mcp(server, raw, "list_memories", {})
    assert status == 401
    assert refused["error"]["data"]["error"]["code"] == "unauthorized"
    assert violations == []


def test_a_user_reviews_a_memorys_history_and_downloads_their_memories(
    cast, password, server, page, violations
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
    asked = accept_dialogs(page)
    page.locator(f"[data-memory-id='{memory_id}'] button:has-text('Delete')").click()
    page.wait_for_selector("text=Memory deleted")
    assert len(asked) == 1 and asked[0].startswith("Delete this memory? Its history stays")
    page.goto(server.url + "/memories/changes/")
    assert page.locator(".badge.action-deleted").count() == 1
    shoot(page, "9-recent-changes")
    assert violations == []


def test_a_user_undoes_a_replaced_mark_from_its_message_and_from_its_history(
    cast, password, server, page, violations
):
    raw = cast.alice_key.raw
    ids = []
    for content in ("Cormac works at Brackenfield.", "Cormac is a staff engineer at Marlowe."):
        status, stored = mcp(server, raw, "remember", {"content": content})
        assert status == 200, stored
        ids.append(stored["result"]["structuredContent"]["id"])
    older, newer = ids
    sign_in(page, server, password)
    search = server.url + "/memories/?q=Which+company+employs+Cormac%3F"

    # Replaced, from the mark on the search result: the message offers the undo.
    page.goto(search)
    marked = page.locator(f"[data-memory-id='{older}']")
    assert marked.locator(f"[data-may-be-replaced-by='{newer}']").count() == 1
    marked.get_by_role("button", name="Replaced: Cormac works at Brackenfield.").click()
    page.wait_for_selector("text=Marked as replaced")
    assert page.locator(f"[data-memory-id='{older}']").count() == 0
    undo = page.locator(".messages").get_by_role("button", name=f"Restore memory {older[:8]}")
    assert undo.count() == 1
    shoot(page, "10-replaced-with-undo")
    undo.click()
    page.wait_for_selector("text=Memory restored")
    assert page.url == search
    assert page.locator(f"[data-memory-id='{older}']").count() == 1

    # Replaced again; this time undone from the memory's history page.
    page.locator(f"[data-memory-id='{older}'] button:has-text('Replaced')").click()
    page.wait_for_selector("text=Marked as replaced")
    page.goto(f"{server.url}/memories/{older}/history/")
    assert page.locator("[data-version]").first.inner_text().startswith("v4 superseded")
    back = page.get_by_role("link", name="← Memories")
    assert back.get_attribute("href") == "/memories/?namespace=default&replaced=1"
    shoot(page, "11-replaced-history")
    page.locator("[data-replaced]").get_by_role("button", name="Restore").click()
    page.wait_for_selector("text=Memory restored")
    assert page.url == f"{server.url}/memories/{older}/history/"
    assert page.locator("[data-replaced]").count() == 0
    assert page.locator("[data-version]").first.inner_text().startswith("v5 restored")
    page.goto(search)
    assert page.locator(f"[data-memory-id='{older}']").count() == 1
    assert violations == []


def test_a_user_imports_a_letta_agent_file_from_the_memories_page(
    cast, password, server, page, violations
):
    from memories.tests.importing import FIXTURES

    page.goto(server.url + "/login/")
    page.fill("#id_username", "alice@example.com")
    page.fill("#id_password", password)
    page.click("button[type=submit]")
    page.wait_for_url(server.url + "/usage/")
    page.goto(server.url + "/memories/")
    page.select_option("#id_format", "letta")
    page.set_input_files("#id_file", str(FIXTURES / "letta.af"))
    page.click("button:has-text('Import')")
    page.wait_for_selector("text=progress is below")

    # The page refreshes itself while the job runs; the worker in the server runs it.
    row = page.locator("tr[data-status=done]:has-text('letta.af')")
    row.wait_for(timeout=60_000)
    assert "imported 5 · 0 duplicates · 0 refused" in row.inner_text()
    shoot(page, "8-memories-imported")
    page.goto(server.url + "/memories/")
    listed = page.locator(".memory .content").all_inner_texts()
    assert "Name: Ana. Lives in Lisbon. Likes hiking." in listed
    assert "data-refreshing" not in page.content()
    assert violations == []


@pytest.fixture
def operator(cast, agents, password) -> str:
    """Alice runs the server too (staff, superuser), with a memory for each of two agents."""
    cast.alice.is_staff = cast.alice.is_superuser = True
    cast.alice.save(update_fields=["is_staff", "is_superuser"])
    store_memory(cast.alice, "Research notes.", agent=agents.research)
    store_memory(cast.alice, "Writing notes.", agent=agents.writer)
    return password


def test_the_dashboard_and_the_admin_keep_to_their_content_security_policy(
    operator, server, page, violations
):
    for path in ("/login/", "/password_reset/", "/admin/login/"):
        assert page.goto(server.url + path).headers["content-security-policy"] == csp.POLICY
    sign_in(page, server, operator)
    for path in DASHBOARD_PAGES + ADMIN_PAGES:
        response = page.goto(server.url + path)
        assert response.ok, path
        assert response.headers["content-security-policy"] == csp.POLICY, path

    # The dashboard's script (a file): a filter submits itself, a delete asks first.
    page.goto(server.url + "/memories/")
    page.select_option("#id_agent_filter", label="research")
    page.wait_for_url(re.compile(r"[?&]agent="))
    assert page.locator(".memory .content").all_inner_texts() == ["Research notes."]
    asked = accept_dialogs(page)
    page.locator(".memory button:has-text('Delete')").click()
    page.wait_for_selector("text=Memory deleted")
    assert len(asked) == 1 and asked[0].startswith("Delete this memory?")

    # The admin's own stylesheet and ours (the text-box filters) apply without inline style.
    page.goto(server.url + "/admin/billing/usageevent/")
    box = page.locator(".input-filter input[type=search]").first.bounding_box()
    sidebar = page.locator("#changelist-filter").bounding_box()
    assert box is not None and sidebar is not None
    assert box["width"] > 0.8 * sidebar["width"], (box, sidebar)
    shoot(page, "admin-usage-events")

    # The admin's: ticking the list's box selects every row and counts them;
    # the key's user box (select2, jQuery) searches as one types.
    page.goto(server.url + "/admin/accounts/apikey/")
    rows = page.locator("#result_list tbody tr").count()
    page.check("#action-toggle")
    assert page.locator(".action-counter").inner_text() == f"{rows} of {rows} selected"
    page.goto(server.url + "/admin/accounts/apikey/add/")
    page.click(".field-user .select2-selection")
    page.fill(".select2-search__field", "charlie")
    page.wait_for_selector(".select2-results__option:has-text('charlie@example.com')")
    shoot(page, "admin-key-user-search")

    assert violations == []


def test_the_namespace_filter_steps_by_keyboard_and_goes_by_pointer(
    cast, password, server, page, violations
):
    # Each arrow press on the select reloaded the page (WCAG 3.2.2): a
    # keyboard could not step through the options.
    for namespace in ("alpha", "beta", "gamma"):
        arguments = {"content": f"A note in {namespace}.", "namespace": namespace}
        assert mcp(server, cast.alice_key.raw, "remember", arguments)[0] == 200
    sign_in(page, server, password)
    page.goto(server.url + "/memories/?namespace=alpha")

    select = page.locator("select[name=namespace]")
    select.focus()
    page.keyboard.press("ArrowDown")
    page.keyboard.press("ArrowDown")
    page.wait_for_timeout(300)

    assert page.url.endswith("namespace=alpha")
    assert select.input_value() == "gamma"
    page.click("button:has-text('Search')")
    page.wait_for_url(re.compile(r".*namespace=gamma.*"))
    assert "A note in gamma." in page.inner_text("main")
    # Stepped to and chosen with Enter, it goes.
    select = page.locator("select[name=namespace]")
    select.focus()
    page.keyboard.press("ArrowUp")
    page.keyboard.press("Enter")
    page.wait_for_url(re.compile(r".*namespace=beta.*"))
    # Picked without the keyboard, it goes at once.
    page.goto(server.url + "/memories/?namespace=gamma")
    page.locator("select[name=namespace]").select_option("beta")
    page.wait_for_url(re.compile(r".*namespace=beta.*"))
    assert violations == []
