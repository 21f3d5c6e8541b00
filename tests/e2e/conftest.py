"""Fixtures the end-to-end files share: the browser (Debian's chromium, one per file)."""

from tests.e2e.browser import browser  # noqa: F401 - a fixture, offered to every file here
