"""Fixtures of the registry tests: users, token clients, a small registry, store endpoints."""
from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from tenants.rendering import RenderTarget
from tests.support.factories import (
    PLATFORM_ADMIN,
    grant,
    grant_registry_writes,
    make_model,
    make_node,
    make_release,
    make_tenant,
)


@pytest.fixture(autouse=True)
def fast_password_hashing(settings):
    """PBKDF2 costs ~0.3 s per user on this machine; the tests do not need it."""
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture(autouse=True)
def fresh_throttles():
    """DRF's throttles count requests in the default cache (per process): each test starts from zero."""
    from django.core.cache import cache

    cache.clear()
    yield
    cache.clear()


@pytest.fixture
def operator(db, django_user_model):
    """A platform admin with add/change/delete on every registry model (neither staff nor superuser)."""
    return grant_registry_writes(django_user_model.objects.create_user("operator", password="operator-pw"))


@pytest.fixture
def viewer(db, django_user_model):
    """A platform admin without any model permission: sees every tenant, may write nothing (a tenant member
    without a role that grants a write is tested in tests/dashboard/api/test_tenant_access.py)."""
    return grant(django_user_model.objects.create_user("viewer", password="viewer-pw"), PLATFORM_ADMIN)


@pytest.fixture
def superuser(db, django_user_model):
    return django_user_model.objects.create_superuser("root-admin", "root@example.com", "admin-pw")


def api_token(user) -> str:
    """A new API token of ``user`` (django-rest-knox; only its digest is stored)."""
    from dashboard.api.tokens import create_token

    return create_token(user)[1]


def token_client(user) -> APIClient:
    """An API client sending a new token of ``user`` (``Authorization: Token <token>``)."""
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {api_token(user)}")
    return client



@pytest.fixture
def api(operator) -> APIClient:
    """Client authenticated with the operator's token (not staff)."""
    return token_client(operator)


@pytest.fixture
def viewer_api(viewer) -> APIClient:
    """Client authenticated with the viewer's token (no permissions)."""
    return token_client(viewer)


@pytest.fixture
def admin_api(superuser) -> APIClient:
    """Client authenticated with a superuser's token."""
    return token_client(superuser)


@pytest.fixture
def anon() -> APIClient:
    return APIClient()


@pytest.fixture
def tenant(db):
    return make_tenant()


@pytest.fixture
def served_model(tenant):
    return make_model(tenant)


@pytest.fixture
def release(served_model):
    return make_release(served_model)


@pytest.fixture
def node(db):
    return make_node()


@pytest.fixture
def endpoints() -> RenderTarget:
    """The Store endpoints rendered configs point at (``agent.contract.messages.StoreEndpoints``, here as the
    ``RenderTarget`` that adds the master's admin URL and the node's config directory)."""
    return RenderTarget(
        master_server_address="10.0.0.9:50051",
        metadata_server="http://10.0.0.9:8080/metadata",
        protocol="tcp",
        global_segment_size=1 << 30,
        local_buffer_size=64 << 20,
        admin_url="http://10.0.0.9:9003",
        config_dir="/etc/kvpool",
    )
