"""Routes of the REST API; each resource registers its viewset on the router."""
from django.urls import path
from rest_framework.routers import DefaultRouter

from dashboard.api import names, tokens, views

router = DefaultRouter()
router.register("tenants", views.TenantViewSet, basename="tenant")
router.register("models", views.ServedModelViewSet, basename="servedmodel")
router.register("releases", views.ReleaseViewSet, basename="release")
router.register("request-groups", views.RequestGroupViewSet, basename="requestgroup")
router.register("nodes", views.NodeViewSet, basename="node")
router.register("assignments", views.InstanceAssignmentViewSet, basename="instanceassignment")
router.register("reserved-namespaces", views.ReservedNamespaceViewSet, basename="reservednamespace")
router.register("audit", views.AuditEntryViewSet, basename="auditentry")
router.register("memberships", views.TenantMembershipViewSet, basename="tenantmembership")

urlpatterns = [
    # POST username + password -> {"token": ...}, shown once (like `manage.py create_api_token USER`).
    path("auth-token/", tokens.ObtainToken.as_view(), name="api-auth-token"),
    path("tokens/", tokens.TokenList.as_view(), name="api-tokens"),
    path("tokens/<str:token_key>/", tokens.TokenRevoke.as_view(), name="api-token"),
    # GET ?q=prefix&limit=20 -> the first names of a kind the user may see (the pages' filter type-ahead)
    path("names/<str:kind>/", names.NameSuggestions.as_view(), name="api-names"),
    *router.urls,
]
