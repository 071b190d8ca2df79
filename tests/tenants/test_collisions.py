"""vLLM model identifier collisions: refused unless the releases carry distinct cache_prefix values."""
from __future__ import annotations

import pytest

from tenants.models import Release
from tests.support.factories import (
    RELEASE_DEFAULTS,
    make_model,
    make_release,
    make_tenant,
    refused,
    refused_save,
)

pytestmark = pytest.mark.django_db

MESSAGE = (
    "vLLM model name 'Qwen3-8B' collides with served model 'qwen3-8b-hub' (model_path 'Qwen/Qwen3-8B') of tenant "
    "'acme', whose release already uses cache_prefix 'production-2026-07': models with the same vLLM model name "
    "write the same store keys, so their releases need distinct cache_prefix values (release namespaces)."
)


@pytest.fixture
def two_models(tenant):
    hub = make_model(tenant, "qwen3-8b-hub", model_path="Qwen/Qwen3-8B")
    local = make_model(tenant, "qwen3-8b-local", model_path="/models/Qwen3-8B")
    assert hub.vllm_model_name == local.vllm_model_name == "Qwen3-8B"
    return hub, local


def test_same_cache_prefix_refused(two_models):
    hub, local = two_models
    make_release(hub, "production-2026-07")
    errors = refused(Release(model=local, namespace="production-2026-07", **RELEASE_DEFAULTS))
    assert errors["namespace"] == [MESSAGE]


def test_distinct_cache_prefix_accepted(two_models):
    hub, local = two_models
    make_release(hub, "production-2026-07")
    make_release(local, "local-2026-07")


def test_other_tenant_is_another_key_space(two_models):
    hub, _ = two_models
    make_release(hub, "production-2026-07")
    other = make_model(make_tenant("other"), "qwen3-8b-local", model_path="/models/Qwen3-8B")
    make_release(other, "production-2026-07")


def test_changing_model_path_into_a_collision_refused(tenant):
    hub = make_model(tenant, "qwen3-8b-hub", model_path="Qwen/Qwen3-8B")
    other = make_model(tenant, "qwen3-8b-local", model_path="/models/Qwen3-8B-instruct")
    make_release(hub, "production-2026-07")
    make_release(other, "production-2026-07")  # different vLLM names: no collision yet
    other.model_path = "/models/Qwen3-8B"
    assert refused_save(other)["model_path"] == [MESSAGE]
    other.refresh_from_db()
    assert other.model_path == "/models/Qwen3-8B-instruct" and other.vllm_model_name == "Qwen3-8B-instruct"
