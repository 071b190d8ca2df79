"""A screenshot of the dashboard's occupancy page in headless Chromium (Playwright driving Debian's chromium).

Chromium flags are the ones known to work on this kind of machine (no sandbox, no GPU, no background network).
"""
from __future__ import annotations

from pathlib import Path

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run", "--disable-quic"]


def occupancy_screenshot(base_url: str, username: str, password: str, path: str | Path, *,
                         window: str = "15m", timeout_ms: int = 30_000) -> Path:
    """Log in through the login form, open ``/occupancy/?window=...``, wait for the chart, save a full-page PNG.

    Raises:
        FileNotFoundError: ``/usr/bin/chromium`` is missing (``apt-get install chromium``).
        RuntimeError: the login failed or the chart did not render (``playwright`` errors pass through).
    """
    if not Path(CHROMIUM).exists():
        raise FileNotFoundError(f"{CHROMIUM} is missing: install Debian's chromium (make install-browser)")
    from playwright.sync_api import sync_playwright

    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        try:
            context = browser.new_context(viewport={"width": 1360, "height": 1000})
            context.set_default_timeout(timeout_ms)
            page = context.new_page()
            page.goto(f"{base_url}/accounts/login/?next=/")
            page.fill("#id_username", username)
            page.fill("#id_password", password)
            page.click("button[type=submit]")
            page.wait_for_load_state()
            if "/accounts/login/" in page.url:
                raise RuntimeError(f"login as {username!r} failed on {base_url}")
            page.goto(f"{base_url}/occupancy/?window={window}")
            page.wait_for_function("() => document.getElementById('occupancy-chart')?.dataset.state === 'ready'")
            page.wait_for_timeout(500)  # let the chart's animation settle
            page.screenshot(path=str(out), full_page=True)
        finally:
            browser.close()
    return out
