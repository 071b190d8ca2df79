"""Routes of the REST API; each resource registers its viewset on the router."""
from rest_framework.routers import DefaultRouter

from dashboard.api import views

router = DefaultRouter()
router.register("tenants", views.TenantViewSet, basename="tenant")
router.register("models", views.ServedModelViewSet, basename="servedmodel")
router.register("releases", views.ReleaseViewSet, basename="release")
router.register("request-groups", views.RequestGroupViewSet, basename="requestgroup")
router.register("nodes", views.NodeViewSet, basename="node")
router.register("assignments", views.InstanceAssignmentViewSet, basename="instanceassignment")
router.register("audit", views.AuditEntryViewSet, basename="auditentry")

urlpatterns = router.urls
