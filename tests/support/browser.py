"""Browser tests: real headless Chromium (Debian ``chromium``, driven by Playwright's sync API) against
pytest-django's ``live_server``. One browser per session; one context (cookies, clipboard) per test.

Playwright's sync API runs an event loop in the test thread, so Django's async-safety guard is relaxed for
these tests (``DJANGO_ALLOW_ASYNC_UNSAFE``). Registry writes commit (``transaction=True``), which fires the
on-commit config push and quota sync: the dashboard's Celery app is pointed at an in-memory broker and master
sync is off, so nothing reaches a real Redis or master. Screenshots go to ``test-artifacts/screenshots/``.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.support.paths import ROOT

os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run", "--disable-quic"]
SCREENSHOTS = ROOT / "test-artifacts" / "screenshots"
PASSWORD = "operator-pw"


@pytest.fixture(scope="session")
def browser():
    """One headless Chromium for the whole session."""
    if not os.access(CHROMIUM, os.X_OK):
        pytest.fail(f"{CHROMIUM} is missing: install Debian's chromium (`make install-browser` or "
                    "`apt-get install chromium`)")
    from playwright.sync_api import sync_playwright

    playwright = sync_playwright().start()
    browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
    yield browser
    browser.close()
    playwright.stop()


@pytest.fixture
def _memory_broker():
    from dashboard.celery import app, use_broker

    previous = app.conf.broker_url
    use_broker("memory://localhost/")
    yield
    use_broker(previous)


@pytest.fixture(autouse=True)
def _live_isolated(_isolated, _memory_broker):
    """The page tests' isolation (``tests.support.ui._isolated``) plus an in-memory broker for the on-commit push."""
    yield


@pytest.fixture
def live_operator(transactional_db, django_user_model):
    """``operator`` committed for the live server (``transactional_db``): add/change/delete on every registry
    model (pages need them for their forms)."""
    from tests.support.factories import grant_registry_writes

    return grant_registry_writes(django_user_model.objects.create_user("operator", password=PASSWORD))


@pytest.fixture
def page(browser, live_server, live_operator):
    """A logged-in page (through the login form) in a fresh browser context."""
    context = browser.new_context(base_url=live_server.url, viewport={"width": 1280, "height": 900})
    context.grant_permissions(["clipboard-read", "clipboard-write"], origin=live_server.url)
    context.set_default_timeout(15_000)
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.goto("/")
    assert "/accounts/login/" in page.url
    page.fill("#id_username", live_operator.username)
    page.fill("#id_password", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_url(f"{live_server.url}/")
    yield page
    context.close()
    assert errors == [], f"JavaScript errors: {errors}"


@pytest.fixture
def shot():
    """``shot(page, name)`` saves a full-page screenshot as ``test-artifacts/screenshots/<name>.png``."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)

    def take(page, name: str) -> Path:
        path = SCREENSHOTS / f"{name}.png"
        page.screenshot(path=str(path), full_page=True)
        assert path.stat().st_size > 0
        return path

    return take
