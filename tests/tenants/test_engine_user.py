"""``Tenant.engine_user``: the node account a tenant's engine instances run as (README "Users and permissions on a
node"), rendered into every launch (``LaunchSpec.user``); two tenants never share one."""
from __future__ import annotations

import pytest

from tenants.models import Tenant
from tenants.rendering import RenderTarget, render_assignment
from tests.support.factories import (
    make_assignment,
    make_model,
    make_node,
    make_release,
    make_tenant,
    refused,
    refused_save,
)

pytestmark = pytest.mark.django_db

ENDPOINTS = RenderTarget(master_server_address="127.0.0.1:50051", metadata_server="http://127.0.0.1:8080/metadata")


def test_the_default_account_is_per_tenant_and_an_own_one_is_rendered():
    acme, other = make_tenant("acme"), make_tenant("other", engine_user="svc-other")
    assert acme.engine_account == f"kvpool-t{acme.pk}" and other.engine_account == "svc-other"
    node = make_node()
    for tenant, port in ((acme, 8000), (other, 8001)):
        release = make_release(make_model(tenant, "m"))
        launch = render_assignment(make_assignment(node, release, port=port, gpu_ids=str(port - 8000)),
                                   ENDPOINTS).launch_spec()
        assert launch.user == tenant.engine_account


@pytest.mark.parametrize("value", ["Root", "has space", "x" * 33, "-dash", "a/b", "root", "kvpool-t12"])
def test_bad_or_reserved_names_are_refused(value):
    assert "engine_user" in refused(Tenant(tenant_id="t", quota_bytes=1 << 30, engine_user=value))


def test_two_tenants_cannot_share_an_account_and_the_message_names_no_one():
    make_tenant("acme", engine_user="svc-engines")
    errors = refused_save(Tenant(tenant_id="other", quota_bytes=1 << 30, engine_user="svc-engines"))
    assert errors == {"engine_user": ["engine_user 'svc-engines' is not available."]}
    make_tenant("third")  # blank is not a shared name
    make_tenant("fourth")
