"""Chromium for the browser tests, at the widths people use, and what to measure there.

Debian's Chromium, driven by Playwright (no browser is downloaded). A test
that needs it skips when Playwright or Chromium is missing; with
RECALL_NO_SKIPS=1, as in CI, that skip is a failure (see conftest.py).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings

CHROMIUM = os.environ.get("RECALL_TEST_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
SCREENSHOTS = Path(settings.BASE_DIR) / "artifacts" / "screenshots"
DESKTOP = {"width": 1366, "height": 860}
PHONE = {"width": 390, "height": 844}


def require_chromium() -> None:
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        pytest.skip("Playwright is not installed (pip install playwright)")
    if not shutil.which(CHROMIUM):
        pytest.skip(f"Chromium is not at {CHROMIUM} (apt-get install chromium)")


@contextmanager
def chromium() -> Iterator[Any]:
    """A headless Chromium; the thread that uses it must not touch the database meanwhile."""
    from playwright.sync_api import sync_playwright

    require_chromium()
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS
        )
        try:
            yield browser
        finally:
            browser.close()


def new_page(browser: Any, viewport: dict[str, int]) -> Any:
    page = browser.new_context(viewport=viewport).new_page()
    page.set_default_timeout(20_000)
    return page


def sign_in(page: Any, email: str, password: str) -> None:
    """Fill the sign-in form the page shows and wait for the next page."""
    page.fill("#id_username", email)
    page.fill("#id_password", password)
    with page.expect_navigation():
        page.click("button[type=submit]")


def csp_violations(page: Any) -> list[str]:
    """Collect what breaks the page's Content-Security-Policy, from now on, across navigations.

    Chromium reports each refusal (an inline script or style, a form sent
    where form-action forbids) on the page's console, and only there.
    """
    seen: list[str] = []

    def note(message: Any) -> None:
        if "Content Security Policy" in message.text:
            seen.append(message.text)

    page.on("console", note)
    return seen


def accept_dialogs(page: Any) -> list[str]:
    """Accept every dialog the page opens (a confirm() before a delete); return what each asked."""
    asked: list[str] = []

    def accept(dialog: Any) -> None:
        asked.append(dialog.message)
        dialog.accept()

    page.on("dialog", accept)
    return asked


def overflow(page: Any) -> int:
    """How many pixels the page is wider than the window (0: no sideways scrolling)."""
    return int(
        page.evaluate(
            "Math.max(document.documentElement.scrollWidth, document.body.scrollWidth)"
            " - window.innerWidth"
        )
    )


def out_of_view(page: Any, selector: str) -> list[str]:
    """Return the text of each element matching ``selector`` not wholly inside the window."""
    return list(
        page.locator(selector).evaluate_all(
            """(found) => found.filter((el) => {
                const box = el.getBoundingClientRect();
                const style = getComputedStyle(el);
                return box.width === 0 || box.height === 0 || style.visibility === 'hidden'
                    || box.left < 0 || box.right > window.innerWidth;
            }).map((el) => el.textContent.trim())"""
        )
    )


def shoot(page: Any, name: str) -> Path:
    path = SCREENSHOTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path
