"""Routes of the REST API; each resource registers its viewset on the router."""
from rest_framework.routers import DefaultRouter

router = DefaultRouter()
urlpatterns = router.urls
