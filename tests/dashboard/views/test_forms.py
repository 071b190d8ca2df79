"""Create / edit / delete forms: the model rules refuse the same input with the same message as the REST API,
and every change lands in the audit log under the logged-in user."""
from __future__ import annotations

import pytest
from django.urls import reverse

from dashboard.views.edit import KINDS
from tenants.models import (
    AuditEntry,
    InstanceAssignment,
    Node,
    Release,
    RequestGroup,
    ServedModel,
    Tenant,
)
from tests.support.factories import (
    make_assignment,
    make_group,
    make_model,
    make_node,
    make_release,
    make_tenant,
)

pytestmark = pytest.mark.django_db
RELEASE = {"num_layers": 36, "num_kv_heads": 8, "head_dim": 128, "block_size": 16, "engine": "vllm",
           "engine_version": "0.33.0"}


def form_data(kind: str, instance, **changes) -> dict:
    """POST data of ``kind``'s edit form for ``instance`` with ``changes`` applied (what a browser sends)."""
    form = KINDS[kind].form_class(instance=instance)
    data = {}
    for name, field in form.fields.items():
        value = form[name].value()
        value = field.prepare_value(value) if hasattr(field, "prepare_value") else value
        data[name] = "" if value is None else value
    data.update(changes)
    return data


def form_errors(response) -> dict[str, list[str]]:
    assert response.status_code == 400, response.content[:500]
    return {name: list(messages) for name, messages in response.context["form"].errors.items()}


def assert_same(api_response, form_response, field: str) -> list[str]:
    assert api_response.status_code == 400, api_response.content
    api_messages = api_response.json()[field]
    assert form_errors(form_response)[field] == api_messages
    return api_messages


# --- create, edit, audit ------------------------------------------------------------------------------------


def test_create_every_kind_through_the_forms_and_audit_it(ui, operator):
    # no master answers in these tests: the pool's capacity is unknown, so a new quota needs the confirmation
    response = ui.post(reverse("ui:tenant-new"),
                       {"tenant_id": "acme", "quota_bytes": "64GB", "confirm_overcommit": "on"})
    tenant = Tenant.objects.get(tenant_id="acme")
    assert response.status_code == 302 and response["Location"] == reverse("ui:tenant", args=[tenant.pk])
    assert tenant.quota_bytes == 64 << 30
    ui.post(reverse("ui:model-new"), {"tenant": tenant.pk, "served_model_name": "qwen3-8b",
                                      "model_path": "Qwen/Qwen3-8B"})
    model = ServedModel.objects.get(served_model_name="qwen3-8b")
    assert model.vllm_model_name == "Qwen3-8B"
    ui.post(reverse("ui:release-new"), {"model": model.pk, "namespace": "prod-1", "state": "warming",
                                        "kv_dtype": "auto", "hash_algo": "sha256", "hash_seed": "42",
                                        "adapters": "sql-lora=/adapters/sql, chat-lora=org/chat-lora;rank=64",
                                        **RELEASE})
    release = Release.objects.get(namespace="prod-1")
    assert release.adapters == [{"name": "sql-lora", "path": "/adapters/sql"},
                                {"name": "chat-lora", "path": "org/chat-lora", "rank": 64}]
    assert release.hash_seed == "42"
    ui.post(reverse("ui:request-group-new"), {"tenant": tenant.pk, "name": "app-a", "cache_salt": "salt-a"})
    assert RequestGroup.objects.get(name="app-a").cache_salt == "salt-a"
    ui.post(reverse("ui:node-new"), {"name": "node-a", "hostname": "10.0.0.1", "model_roots": "/adapters\n"})
    node = Node.objects.get(name="node-a")
    assert node.model_roots == ["/adapters"]
    response = ui.post(reverse("ui:assignment-new"), {
        "node": node.pk, "release": release.pk, "engine": "", "role": "prefill", "port": 8000,
        **{f"{r}_{k}": 0 if k == "rank" else 1 for r in ("tp", "pp", "pcp", "dcp") for k in ("rank", "size")}})
    assignment = InstanceAssignment.objects.get()
    assert response["Location"] == reverse("ui:release", args=[release.pk])
    assert assignment.engine == "vllm"  # filled from the release by the model rule
    entries = AuditEntry.objects.filter(action="create")
    assert {e.object_type for e in entries} == {"tenants.tenant", "tenants.servedmodel", "tenants.release",
                                                 "tenants.requestgroup", "tenants.node", "tenants.instanceassignment"}
    assert {e.actor_repr for e in entries} == {"operator"} and all(e.actor == operator for e in entries)
    assert AuditEntry.objects.get(object_type="tenants.node").after["signing_secret"] == "<redacted>"


