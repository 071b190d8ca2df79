"""Config documents (schema 2) carry everything a node needs: each instance's launch spec as the registry renders it
and the node's own settings (KV-events port, store mode, the standalone-store ``mooncake_client`` argv)."""
from __future__ import annotations

import pytest

from agent.contract.messages import DOCUMENT_SCHEMA_VERSION, LaunchSpec, parse_document
from dashboard.rollout.push import content_digest, ensure_version, render_content
from tenants.rendering import RenderTarget, render_assignment, render_store_client
from tests.support.factories import make_assignment, make_model, make_node, make_release, make_tenant

pytestmark = pytest.mark.django_db


def _registry(*, with_sglang: bool = True, **node):
    tenant = make_tenant("acme", quota="8GB")
    release = make_release(make_model(tenant, "qwen3-8b", "/models/Qwen3-8B"), "prod-2026-07", hash_seed="42")
    node = make_node("node-a", **node)
    vllm = make_assignment(node, release, port=8000, gpu_ids="0" if with_sglang else "")
    sglang = None
    if with_sglang:  # SGLang mounts its own segment: only on embedded-store nodes
        sglang_release = make_release(make_model(tenant, "other", "/models/Other"), "other-2026-07",
                                      engine="sglang", hash_algo="sha256")
        sglang = make_assignment(node, sglang_release, port=8001, gpu_ids="1")
    return node, vllm, sglang


def test_documents_carry_launch_specs_and_node_settings():
    node, vllm, sglang = _registry(kv_events_port=6001)
    content = render_content(node)
    assert content["schema"] == DOCUMENT_SCHEMA_VERSION == 2
    target = RenderTarget.from_settings()
    by_id = {instance["instance_id"]: instance for instance in content["instances"]}
    for assignment in (vllm, sglang):
        launch = LaunchSpec.from_dict(by_id[str(assignment.pk)]["launch"])
        assert launch == render_assignment(assignment, target).launch_spec()
    assert "--kv-events-config" in by_id[str(vllm.pk)]["launch"]["argv"]
    assert content["node_settings"] == {"kv_events_port": 6001, "store_mode": "embedded", "store_client_argv": None,
                                        "master_metrics_urls": [target.admin_url.rstrip("/") + "/metrics"]}
    document = parse_document({**content, "version": 1, "issued_at": "2026-12-01T00:00:00Z"})
    assert document.instances[0].launch is not None and document.node_settings.kv_events_port == 6001


def test_documents_name_every_masters_metrics_in_ha_mode(settings):
    settings.KVPOOL_MASTER_HA_ETCD_ENDPOINTS = "127.0.0.1:2379"
    settings.KVPOOL_MASTER_HA_ADDRESSES = ["127.0.0.1:50051", "127.0.0.1:50052"]
    settings.KVPOOL_MASTER_HA_ADMIN_URLS = ["http://127.0.0.1:9003", "http://127.0.0.1:9004/"]
    node, _vllm, _sglang = _registry(with_sglang=False)
    assert render_content(node)["node_settings"]["master_metrics_urls"] == [
        "http://127.0.0.1:9003/metrics", "http://127.0.0.1:9004/metrics"]


def test_standalone_store_nodes_carry_their_store_client_and_changes_make_a_new_version():
    node, _vllm, _sglang = _registry(with_sglang=False, store_mode="standalone-store",
                                     store_segment_bytes=256 << 20, store_client_port=50099)
    settings = render_content(node)["node_settings"]
    assert settings["store_mode"] == "standalone-store"
    assert settings["store_client_argv"] == list(render_store_client(node, RenderTarget.from_settings()).argv)
    assert "--global_segment_size=268435456" in settings["store_client_argv"]
    first = ensure_version(node)
    assert first.created and ensure_version(node).version.version == first.version.version
    node.kv_events_port = 6002
    node.save()
    second = ensure_version(node)
    assert second.created and second.version.version == first.version.version + 1
    assert second.version.document["node_settings"]["kv_events_port"] == 6002
    assert content_digest(second.version.document) != content_digest(first.version.document)
