"""Check 3 (namespace changed on incompatible change) agrees with the registry: a warming release may change
its fingerprint; two fingerprints served under one namespace still fail."""
from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from dashboard.checklist import run_checks
from dashboard.models import ConfigVersion
from tenants.models import Release
from tests.support.factories import (
    make_assignment,
    make_model,
    make_node,
    make_release,
    make_tenant,
)
from tests.support.rows import apply_config

pytestmark = pytest.mark.django_db

ADAPTER = {"name": "sql-lora", "path": "/models/sql-lora"}


def namespace_check():
    return {check.key: check for check in run_checks()}["namespace_changed"]


@pytest.fixture
def warming(operator):
    release = make_release(make_model(make_tenant("acme", quota="100GB")), "prod-a", state="warming")
    node = make_node("node-a")
    make_assignment(node, release, port=8000, role="prefill")
    apply_config(node)
    api = APIClient()
    api.force_authenticate(operator)
    return {"release": release, "node": node, "api": api}


def test_adapters_patched_on_a_warming_release_then_served_pass(warming):
    release, node, api = warming["release"], warming["node"], warming["api"]
    before = release.fingerprint
    response = api.patch(f"/api/v1/releases/{release.pk}/", {"adapters": [ADAPTER]}, format="json")
    assert response.status_code == 200, response.content
    release.refresh_from_db()
    assert release.fingerprint != before
    apply_config(node)  # the agents receive the warming release with its new fingerprint
    assert api.patch(f"/api/v1/releases/{release.pk}/", {"state": "serving"}, format="json").status_code == 200
    apply_config(node)

    fingerprints = {instance["release_fingerprint"] for document in
                    ConfigVersion.objects.filter(node_name="node-a").values_list("document", flat=True)
                    for instance in document["instances"]}
    assert fingerprints == {before, release.fingerprint}  # both went to the agent: only one served
    check = namespace_check()
    assert check.passed, check.details


def test_two_fingerprints_served_under_one_namespace_fail(warming):
    release, node = warming["release"], warming["node"]
    Release.objects.filter(pk=release.pk).update(state="serving")
    apply_config(node)
    served = ConfigVersion.objects.filter(node_name="node-a").latest("version")
    document = {**served.document, "instances": [
        {**instance, "release_fingerprint": "0" * 64} for instance in served.document["instances"]]}
    ConfigVersion.objects.create(node_name="node-a", version=served.version + 1, digest="e" * 64,
                                 content_digest="f" * 64, document=document)
    check = namespace_check()
    assert not check.passed and "namespace 'prod-a'" in check.details[0] and "2 fingerprints" in check.details[0]


def test_documents_without_release_state_count_as_serving(warming):
    node = warming["node"]
    first = ConfigVersion.objects.get(node_name="node-a")
    legacy = [{key: value for key, value in instance.items() if key != "release_state"}
              for instance in first.document["instances"]]
    for offset, fingerprint in enumerate(("1" * 64, "2" * 64), start=1):
        ConfigVersion.objects.create(
            node_name=node.name, version=first.version + offset, digest=str(offset) * 64,
            content_digest=str(offset + 4) * 64,
            document={**first.document, "instances": [{**i, "release_fingerprint": fingerprint} for i in legacy]})
    assert not namespace_check().passed
