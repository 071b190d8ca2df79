"""Fixtures of the page tests: a logged-in operator, no real master or broker reached by accident."""
from __future__ import annotations

import pytest

from agent.sim.master import free_ports
from tests.registry.factories import grant_registry_writes


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
def operator(db, django_user_model):
    """A user with add/change/delete on every registry model (neither staff nor superuser)."""
    return grant_registry_writes(django_user_model.objects.create_user("operator", password="operator-pw"))


@pytest.fixture
def viewer(db, django_user_model):
    """A user without any permission: may look at every page, change nothing."""
    return django_user_model.objects.create_user("viewer", password="viewer-pw")


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


@pytest.fixture
def api(operator):
    """REST client with the same user (for comparing the API's answers with the forms')."""
    from rest_framework.test import APIClient

    client = APIClient()
    client.force_authenticate(operator)
    return client
