"""A release namespace that may have held keys is reserved for good once its release is deleted or moves away
(``tenants.models.ReservedNamespace``): no later release of the same model key in the tenant may use it."""
from __future__ import annotations

import pytest
from django.db import transaction

from tenants.models import AuditEntry, Release, ReservedNamespace
from tenants.models.reserved_namespace import delete_consequences
from tenants.services import validated_save
from tests.support.factories import (
    RELEASE_DEFAULTS,
    make_model,
    make_release,
    make_tenant,
    refused,
    refused_save,
)

pytestmark = pytest.mark.django_db


def _new(model, namespace: str, **kwargs) -> Release:
    return Release(model=model, namespace=namespace, **{**RELEASE_DEFAULTS, **kwargs})


@pytest.mark.parametrize("state", ["warming", "retired"])
def test_deleted_release_reserves_its_namespace_for_good(served_model, state):
    release = make_release(served_model, "canary", weights_revision="r1")
    if state == "retired":
        release.state = "retired"
        validated_save(release)
    pk, fingerprint = release.pk, release.fingerprint
    release.delete()
    reservation = ReservedNamespace.objects.get()
    assert (reservation.tenant_id, reservation.served_model_name, reservation.vllm_model_name,
            reservation.namespace) == ("acme", "qwen3-8b", "Qwen3-8B", "canary")
    assert (reservation.release_pk, reservation.release_state, reservation.reason, reservation.fingerprint) == (
        pk, state, "deleted", fingerprint)
    audit = AuditEntry.objects.get(object_type="tenants.reservednamespace", action="create")
    assert audit.after["namespace"] == "canary"
    message = refused(_new(served_model, "canary", weights_revision="r2"))["namespace"][0]
    assert message.startswith("Namespace 'canary' is reserved: release 'canary' of served model 'qwen3-8b' "
                              f"(tenant 'acme', {state}) was deleted on ")
    assert "choose a new namespace" in message


def test_the_reservation_covers_every_model_that_writes_the_same_keys(tenant, served_model):
    make_release(served_model, "canary").delete()
    same_vllm_name = make_model(tenant, "qwen-copy", "/models/Qwen3-8B")  # vLLM keys: canary@Qwen3-8B@...
    assert "namespace" in refused(_new(same_vllm_name, "canary"))
    other = make_model(tenant, "llama", "/models/Llama-3")
    validated_save(_new(other, "canary"))  # different keys: allowed
    other_tenant = make_model(make_tenant("globex"), "qwen3-8b", "Qwen/Qwen3-8B")
    validated_save(_new(other_tenant, "canary"))  # another Mooncake tenant: another key space


def test_sglang_key_component_is_covered(tenant):
    model = make_model(tenant, "org/m", "/models/m-a")
    make_release(model, "ns-a", engine="sglang", engine_version="0.5.23").delete()
    model.delete()
    clash = make_model(tenant, "org-m", "/models/m-b")  # SGLang writes ns-a_org-m_... for both names
    assert "namespace" in refused(_new(clash, "ns-a", engine="sglang", engine_version="0.5.23"))


def test_renaming_a_release_reserves_the_namespace_it_leaves(served_model):
    release = make_release(served_model, "canary")
    release.namespace = "canary-2"
    validated_save(release)
    assert ReservedNamespace.objects.get().reason == "renamed"
    assert "namespace" in refused(_new(served_model, "canary"))
    release.namespace = "canary"  # back to the name it left: refused too, its old keys may differ
    assert "namespace" in refused_save(release)
    release.refresh_from_db()
    release.description = "edited"  # other edits of a release on an unreserved namespace are fine
    validated_save(release)


def test_renaming_the_model_or_tenant_reserves_its_namespaces(tenant, served_model):
    make_release(served_model, "canary")
    served_model.served_model_name = "qwen3-8b-v2"
    served_model.model_path = "Qwen/Qwen3-8B-v2"
    validated_save(served_model)
    assert ReservedNamespace.objects.get().served_model_name == "qwen3-8b"
    newcomer = make_model(tenant, "qwen3-8b", "Qwen/Qwen3-8B")
    assert "namespace" in refused(_new(newcomer, "canary"))
    served_model.description = "still editable"  # its own release's reservation does not block the model
    validated_save(served_model)
    tenant.tenant_id = "acme-renamed"
    validated_save(tenant)
    assert ReservedNamespace.objects.filter(tenant_id="acme", served_model_name="qwen3-8b-v2").exists()


def test_a_model_cannot_move_onto_reserved_keys(tenant):
    gone = make_model(tenant, "m-a", "/models/A")
    make_release(gone, "ns").delete()
    mover = make_model(tenant, "m-b", "/models/B")
    make_release(mover, "ns")
    mover.model_path = "/other/A"  # its release 'ns' would write ns@A@... keys, reserved
    assert "model_path" in refused(mover)


def test_tenant_cannot_take_an_id_with_reserved_keys():
    old = make_tenant("old")
    make_release(make_model(old, "qwen3-8b", "Qwen/Qwen3-8B"), "ns").delete()
    old.tenant_id = "old-2"
    validated_save(old)
    newcomer = make_tenant("other")
    make_release(make_model(newcomer, "qwen3-8b", "Qwen/Qwen3-8B"), "ns")
    newcomer.tenant_id = "old"  # would put its release on the deleted release's keys in Mooncake tenant 'old'
    assert "tenant_id" in refused(newcomer)


def test_refused_delete_reserves_nothing(served_model):
    release = make_release(served_model, "live", state="serving")
    from django.db.models import ProtectedError

    with pytest.raises(ProtectedError), transaction.atomic():
        release.delete()
    assert not ReservedNamespace.objects.exists()


def test_delete_consequences_say_what_happens(release):
    text = delete_consequences(release)
    assert "reserves namespace 'production-2026-07'" in text and "purge its keys" in text and "audited" in text
