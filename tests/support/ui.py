"""Fixtures of the page tests (tests/dashboard/views, tests/dashboard/rollout): Django test clients logged in as
``operator`` / ``viewer`` (users from :mod:`tests.support.registry`), no real master or broker reached by accident
(autouse ``_isolated``)."""
from __future__ import annotations

import pytest

from agent.sim.master import free_ports


@pytest.fixture(autouse=True)
def _isolated(settings):
    """Cheap password hashing, no master quota sync on tenant changes, a master admin URL nobody listens on,
    and a fresh cache (the overview caches the master's metrics)."""
    from django.core.cache import cache

    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    settings.KVPOOL_MASTER_SYNC = False
    settings.KVPOOL_MASTER_ADMIN_URL = f"http://127.0.0.1:{free_ports(1)[0]}"
    settings.KVPOOL_MASTER_ADMIN_TIMEOUT_SECONDS = 1
    cache.clear()
    yield
    cache.clear()


@pytest.fixture
def viewer_ui(client, viewer):
    """Django test client logged in as ``viewer``."""
    client.force_login(viewer)
    return client


@pytest.fixture
def ui(client, operator):
    """Django test client logged in as ``operator``."""
    client.force_login(operator)
    return client
