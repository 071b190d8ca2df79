"""Fixtures of the registry tests: users, token clients, a small registry, store endpoints (autouse: cheap
password hashing)."""
from tests.support.registry import (
    admin_api,
    anon,
    api,
    endpoints,
    fast_password_hashing,
    node,
    operator,
    release,
    served_model,
    superuser,
    tenant,
    viewer,
    viewer_api,
)