def test_create_form_is_prefilled_from_the_query(ui):
    tenant = make_tenant()
    response = ui.get(reverse("ui:model-new"), {"tenant": tenant.pk})
    assert response.status_code == 200
    assert response.context["form"].initial == {"tenant": str(tenant.pk)}


def test_edit_saves_and_audits_the_change(ui):
    tenant = make_tenant(quota="64GB")
    response = ui.post(reverse("ui:tenant-edit", args=[tenant.pk]),
                       form_data("tenant", tenant, quota_bytes="128GB", description="bigger", confirm_overcommit="on"))
    assert response.status_code == 302
    tenant.refresh_from_db()
    assert tenant.quota_bytes == 128 << 30
    entry = AuditEntry.objects.get(object_type="tenants.tenant", action="update")
    assert entry.actor_repr == "operator" and {"description", "quota_bytes"} <= set(entry.changed_fields())


def test_release_edit_page_keeps_an_adapter_path_stored_with_a_semicolon(ui):
    """A release stored before ';' was refused in adapter paths: editing its description on the page must not
    read '/adapters/x;rank=5' back as path '/adapters/x' with rank 5 (nor fail on 'rank=5;rank=7')."""
    release = make_release(make_model(make_tenant()))
    for adapters in ([{"name": "x", "path": "/adapters/x;rank=5", "rank": 7}],
                     [{"name": "x", "path": "/adapters/x;rank=5"}]):
        Release.objects.filter(pk=release.pk).update(adapters=adapters)
        release.refresh_from_db()
        release.save()  # its fingerprint, as computed when it was stored
        fingerprint = release.fingerprint
        response = ui.post(reverse("ui:release-edit", args=[release.pk]),
                           form_data("release", release, description=f"edited {len(adapters[0])}"))
        assert response.status_code == 302, form_errors(response)
        release.refresh_from_db()
        assert release.adapters == adapters and release.fingerprint == fingerprint


def test_edit_form_shows_quota_in_units(ui):
    tenant = make_tenant(quota="8MB")
    assert b'value="8MB"' in ui.get(reverse("ui:tenant-edit", args=[tenant.pk])).content


# --- the same refusals as the API ---------------------------------------------------------------------------


@pytest.mark.parametrize("body,field", [
    ({"tenant_id": "_reserved", "quota_bytes": "8MB"}, "tenant_id"),
    ({"tenant_id": "acme", "quota_bytes": "8XB"}, "quota_bytes"),
    ({"tenant_id": "acme", "quota_bytes": "0"}, "quota_bytes"),
])
def test_tenant_refusals_match_the_api(ui, api, body, field):
    messages = assert_same(api.post("/api/v1/tenants/", body, format="json"), ui.post(reverse("ui:tenant-new"), body),
                           field)
    assert messages and not Tenant.objects.exists()


def test_duplicate_tenant_matches_the_api(ui, api):
    make_tenant("acme")
    body = {"tenant_id": "acme", "quota_bytes": "8MB"}
    messages = assert_same(api.post("/api/v1/tenants/", body, format="json"), ui.post(reverse("ui:tenant-new"), body),
                           "tenant_id")
    assert messages == ["A tenant with this tenant_id already exists."]


def test_served_model_collision_matches_the_api(ui, api):
    tenant = make_tenant()
    make_model(tenant, "org/qwen", "Qwen/Qwen3-8B")
    body = {"tenant": tenant.pk, "served_model_name": "org-qwen", "model_path": "/models/other"}
    assert_same(api.post("/api/v1/models/", body, format="json"), ui.post(reverse("ui:model-new"), body),
                "served_model_name")


@pytest.mark.parametrize("changes,field", [
    ({"namespace": "prod_1"}, "namespace"),
    ({"engine": "sglang", "hash_algo": "xxhash"}, "hash_algo"),
    ({"state": "draining"}, "state"),
    ({"budget_bytes": "300GB"}, "budget_bytes"),
])
def test_release_refusals_match_the_api(ui, api, changes, field):
    model = make_model(make_tenant(quota="200GB"))
    api_body = {"model": model.pk, "namespace": "prod-1", **RELEASE, **changes}
    form_body = {"model": model.pk, "namespace": "prod-1", "state": "warming", "kv_dtype": "auto",
                 "hash_algo": "sha256", "hash_seed": "7", **RELEASE, **changes}
    messages = assert_same(api.post("/api/v1/releases/", api_body, format="json"),
                           ui.post(reverse("ui:release-new"), form_body), field)
    assert messages and not Release.objects.exists()


