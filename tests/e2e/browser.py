"""A real browser for the console's end-to-end tests: Debian's chromium driven by Playwright
(its own browser download is never used). Missing, the tests skip, unless
DEEPPOD_REQUIRE_BROWSER is set (CI sets it: there a missing browser fails)."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

# DEEPPOD_UI_SCREENSHOTS=docs/ui refreshes the pictures docs/ui.md shows; by default they go
# to a temporary folder, so a test run leaves the tree as it was
SCREENSHOTS = Path(os.environ.get("DEEPPOD_UI_SCREENSHOTS") or Path(tempfile.gettempdir()) / "deeppod-ui-screenshots")


def chromium_path() -> str:
    found = os.environ.get("DEEPPOD_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    if found:
        return found
    if os.environ.get("DEEPPOD_REQUIRE_BROWSER"):
        pytest.fail("no chromium on PATH: apt-get install chromium (.ci/run does)")
    pytest.skip("no chromium on PATH: apt-get install chromium to run the console's browser tests")


@pytest.fixture(scope="module")
def browser():
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        if os.environ.get("DEEPPOD_REQUIRE_BROWSER"):
            raise
        pytest.skip("playwright is not installed (pip install -e '.[dev]')")
    path = chromium_path()
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=path, args=["--no-sandbox", "--disable-dev-shm-usage"])
        yield b
        b.close()


def sign_in(browser, url: str, token: str):
    """A new browser context (its own cookies) signed in with ``token``: its page."""
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    page.set_default_timeout(20_000)
    page.goto(url + "/jobs")
    assert "/login" in page.url
    page.fill("#token", token)
    page.click("#login button[type=submit]")
    page.wait_for_url(url + "/jobs")
    return page


def shot(page, name: str) -> None:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / f"{name}.png"), full_page=True)
