"""Write permissions of the pages for platform admins (the fixtures' users; tenant members:
tests/dashboard/test_tenant_walk.py): they may look at every tenant; forms, upgrade steps and purges need the model
permissions the REST API needs (403 naming them, nothing changed), and the pages hide what a user may not do."""
from __future__ import annotations

import pytest
from django.urls import reverse

from dashboard.rollout import upgrade as flow
from dashboard.views.edit import KINDS
from tenants.models import AuditEntry, Release, Tenant
from tests.dashboard.views.test_forms import form_data
from tests.support.factories import (
    grant,
    make_assignment,
    make_group,
    make_model,
    make_node,
    make_release,
    make_tenant,
)

pytestmark = pytest.mark.django_db


@pytest.fixture
def objects():
    tenant = make_tenant()
    model = make_model(tenant)
    release = make_release(model, state="serving")
    node = make_node()
    return {"tenant": tenant, "model": model, "release": release, "request-group": make_group(tenant),
            "node": node, "assignment": make_assignment(node, release)}


def _codename(kind: str) -> str:
    return KINDS[kind].model._meta.model_name


@pytest.mark.parametrize("kind", list(KINDS))
def test_form_pages_refuse_a_user_without_the_permission(viewer_ui, objects, kind):
    obj, model = objects[kind], KINDS[kind].model
    entries, stored = AuditEntry.objects.count(), model.objects.get(pk=obj.pk)
    for action, name, args, data in (
        ("add", f"ui:{kind}-new", [], form_data(kind, obj)),
        ("change", f"ui:{kind}-edit", [obj.pk], form_data(kind, obj, description="x") if hasattr(obj, "description")
         else form_data(kind, obj)),
        ("delete", f"ui:{kind}-delete", [obj.pk], {"confirm": "on"}),
    ):
        perm = f"tenants.{action}_{_codename(kind)}"
        for response in (viewer_ui.get(reverse(name, args=args)), viewer_ui.post(reverse(name, args=args), data)):
            assert response.status_code == 403, name
            assert 'id="forbidden"' in response.content.decode() and perm in response.content.decode()
    assert model.objects.count() == len([obj]) and AuditEntry.objects.count() == entries
    assert model.objects.get(pk=obj.pk).updated_at == stored.updated_at


def test_one_permission_opens_one_form(viewer, viewer_ui, objects):
    tenant = objects["tenant"]
    grant(viewer, "tenants.change_tenant")
    assert viewer_ui.get(reverse("ui:tenant-edit", args=[tenant.pk])).status_code == 200
    assert viewer_ui.get(reverse("ui:tenant-new")).status_code == 403
    assert viewer_ui.get(reverse("ui:tenant-delete", args=[tenant.pk])).status_code == 403
    response = viewer_ui.post(reverse("ui:tenant-edit", args=[tenant.pk]), form_data("tenant", tenant, description="d"))
    assert response.status_code == 302 and Tenant.objects.get().description == "d"
    assert AuditEntry.objects.filter(object_type="tenants.tenant", action="update").get().actor_repr == "viewer"


def _links(html: str, objects: dict) -> set[str]:
    """Which write links of ``objects`` a page shows."""
    urls = {f"{kind}-{what}": reverse(f"ui:{kind}-{what}", args=[obj.pk]) for kind, obj in objects.items()
            for what in ("edit", "delete")}
    urls.update({f"{kind}-new": reverse(f"ui:{kind}-new") for kind in objects})
    return {name for name, url in urls.items() if f'href="{url}' in html}


def test_detail_pages_hide_write_buttons_without_permissions(viewer_ui, objects):
    tenant, model, release, node = objects["tenant"], objects["model"], objects["release"], objects["node"]
    for name, pk in (("ui:registry", None), ("ui:tenant", tenant.pk), ("ui:model", model.pk),
                     ("ui:release", release.pk), ("ui:node", node.pk),
                     ("ui:request-group", objects["request-group"].pk)):
        response = viewer_ui.get(reverse(name, args=[pk] if pk else []))
        assert response.status_code == 200, name
        assert _links(response.content.decode(), objects) == set(), name


def test_detail_pages_show_write_buttons_with_permissions(ui, objects):
    tenant, model, release, node = objects["tenant"], objects["model"], objects["release"], objects["node"]
    shown = set()
    for name, pk in (("ui:registry", None), ("ui:tenant", tenant.pk), ("ui:model", model.pk),
                     ("ui:release", release.pk), ("ui:node", node.pk),
                     ("ui:request-group", objects["request-group"].pk)):
        shown |= _links(ui.get(reverse(name, args=[pk] if pk else [])).content.decode(), objects)
    assert shown >= {f"{kind}-{what}" for kind in objects for what in ("new", "edit", "delete")}