def test_served_release_is_immutable_in_both(ui, api):
    release = make_release(make_model(make_tenant()), "prod-1", state="serving")
    api_response = api.patch(f"/api/v1/releases/{release.pk}/", {"weights_revision": "v2"}, format="json")
    form_response = ui.post(reverse("ui:release-edit", args=[release.pk]),
                            form_data("release", release, weights_revision="v2"))
    messages = assert_same(api_response, form_response, "weights_revision")
    assert "A new release namespace is required" in messages[0]
    release.refresh_from_db()
    assert release.weights_revision == ""


def test_state_transition_refusal_matches_the_api(ui, api):
    release = make_release(make_model(make_tenant()), "prod-1", state="serving")
    api_response = api.patch(f"/api/v1/releases/{release.pk}/", {"state": "warming"}, format="json")
    form_response = ui.post(reverse("ui:release-edit", args=[release.pk]),
                            form_data("release", release, state="warming"))
    assert assert_same(api_response, form_response, "state") == [
        "A release cannot move from 'serving' to 'warming'; allowed: 'draining'."]


def test_request_group_salt_is_stable_in_both(ui, api):
    group = make_group(make_tenant(), "app-a", cache_salt="salt-a")
    api_response = api.patch(f"/api/v1/request-groups/{group.pk}/", {"cache_salt": "salt-b"}, format="json")
    form_response = ui.post(reverse("ui:request-group-edit", args=[group.pk]),
                            form_data("request-group", group, cache_salt="salt-b"))
    assert "cache_salt is stable" in assert_same(api_response, form_response, "cache_salt")[0]


def test_salt_whitespace_is_refused_not_trimmed(ui, api):
    tenant = make_tenant()
    body = {"tenant": tenant.pk, "name": "app-a", "cache_salt": " padded "}
    assert_same(api.post("/api/v1/request-groups/", body, format="json"),
                ui.post(reverse("ui:request-group-new"), body), "cache_salt")


def test_node_rename_matches_the_api(ui, api):
    node = make_node("node-a")
    api_response = api.patch(f"/api/v1/nodes/{node.pk}/", {"name": "node-b"}, format="json")
    form_response = ui.post(reverse("ui:node-edit", args=[node.pk]), form_data("node", node, name="node-b"))
    assert "cannot change" in assert_same(api_response, form_response, "name")[0]


@pytest.mark.parametrize("changes,field", [
    ({"tp_rank": 2, "tp_size": 2}, "tp_rank"),
    ({"engine": "sglang"}, "engine"),
    ({"port": 8000}, "port"),
    ({"bootstrap_port": 8100, "port": 8100}, "bootstrap_port"),
])
def test_assignment_refusals_match_the_api(ui, api, changes, field):
    release = make_release(make_model(make_tenant()))
    node = make_node()
    make_assignment(node, release, port=8000)
    base = {"node": node.pk, "release": release.pk, "role": "decode", "port": 8001}
    ranks = {f"{r}_{k}": 0 if k == "rank" else 1 for r in ("tp", "pp", "pcp", "dcp") for k in ("rank", "size")}
    api_response = api.post("/api/v1/assignments/", {**base, **changes}, format="json")
    form_response = ui.post(reverse("ui:assignment-new"), {**ranks, "engine": "", **base, **changes})
    assert_same(api_response, form_response, field)
    assert InstanceAssignment.objects.count() == 1


def test_rule_errors_on_fields_the_form_lacks_become_form_errors():
    from dashboard.forms import RequestGroupForm

    group = make_group(make_tenant(), "app-a")
    other = make_tenant("other")
    form = RequestGroupForm(form_data("request-group", group, tenant=other.pk), instance=group)
    del form.fields["budget_bytes"]  # a form without one of the model's fields still reports its rule
    assert not form.is_valid()
    assert any("request group cannot move" in e for e in form.errors["tenant"])


# --- delete ---------------------------------------------------------------------------------------------------


