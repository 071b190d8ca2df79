"""Fixtures of the registry tests: users, token clients, a small registry, store endpoints."""
from __future__ import annotations

import pytest
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from tenants.rendering import RenderTarget
from tests.registry.factories import (
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


@pytest.fixture
def operator(db, django_user_model):
    """A user with add/change/delete on every registry model (neither staff nor superuser)."""
    return grant_registry_writes(django_user_model.objects.create_user("operator", password="operator-pw"))


@pytest.fixture
def viewer(db, django_user_model):
    """A logged-in user without any permission: may read everything, write nothing."""
    return django_user_model.objects.create_user("viewer", password="viewer-pw")


@pytest.fixture
def superuser(db, django_user_model):
    return django_user_model.objects.create_superuser("root-admin", "root@example.com", "admin-pw")


def _token_client(user) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {Token.objects.create(user=user).key}")
    return client


@pytest.fixture
def api(operator) -> APIClient:
    """Client authenticated with the operator's token (not staff)."""
    return _token_client(operator)


@pytest.fixture
def viewer_api(viewer) -> APIClient:
    """Client authenticated with the viewer's token (no permissions)."""
    return _token_client(viewer)


@pytest.fixture
def admin_api(superuser) -> APIClient:
    """Client authenticated with a superuser's token."""
    return _token_client(superuser)


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
