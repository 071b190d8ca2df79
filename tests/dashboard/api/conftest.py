"""Fixtures of the REST API tests: users, token clients, a small registry (autouse: cheap password hashing), the
real engine environment."""
from tests.support.engine import engine_python
from tests.support.registry import (
    admin_api,
    anon,
    api,
    endpoints,
    fast_password_hashing,
    fresh_throttles,
    node,
    operator,
    release,
    served_model,
    superuser,
    tenant,
    viewer,
    viewer_api,
)
