"""Routes of the REST API; each resource registers its viewset on the router."""
from django.urls import path
from rest_framework.authtoken.views import obtain_auth_token
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

urlpatterns = [
    # POST username + password -> {"token": ...} (same token as `manage.py drf_create_token USER`).
    path("auth-token/", obtain_auth_token, name="api-auth-token"),
    *router.urls,
]
