"""Launch settings a real engine needs, from the registry instead of hand edits: a CPU node's
``cpu_kvcache_space_gib`` (``VLLM_CPU_KVCACHE_SPACE``) and a release's ``max_model_len`` (vLLM ``--max-model-len``,
SGLang ``--context-length``), which is no cache setting: it leaves the fingerprint alone and may change after
serving."""
from __future__ import annotations

import pytest

from tenants.models import Node, Release
from tenants.rendering import render_assignment
from tenants.services import copy_release, validated_save
from tests.support.factories import make_assignment, make_model, make_node, make_release, make_tenant

pytestmark = pytest.mark.django_db


def _option(argv, flag: str) -> str | None:
    argv = list(argv)
    return argv[argv.index(flag) + 1] if flag in argv else None


def test_cpu_node_renders_its_kv_cache_space(release, endpoints):
    node = make_node("cpu-a", "10.0.0.3", device="cpu")
    assert node.cpu_kvcache_space_gib == 1  # the default, as before the field
    config = render_assignment(make_assignment(node, release, port=8100), endpoints)
    assert config.env["VLLM_CPU_KVCACHE_SPACE"] == "1"
    node.cpu_kvcache_space_gib = 6
    validated_save(node)
    assignment = make_assignment(Node.objects.get(pk=node.pk), release, port=8101)
    assert render_assignment(assignment, endpoints).env["VLLM_CPU_KVCACHE_SPACE"] == "6"
    gpu = render_assignment(make_assignment(make_node("gpu-a", "10.0.0.4"), release, port=8102), endpoints)
    assert "VLLM_CPU_KVCACHE_SPACE" not in gpu.env


def test_max_model_len_is_rendered_only_when_set_and_is_no_cache_setting(release, endpoints):
    assignment = make_assignment(make_node(), release)
    assert _option(render_assignment(assignment, endpoints).argv, "--max-model-len") is None
    fingerprint = release.fingerprint
    release.state = "serving"
    validated_save(release)
    release.max_model_len = 2048  # changes no block hash: allowed after serving, fingerprint unchanged
    validated_save(release)
    stored = Release.objects.get(pk=release.pk)
    assert stored.fingerprint == fingerprint and stored.max_model_len == 2048
    assignment.refresh_from_db()
    assert _option(render_assignment(assignment, endpoints).argv, "--max-model-len") == "2048"
    assert copy_release(stored, "production-2026-09").max_model_len == 2048


def test_sglang_gets_the_context_length(endpoints):
    model = make_model(make_tenant("sgl"), "sgl-model", "org/sgl")
    release = make_release(model, "sgl-ns", engine="sglang", hash_algo="sha256", max_model_len=4096)
    config = render_assignment(make_assignment(make_node(), release), endpoints)
    assert _option(config.argv, "--context-length") == "4096" and "--max-model-len" not in config.argv


def test_api_takes_and_checks_both_fields(api, release):
    node = make_node("cpu-b", "10.0.0.5", device="cpu")
    assert api.get(f"/api/v1/nodes/{node.pk}/").json()["cpu_kvcache_space_gib"] == 1
    assert api.patch(f"/api/v1/nodes/{node.pk}/", {"cpu_kvcache_space_gib": 0}, format="json").status_code == 400
    response = api.patch(f"/api/v1/nodes/{node.pk}/", {"cpu_kvcache_space_gib": 4}, format="json")
    assert response.status_code == 200 and Node.objects.get(pk=node.pk).cpu_kvcache_space_gib == 4
    response = api.patch(f"/api/v1/releases/{release.pk}/", {"max_model_len": 0}, format="json")
    assert response.status_code == 400 and list(response.json()) == ["max_model_len"]
    response = api.patch(f"/api/v1/releases/{release.pk}/", {"max_model_len": 1024}, format="json")
    assert response.status_code == 200 and response.json()["max_model_len"] == 1024
    response = api.patch(f"/api/v1/releases/{release.pk}/", {"max_model_len": None}, format="json")
    assert response.status_code == 200 and Release.objects.get(pk=release.pk).max_model_len is None
