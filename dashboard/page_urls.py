"""Routes of the dashboard pages (namespace ``ui``), included at the site root by ``dashboard/urls.py``."""
from django.urls import path, register_converter

from dashboard.converters import ObjectIdConverter
from dashboard.views import audit, chargeback, checks, edit, occupancy, overview, registry, upgrade

app_name = "ui"

# Ids in page paths: ASCII digits in [1, 2**63 - 1], as in the API (dashboard.converters).
register_converter(ObjectIdConverter, "id")

urlpatterns = [
    path("", overview.overview, name="overview"),
    path("occupancy/", occupancy.occupancy_page, name="occupancy"),
    path("occupancy/data.json", occupancy.occupancy_data, name="occupancy-data"),
    path("chargeback/", chargeback.chargeback_page, name="chargeback"),
    path("checks/", checks.checks_page, name="checks"),
    path("checks/data.json", checks.checks_data, name="checks-data"),
    path("checks/<slug:key>/", checks.check_page, name="check"),
    path("audit/", audit.audit_log, name="audit"),
    path("registry/", registry.registry_index, name="registry"),
    path("tenants/<id:pk>/", registry.tenant_detail, name="tenant"),
    path("models/<id:pk>/", registry.model_detail, name="model"),
    path("models/<id:pk>/upgrade/", upgrade.upgrade_page, name="upgrade"),
    path("models/<id:pk>/upgrade/start/", upgrade.upgrade_start, name="upgrade-start"),
    path("models/<id:pk>/upgrade/shift/", upgrade.upgrade_shift, name="upgrade-shift"),
    path("models/<id:pk>/upgrade/retire/", upgrade.upgrade_retire, name="upgrade-retire"),
    path("models/<id:pk>/upgrade/abort/", upgrade.upgrade_abort, name="upgrade-abort"),
    path("releases/<id:pk>/", registry.release_detail, name="release"),
    path("releases/<id:pk>/config.json", registry.release_config_download, name="release-config"),
    path("releases/<id:pk>/config/<id:assignment_pk>.json", registry.instance_config_download,
         name="instance-config"),
    path("releases/<id:pk>/purge/", upgrade.purge_page, name="purge"),
    path("nodes/<id:pk>/", registry.node_detail, name="node"),
    path("request-groups/<id:pk>/", registry.request_group_detail, name="request-group"),
]

for _slug in edit.KINDS:
    urlpatterns += [
        path(f"{_slug}s/new/", edit.create, {"kind": _slug}, name=f"{_slug}-new"),
        path(f"{_slug}s/<id:pk>/edit/", edit.edit, {"kind": _slug}, name=f"{_slug}-edit"),
        path(f"{_slug}s/<id:pk>/delete/", edit.delete, {"kind": _slug}, name=f"{_slug}-delete"),
    ]
