"""Routes of the telemetry API, included from ``dashboard/urls.py`` under ``api/v1/``."""
from django.urls import path

from dashboard.api import chargeback, telemetry

urlpatterns = [
    path("telemetry/nodes/", telemetry.NodeStateList.as_view(), name="telemetry-nodes"),
    path("telemetry/nodes/<str:name>/", telemetry.NodeStateDetail.as_view(), name="telemetry-node"),
    path("telemetry/nodes/<str:name>/push/", telemetry.NodePush.as_view(), name="telemetry-node-push"),
    path("telemetry/occupancy/", telemetry.OccupancyList.as_view(), name="telemetry-occupancy"),
    path("telemetry/instances/", telemetry.InstanceStatsList.as_view(), name="telemetry-instances"),
    path("telemetry/instances/<str:name>/<str:instance_id>/", telemetry.InstanceStatsDetail.as_view(),
         name="telemetry-instance"),
    path("telemetry/master/", telemetry.MasterQuotaOverview.as_view(), name="telemetry-master"),
    path("telemetry/master/samples/", telemetry.MasterQuotaSamples.as_view(), name="telemetry-master-samples"),
    path("telemetry/chargeback/", chargeback.ChargebackView.as_view(), name="telemetry-chargeback"),
    path("telemetry/chargeback.csv", chargeback.ChargebackCsv.as_view(), name="telemetry-chargeback-csv"),
]