def test_delete_needs_confirmation_and_is_audited(ui):
    group = make_group(make_tenant(), "app-a")
    assert ui.post(reverse("ui:request-group-delete", args=[group.pk]), {}).status_code == 400
    assert RequestGroup.objects.exists()
    response = ui.post(reverse("ui:request-group-delete", args=[group.pk]), {"confirm": "on"})
    assert response.status_code == 302 and not RequestGroup.objects.exists()
    assert AuditEntry.objects.get(object_type="tenants.requestgroup", action="delete").actor_repr == "operator"


def test_refused_delete_shows_the_apis_reason(ui, api):
    release = make_release(make_model(make_tenant()), "prod-1", state="serving")
    api_reason = api.delete(f"/api/v1/releases/{release.pk}/").json()["detail"]
    response = ui.post(reverse("ui:release-delete", args=[release.pk]), {"confirm": "on"})
    assert response.status_code == 400
    assert response.context["form"].non_field_errors() == [api_reason]
    assert Release.objects.filter(pk=release.pk).exists()


def test_protected_reference_delete_is_refused(ui):
    tenant = make_tenant()
    make_model(tenant)
    response = ui.post(reverse("ui:tenant-delete", args=[tenant.pk]), {"confirm": "on"})
    assert response.status_code == 400 and "still referenced" in response.content.decode()
    assert Tenant.objects.exists()


def test_every_form_page_renders(ui):
    tenant = make_tenant()
    model = make_model(tenant)
    release = make_release(model)
    group = make_group(tenant)
    node = make_node()
    assignment = make_assignment(node, release)
    objects = {"tenant": tenant, "model": model, "release": release, "request-group": group, "node": node,
               "assignment": assignment}
    for kind, obj in objects.items():
        for name, args in ((f"ui:{kind}-new", []), (f"ui:{kind}-edit", [obj.pk]), (f"ui:{kind}-delete", [obj.pk])):
            response = ui.get(reverse(name, args=args))
            assert response.status_code == 200, name
            assert b"csrfmiddlewaretoken" in response.content


# --- form glitches: title after a refusal, unchanged saves, duplicated messages -----------------------------


@pytest.mark.parametrize("kind,changes", [
    ("node", {"name": "node-b"}),          # refused: a node's name cannot change
    ("tenant", {"tenant_id": "_bad"}),     # refused: reserved name
])
def test_refused_edit_keeps_the_stored_name_in_the_title(ui, kind, changes):
    obj = make_node("node-a") if kind == "node" else make_tenant("acme")
    stored = str(obj)
    response = ui.post(reverse(f"ui:{kind}-edit", args=[obj.pk]), form_data(kind, obj, **changes))
    assert response.status_code == 400
    title = f"Edit {KINDS[kind].label} &#x27;{stored}&#x27;"
    html = response.content.decode()
    assert f"<h1>{title}</h1>" in html and f"<title>{title}" in html
    rejected = next(iter(changes.values()))
    assert f"&#x27;{rejected}&#x27;</h1>" not in html


def test_edit_without_changes_saves_nothing(ui):
    tenant = make_tenant("acme")
    stamp = Tenant.objects.get().updated_at
    response = ui.post(reverse("ui:tenant-edit", args=[tenant.pk]), form_data("tenant", tenant), follow=True)
    assert "Nothing changed in tenant &#x27;acme&#x27;." in response.content.decode()
    assert Tenant.objects.get().updated_at == stamp
    assert not AuditEntry.objects.filter(action="update").exists()


def test_field_error_list_is_the_one_the_input_points_at(ui):
    response = ui.post(reverse("ui:tenant-new"), {"tenant_id": "_x", "quota_bytes": "8MB"})
    html = response.content.decode()
    assert 'aria-describedby="id_tenant_id_helptext id_tenant_id_error"' in html
    assert '<ul class="errorlist" id="id_tenant_id_error">' in html


def test_add_validation_error_shows_each_message_once():
    from django.core.exceptions import ValidationError

    from dashboard.forms import StartUpgradeForm, add_validation_error

    form = StartUpgradeForm({"namespace": "ok", "port_offset": "1"})
    assert form.is_valid()
    error = ValidationError({"namespace": "taken", "hash_seed": "bad seed", "__all__": "conflict"})
    add_validation_error(form, error)
    add_validation_error(form, error)  # the same refusal reported twice (e.g. by two checks)
    add_validation_error(form, ValidationError("taken"))  # already on the field: not repeated above the form
    assert form.errors["namespace"] == ["taken"]
    assert sorted(form.non_field_errors()) == ["conflict", "hash_seed: bad seed"]
