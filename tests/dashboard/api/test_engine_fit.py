"""Releases and instances the engines cannot run are refused with a 400 naming the field, through the API (the
pages and the admin share the model's ``clean``): vLLM has no ``float32`` KV cache, SGLang runs neither on CPU
nodes nor beside a standalone-store node's ``mooncake_client``."""
from __future__ import annotations

import ast

import pytest
from django.core.exceptions import ValidationError

from tenants.choices import VLLM_KV_DTYPES
from tenants.models import Release
from tenants.services import validated_save
from tests.support.factories import make_assignment, make_model, make_node, make_release, make_tenant

pytestmark = pytest.mark.django_db


def test_vllm_release_refuses_a_float32_kv_cache(api, release):
    response = api.patch(f"/api/v1/releases/{release.pk}/", {"kv_dtype": "float32"}, format="json")
    assert response.status_code == 400 and list(response.json()) == ["kv_dtype"], response.json()
    assert "float32" in response.json()["kv_dtype"][0]
    assert Release.objects.get(pk=release.pk).kv_dtype == "auto"
    assert api.patch(f"/api/v1/releases/{release.pk}/", {"kv_dtype": "bfloat16"}, format="json").status_code == 200


@pytest.mark.integration
def test_vllm_dtypes_are_what_vllm_parses(engine_python):
    """Against the installed vLLM's ``CacheDType`` (the engine venv of ``scripts/engine_env.sh``, installed here on
    first use: on a fresh clone this test runs, it does not skip)."""
    found = sorted(engine_python.parent.parent.glob("lib/python*/site-packages/vllm/config/cache.py"))
    assert found, f"no vllm/config/cache.py under {engine_python.parent.parent}"
    tree = ast.parse(found[0].read_text())
    literal = next(node.value for node in ast.walk(tree) if isinstance(node, ast.Assign)
                   and any(isinstance(t, ast.Name) and t.id == "CacheDType" for t in node.targets))
    parsed = {elt.value for elt in literal.slice.elts}
    assert set(VLLM_KV_DTYPES) <= parsed and "float32" not in parsed


def test_a_stored_float32_vllm_release_stays_editable(release):
    Release.objects.filter(pk=release.pk).update(kv_dtype="float32")  # stored before the rule
    stored = Release.objects.get(pk=release.pk)
    stored.description = "still editable"
    validated_save(stored)


@pytest.fixture
def sglang_release(db):
    model = make_model(make_tenant("sgl"), "sgl-model", "org/sgl")
    return make_release(model, "sgl-ns", engine="sglang", hash_algo="sha256")


@pytest.mark.parametrize("node_kwargs, field", [
    ({"device": "cpu"}, "CPU"),
    ({"store_mode": "standalone-store", "store_segment_bytes": 1 << 30}, "standalone"),
])
def test_sglang_instances_need_an_embedded_store_cuda_node(api, sglang_release, node_kwargs, field):
    node = make_node("node-x", "10.0.0.9", **node_kwargs)
    response = api.post("/api/v1/assignments/", {"node": node.pk, "release": sglang_release.pk, "port": 8100},
                        format="json")
    assert response.status_code == 400 and list(response.json()) == ["node"], response.json()
    assert field in response.json()["node"][0]
    assert not node.assignments.exists()


def test_a_node_running_sglang_cannot_become_standalone_or_cpu(api, sglang_release):
    node = make_node("node-g", "10.0.0.8")
    make_assignment(node, sglang_release, port=8100)
    response = api.patch(f"/api/v1/nodes/{node.pk}/", {"device": "cpu"}, format="json")
    assert response.status_code == 400 and list(response.json()) == ["device"], response.json()
    node.store_mode, node.store_segment_bytes = "standalone-store", 1 << 30
    with pytest.raises(ValidationError) as refused:
        validated_save(node)
    assert list(refused.value.message_dict) == ["store_mode"]
