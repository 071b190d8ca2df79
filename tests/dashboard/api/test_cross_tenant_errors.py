"""REST API: a write of tenant A refused because of tenant B's state says "not available" and names nothing of B
(not its tenant, groups, releases, instances, nor whether B's group still exists or how B uses a port)."""
from __future__ import annotations

import pytest

from tenants.models import Node
from tests.support.factories import (
    grant_role,
    make_assignment,
    make_group,
    make_model,
    make_node,
    make_release,
    make_tenant,
)
from tests.support.registry import token_client

pytestmark = pytest.mark.django_db
V1 = "/api/v1"
#: In every name of tenant B.
MARK = "bravo-secret"


@pytest.fixture
def shared_node() -> Node:
    return make_node("node-shared", "10.0.0.5")


@pytest.fixture
def alpha(shared_node):
    tenant = make_tenant("alpha-t")
    release = make_release(make_model(tenant, "alpha-model", "org/alpha-weights"), "alpha-ns")
    return tenant, release


@pytest.fixture
def bravo(shared_node):
    tenant = make_tenant(f"{MARK}-t")
    release = make_release(make_model(tenant, f"{MARK}-model", f"org/{MARK}-weights"), f"{MARK}-ns")
    make_group(tenant, f"{MARK}-grp", cache_salt="salt-b-live")
    make_group(tenant, f"{MARK}-gone", cache_salt="salt-b-gone").delete()
    make_assignment(shared_node, release, port=8001, role="prefill", bootstrap_port=8998)
    return tenant, release


@pytest.fixture
def alice_api(alpha, bravo, django_user_model):
    """An operator of tenant A (a member, not a platform admin)."""
    return token_client(grant_role(django_user_model.objects.create_user("alice"), alpha[0], "operator"))


def _clean_400(response, field: str) -> str:
    assert response.status_code == 400, response.content
    body = response.content.decode()
    assert MARK not in body and "bravo" not in body, body
    return response.json()[field][0]


def test_a_salt_of_another_tenant_is_not_available(alpha, alice_api):
    tenant = alpha[0].pk
    gone = _clean_400(alice_api.post(f"{V1}/request-groups/", {"tenant": tenant, "name": "g1",
                                                                "cache_salt": "salt-b-gone"}, format="json"),
                      "cache_salt")
    live = _clean_400(alice_api.post(f"{V1}/request-groups/", {"tenant": tenant, "name": "g2",
                                                                "cache_salt": "salt-b-live"}, format="json"),
                      "cache_salt")
    assert gone == live == "This cache_salt is not available; omit cache_salt to get a fresh one."


def test_a_salt_of_the_callers_own_deleted_group_is_named(alpha, alice_api):
    make_group(alpha[0], "mine", cache_salt="salt-a-gone").delete()
    response = alice_api.post(f"{V1}/request-groups/", {"tenant": alpha[0].pk, "name": "g3",
                                                        "cache_salt": "salt-a-gone"}, format="json")
    assert response.status_code == 400
    assert "this tenant's deleted request group 'mine'" in response.json()["cache_salt"][0]


def test_a_port_another_tenant_uses_is_not_available(alpha, shared_node, alice_api):
    body = {"node": shared_node.pk, "release": alpha[1].pk}
    on_port = _clean_400(alice_api.post(f"{V1}/assignments/", {**body, "port": 8001}, format="json"), "port")
    on_bootstrap = _clean_400(alice_api.post(f"{V1}/assignments/", {**body, "port": 8998}, format="json"), "port")
    assert on_port == ("Port 8001 is not available on node 'node-shared': another instance uses it. Choose another "
                       "port.")
    assert on_bootstrap == on_port.replace("8001", "8998")  # nothing tells how the other instance uses it
    as_bootstrap = _clean_400(alice_api.post(f"{V1}/assignments/", {**body, "port": 8100, "role": "decode",
                                                                    "bootstrap_port": 8001}, format="json"),
                              "bootstrap_port")
    assert as_bootstrap == on_port
