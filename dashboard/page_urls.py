"""Routes of the dashboard pages (namespace ``ui``), included at the site root by ``dashboard/urls.py``."""
from django.urls import path

from dashboard.views import audit, checks, edit, occupancy, overview, registry, upgrade

app_name = "ui"

urlpatterns = [
    path("", overview.overview, name="overview"),
    path("occupancy/", occupancy.occupancy_page, name="occupancy"),
    path("occupancy/data.json", occupancy.occupancy_data, name="occupancy-data"),
    path("checks/", checks.checks_page, name="checks"),
    path("checks/data.json", checks.checks_data, name="checks-data"),
    path("audit/", audit.audit_log, name="audit"),
    path("registry/", registry.registry_index, name="registry"),
    path("tenants/<int:pk>/", registry.tenant_detail, name="tenant"),
    path("models/<int:pk>/", registry.model_detail, name="model"),
    path("models/<int:pk>/upgrade/", upgrade.upgrade_page, name="upgrade"),
    path("models/<int:pk>/upgrade/start/", upgrade.upgrade_start, name="upgrade-start"),
    path("models/<int:pk>/upgrade/shift/", upgrade.upgrade_shift, name="upgrade-shift"),
    path("models/<int:pk>/upgrade/retire/", upgrade.upgrade_retire, name="upgrade-retire"),
    path("models/<int:pk>/upgrade/abort/", upgrade.upgrade_abort, name="upgrade-abort"),
    path("releases/<int:pk>/", registry.release_detail, name="release"),
    path("releases/<int:pk>/config.json", registry.release_config_download, name="release-config"),
    path("releases/<int:pk>/config/<int:assignment_pk>.json", registry.instance_config_download,
         name="instance-config"),
    path("releases/<int:pk>/purge/", upgrade.purge_page, name="purge"),
    path("nodes/<int:pk>/", registry.node_detail, name="node"),
    path("request-groups/<int:pk>/", registry.request_group_detail, name="request-group"),
]

for _slug in edit.KINDS:
    urlpatterns += [
        path(f"{_slug}s/new/", edit.create, {"kind": _slug}, name=f"{_slug}-new"),
        path(f"{_slug}s/<int:pk>/edit/", edit.edit, {"kind": _slug}, name=f"{_slug}-edit"),
        path(f"{_slug}s/<int:pk>/delete/", edit.delete, {"kind": _slug}, name=f"{_slug}-delete"),
    ]
