"""Fixtures of the browser tests (tests/support/browser.py): headless Chromium, a logged-in page, screenshots
(autouse: the page tests' isolation plus an in-memory broker)."""
from tests.support.browser import _live_isolated, _memory_broker, browser, live_operator, page, shot
from tests.support.ui import _isolated
