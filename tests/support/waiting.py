"""Polling helper shared by every test that waits for a process, a socket or a store to catch up."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest


def wait_for(predicate: Callable[[], Any], timeout: float = 60.0, what: str = "condition",
             interval: float = 0.1) -> Any:
    """Poll ``predicate`` every ``interval`` s until it returns something truthy and return that; fail the test
    naming ``what`` after ``timeout`` s. The timeout only guards against a hang: a loaded CI machine may take many
    times longer than a quiet one, so it is generous and no test relies on it for speed."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)
