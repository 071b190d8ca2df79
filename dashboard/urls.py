"""URL routes: admin, REST API under /api/v1/, OpenAPI schema, dashboard pages."""
from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from dashboard.telemetry.metrics import metrics_view

urlpatterns = [
    path("admin/", admin.site.urls),
    path("accounts/", include("django.contrib.auth.urls")),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    path("api/schema/swagger/", SpectacularSwaggerView.as_view(url_name="schema"), name="swagger"),
    path("api/v1/", include("dashboard.api.urls")),
    path("api/v1/", include("dashboard.api.telemetry_urls")),
    path("metrics", metrics_view, name="metrics"),
    path("", include("dashboard.page_urls")),
]
