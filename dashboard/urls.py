"""URL routes: admin, REST API under /api/v1/, OpenAPI schema, dashboard pages."""
from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from dashboard.telemetry.metrics import metrics_view
from dashboard.views import accounts

urlpatterns = [
    path("admin/", admin.site.urls),
    # Login (django-axes lockout) and password reset only where mail is configured (dashboard.views.accounts).
    path("accounts/login/", accounts.LoginView.as_view(), name="login"),
    path("accounts/password_reset/", accounts.password_reset, name="password_reset"),
    path("accounts/password_reset/done/", accounts.password_reset_done, name="password_reset_done"),
    path("accounts/reset/<uidb64>/<token>/", accounts.password_reset_confirm, name="password_reset_confirm"),
    path("accounts/reset/done/", accounts.password_reset_complete, name="password_reset_complete"),
    path("accounts/", include("django.contrib.auth.urls")),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    # GET only: drf-spectacular's Swagger view has no template for an OPTIONS answer (it was a 500).
    path("api/schema/swagger/", SpectacularSwaggerView.as_view(url_name="schema", http_method_names=["get", "head"]),
         name="swagger"),
    path("api/v1/", include("dashboard.api.urls")),
    path("api/v1/", include("dashboard.api.telemetry_urls")),
    path("metrics", metrics_view, name="metrics"),
    path("", include("dashboard.page_urls")),
]

# JSON errors under /api/, HTML pages elsewhere (dashboard.views.errors).
handler400 = "dashboard.views.errors.bad_request"
handler404 = "dashboard.views.errors.page_not_found"
handler500 = "dashboard.views.errors.server_error"