def test_partial_permissions_show_only_their_buttons(viewer, viewer_ui, objects):
    grant(viewer, "tenants.change_tenant")
    html = viewer_ui.get(reverse("ui:tenant", args=[objects["tenant"].pk])).content.decode()
    assert _links(html, objects) == {"tenant-edit"}


# --- rolling upgrade and purge ------------------------------------------------------------------------------


@pytest.fixture
def serving(objects):
    return objects["release"]


def test_upgrade_steps_refuse_a_user_without_the_permissions(viewer_ui, serving):
    model = serving.model
    page = viewer_ui.get(reverse("ui:upgrade", args=[model.pk]))
    html = page.content.decode()
    assert page.status_code == 200 and 'id="start-upgrade"' not in html and 'id="start-not-allowed"' in html
    assert "tenants.add_release, tenants.add_instanceassignment" in html
    started = viewer_ui.post(reverse("ui:upgrade-start", args=[model.pk]),
                             {"namespace": "production-2026-08", "port_offset": "100"})
    assert started.status_code == 403 and "tenants.add_release" in started.content.decode()
    assert Release.objects.count() == 1
    new = flow.start_upgrade(serving, "production-2026-08", copy_instances=True, port_offset=100)
    html = viewer_ui.get(reverse("ui:upgrade", args=[model.pk])).content.decode()
    assert 'id="shift-button"' not in html and 'id="abort-button"' not in html and 'id="shift-not-allowed"' in html
    for step in ("shift", "abort"):
        response = viewer_ui.post(reverse(f"ui:upgrade-{step}", args=[model.pk]))
        assert response.status_code == 403 and "tenants.change_release" in response.content.decode()
    new.refresh_from_db()
    assert new.state == "warming"
    flow.shift_traffic(model)
    html = viewer_ui.get(reverse("ui:upgrade", args=[model.pk])).content.decode()
    assert 'id="retire-button"' not in html and 'id="retire-not-allowed"' in html
    response = viewer_ui.post(reverse("ui:upgrade-retire", args=[model.pk]))
    assert response.status_code == 403 and "tenants.delete_instanceassignment" in response.content.decode()
    serving.refresh_from_db()
    assert serving.state == "draining"


def test_upgrade_start_with_the_permissions(viewer, viewer_ui, serving):
    grant(viewer, "tenants.add_release", "tenants.add_instanceassignment")
    assert 'id="start-upgrade"' in viewer_ui.get(reverse("ui:upgrade", args=[serving.model.pk])).content.decode()
    response = viewer_ui.post(reverse("ui:upgrade-start", args=[serving.model.pk]),
                              {"namespace": "production-2026-08", "port_offset": "100", "copy_instances": "on"})
    assert response.status_code == 302 and Release.objects.get(namespace="production-2026-08").assignments.exists()


def test_purge_needs_delete_release(viewer, viewer_ui, serving, monkeypatch):
    from dashboard.rollout import purge

    sent = []
    monkeypatch.setattr(purge.app, "send_task", lambda name, **kw: sent.append(name))
    new = flow.start_upgrade(serving, "production-2026-08", copy_instances=True, port_offset=100)
    flow.abort_upgrade(serving.model)
    url = reverse("ui:purge", args=[new.pk])
    page = viewer_ui.get(url).content.decode()
    assert 'id="purge-button"' not in page and 'id="purge-not-allowed"' in page
    assert reverse("ui:purge", args=[new.pk]) not in viewer_ui.get(reverse("ui:upgrade", args=[serving.model.pk])
                                                                    ).content.decode()
    refused = viewer_ui.post(url, {"confirm": new.namespace})
    assert refused.status_code == 403 and "tenants.delete_release" in refused.content.decode()
    assert sent == [] and not AuditEntry.objects.filter(object_type=purge.REQUEST_TYPE).exists()
    grant(viewer, "tenants.delete_release")
    assert 'id="purge-button"' in viewer_ui.get(url).content.decode()
    assert viewer_ui.post(url, {"confirm": new.namespace}).status_code == 302 and sent


@pytest.mark.parametrize(("kind", "phrase"), [("assignment", "You may not create an instance"),
                                              ("tenant", "You may not create a tenant"),
                                              ("request-group", "You may not create a request group")])
def test_refused_create_names_the_object_with_the_right_article(viewer_ui, kind, phrase):
    response = viewer_ui.get(reverse(f"ui:{kind}-new"))
    assert response.status_code == 403 and phrase in response.content.decode()
