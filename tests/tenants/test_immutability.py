"""Once a release has served, its namespace and fingerprint are immutable; a new namespace is required."""
from __future__ import annotations

import pytest
from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import ProtectedError

from tenants.models import Release, Tenant
from tenants.models.release import IMMUTABLE_AFTER_SERVING
from tenants.services import copy_release, validated_save
from tests.support.factories import make_model, make_release, make_tenant, refused

pytestmark = pytest.mark.django_db

NEW_VALUES = {
    "namespace": "production-2026-08",
    "weights_revision": "abc123",
    "num_layers": 40,
    "num_kv_heads": 4,
    "head_dim": 64,
    "block_size": 32,
    "kv_dtype": "fp8",
    "quantization": "awq",
    "adapters": [{"name": "sql-lora", "path": "/adapters/sql-v1"}],
    "engine": "sglang",
    "engine_version": "0.34.0",
    "hash_algo": "sha256_cbor",
    "hash_seed": "12345",
}


def _serve(release: Release) -> Release:
    release.state = "serving"
    return validated_save(release)


def test_warming_release_may_change_settings(release):
    before = release.fingerprint
    release.block_size = 32
    validated_save(release)
    assert release.fingerprint != before


@pytest.mark.parametrize("field", sorted(set(IMMUTABLE_AFTER_SERVING) - {"model"}))
def test_served_release_refuses_cache_affecting_change(release, field):
    _serve(release)
    fingerprint = release.fingerprint
    setattr(release, field, NEW_VALUES[field])
    if field == "engine":
        release.hash_algo = "sha256"
    message = refused(release)[field]
    assert message == [
        f"Release 'production-2026-07' has served, so its namespace and fingerprint are immutable: changing {field} "
        "would change which KV cache entries it reads. A new release namespace is required: copy this release "
        "under a new namespace with the new settings."
    ]
    stored = Release.objects.get(pk=release.pk)
    assert stored.fingerprint == fingerprint and stored.namespace == "production-2026-07"


def test_served_release_refuses_moving_to_another_model(release, tenant):
    _serve(release)
    release.model = make_model(tenant, "other", model_path="x/other")
    assert "model" in refused(release)


def test_served_release_allows_non_cache_changes(release):
    _serve(release)
    release.description = "canary"
    release.budget_bytes = 1 << 30
    release.adapters = list(reversed(release.adapters))
    validated_save(release)
    release.state = "draining"
    validated_save(release)


def test_served_model_identity_is_immutable(release):
    _serve(release)
    model = release.model
    model.model_path = "/models/Qwen3-8B-v2"
    model.served_model_name = "qwen3-8b-v2"
    errors = refused(model)
    assert set(errors) == {"model_path", "served_model_name"}
    assert errors["model_path"] == [
        "model_path cannot change: releases of served model 'qwen3-8b' have served and every cached key contains it. "
        "Create a new served model (with a new release namespace) instead."
    ]


def test_tenant_rename_refused_after_serving(release, tenant):
    tenant.tenant_id = "acme-renamed"
    validated_save(tenant)  # nothing has served yet
    _serve(release)
    tenant.tenant_id = "acme-2"
    assert refused(tenant)["tenant_id"] == [
        "tenant_id cannot change from 'acme-renamed': releases of this tenant have served and their cached objects "
        "live under that Mooncake tenant. Create a new tenant instead."
    ]


def test_served_release_cannot_be_deleted(release, served_model):
    unserved = make_release(served_model, "canary")
    _serve(release)
    with (pytest.raises(ProtectedError, match="has served and cannot be deleted: retire it instead"),
          transaction.atomic()):
        release.delete()
    with pytest.raises(ProtectedError), transaction.atomic():
        Release.objects.filter(pk=release.pk).delete()
    assert Release.objects.filter(pk=release.pk).exists()
    unserved.delete()
    assert not Release.objects.filter(pk=unserved.pk).exists()


def test_copy_release_keeps_settings_under_new_namespace(release):
    _serve(release)
    copy = copy_release(release, "production-2026-08")
    assert copy.pk != release.pk and copy.state == "warming" and copy.first_served_at is None
    assert copy.fingerprint == release.fingerprint and copy.hash_seed == release.hash_seed
    assert copy.cache_settings() == release.cache_settings()
    upgraded = copy_release(release, "production-2026-09", weights_revision="v2")
    assert upgraded.fingerprint != release.fingerprint and upgraded.weights_revision == "v2"


def test_copy_release_refusals_write_nothing(release):
    count = Release.objects.count()
    with pytest.raises(ValidationError) as info:
        copy_release(release, "production-2026-07")
    assert info.value.message_dict["namespace"] == [
        "Served model 'qwen3-8b' already has a release with namespace 'production-2026-07'."
    ]
    with pytest.raises(ValidationError) as info:
        copy_release(release, "production-2026-08", budget_bytes=2**62)
    assert "budget_bytes" in info.value.message_dict
    with pytest.raises(ValidationError) as info:
        copy_release(release, "production-2026-08", state="retired")
    assert "state" in info.value.message_dict
    with pytest.raises(ValidationError) as info:
        copy_release(release, "production-2026-08", colour="blue")
    assert info.value.message_dict == {
        "colour": ["'colour' is not a cache setting of a release; it cannot be overridden in a copy."]
    }
    assert Release.objects.count() == count


def test_tenant_delete_protected_by_models(release):
    with pytest.raises(ProtectedError), transaction.atomic():
        Tenant.objects.filter(pk=release.model.tenant_id).delete()
    make_tenant("empty").delete()
