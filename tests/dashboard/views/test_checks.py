"""The seed's checklist as live checks: each item passes on a healthy deployment and fails on its violation."""
from __future__ import annotations

import pytest
from django.urls import reverse
from django.utils import timezone

from dashboard.checklist import run_checks
from dashboard.models import ConfigVersion
from tenants.models import RequestGroup
from tests.support.factories import (
    make_assignment,
    make_group,
    make_model,
    make_node,
    make_release,
    make_tenant,
)
from tests.support.rows import apply_config, master_sample, sample

pytestmark = pytest.mark.django_db
GB = 1 << 30


def results() -> dict:
    return {check.key: check for check in run_checks()}


@pytest.fixture
def healthy():
    tenant = make_tenant("acme", quota="100GB")
    model = make_model(tenant)
    release = make_release(model, "prod-a", state="serving")
    make_group(tenant, "app-a", cache_salt="salt-a")
    node = make_node("node-a")
    make_assignment(node, release, port=8000, role="prefill")
    make_assignment(node, release, port=8001, role="decode")
    apply_config(node)
    sample(namespace="prod-a", group="app-a", size=GB)
    return {"tenant": tenant, "model": model, "release": release, "node": node}


def test_healthy_deployment_passes_every_check(healthy):
    checks = run_checks()
    assert [c.key for c in checks][:5] == ["names_stable", "pd_identical", "namespace_changed", "salts_stable",
                                           "overlap_capacity"]
    assert [c.key for c in checks][5:8] == ["engines_hash_registered", "blocks_registered", "engine_events_flow"]
    assert "quota_capacity" in [c.key for c in checks[8:]]
    assert all(c.passed for c in checks), [(c.key, c.details) for c in checks if not c.passed]
    assert results()["pd_identical"].summary == "2 instance(s) apply exactly what their release prescribes"
    assert results()["overlap_capacity"].summary == "no release overlap in progress"


def test_names_unknown_to_the_registry_fail(healthy):
    sample(namespace="random-4f2a", size=1)
    sample(namespace="prod-a", group="ghost-group", size=1)
    check = results()["names_stable"]
    assert not check.passed
    assert any("release namespace 'random-4f2a' is not registered" in d for d in check.details)
    assert any("request group 'ghost-group' is not registered" in d for d in check.details)


def test_an_instance_renamed_between_config_versions_fails(healthy):
    version = ConfigVersion.objects.get(node_name="node-a")
    document = {**version.document, "instances": [
        {**instance, "namespace": "renamed"} for instance in version.document["instances"]]}
    ConfigVersion.objects.create(node_name="node-a", version=version.version + 1, digest="e" * 64,
                                 content_digest="f" * 64, document=document)
    check = results()["names_stable"]
    assert not check.passed and "changed names from acme/qwen3-8b/prod-a" in check.details[0]


def test_values_an_agent_applied_that_differ_from_the_release_fail(healthy):
    from dashboard.models import NodeState

    version = ConfigVersion.objects.get(node_name="node-a")
    instances = version.document["instances"]
    tampered = [{**instances[0], "hash_seed": "999"}, instances[1]]
    ConfigVersion.objects.create(node_name="node-a", version=version.version + 1, digest="d" * 64,
                                 content_digest="c" * 64, document={**version.document, "instances": tampered})
    NodeState.objects.filter(node_name="node-a").update(applied_digest="d" * 64)
    check = results()["pd_identical"]
    assert not check.passed
    assert check.details == [f"prod-a prefill on node-a:8000: the agent applied hash_seed '999' (release prescribes "
                             f"'{healthy['release'].hash_seed}')"]


def test_unconfirmed_instances_fail(healthy):
    make_assignment(make_node("node-b", hostname="10.0.0.2"), healthy["release"], port=8000, role="decode")
    check = results()["pd_identical"]
    assert not check.passed
    assert check.details == ["prod-a decode on node-b:8000: the agent of node node-b has not reported running any "
                             "config yet"]


def test_a_namespace_pushed_with_two_fingerprints_fails(healthy):
    release = healthy["release"]
    version = ConfigVersion.objects.get(node_name="node-a")
    document = {**version.document, "instances": [
        {**instance, "release_fingerprint": "0" * 64} for instance in version.document["instances"]]}
    ConfigVersion.objects.create(node_name="node-a", version=version.version + 1, digest="a" * 64,
                                 content_digest="b" * 64, document=document)
    check = results()["namespace_changed"]
    assert not check.passed and "namespace 'prod-a'" in check.details[0] and "2 fingerprints" in check.details[0]
    assert release.fingerprint[:12] in check.details[0]


def test_a_changed_salt_fails(healthy):
    RequestGroup.objects.filter(name="app-a").update(cache_salt="salt-b")  # bypasses the model rule
    apply_config(healthy["node"])
    check = results()["salts_stable"]
    assert not check.passed and "acme/app-a went to agents with 2 different cache_salt values" in check.details[0]


def test_a_salt_change_in_the_audit_log_fails(healthy):
    from tenants.models import AuditEntry

    AuditEntry.objects.create(actor_repr="script", action="update", object_type="tenants.requestgroup",
                              object_id="1", object_repr="app-a", before={"cache_salt": "x"},
                              after={"cache_salt": "y"})
    check = results()["salts_stable"]
    assert not check.passed and "app-a: cache_salt changed" in check.details[0]


def test_overlap_capacity(healthy):
    from dashboard.rollout.upgrade import start_upgrade

    start_upgrade(healthy["release"], "prod-b")
    master_sample("acme", effective=10 * GB)
    check = results()["overlap_capacity"]
    assert check.passed and check.summary == "1 tenant(s) with overlapping releases, all within quota"
    sample(namespace="prod-a", group="app-a", size=6 * GB, ts=timezone.now())
    check = results()["overlap_capacity"]
    assert not check.passed and "warm-up still to come 6 GiB" in check.details[0]


def test_checks_page_and_json(ui, healthy):
    sample(namespace="random-4f2a", size=1)
    html = ui.get(reverse("ui:checks")).content.decode()
    assert 'data-check="names_stable" data-status="fail"' in html
    for key in ("pd_identical", "namespace_changed", "salts_stable", "overlap_capacity", "engines_hash_registered",
                "blocks_registered", "engine_events_flow"):
        assert f'data-check="{key}" data-status="pass"' in html
    assert "Use deterministic names that remain stable across restarts." in html
    payload = ui.get(reverse("ui:checks-data")).json()
    assert [c["status"] for c in payload["checks"]][:8] == ["fail", "pass", "pass", "pass", "pass", "pass", "pass",
                                                             "pass"]
