"""Static files (CSS, vendored Chart.js) are served by the app itself with DEBUG off (WhiteNoise, no collectstatic)."""
from __future__ import annotations

import pytest
from django.test import Client

from dashboard.settings import BASE_DIR

pytestmark = pytest.mark.django_db

CHARTJS = "/static/vendor/chartjs/chart.umd.min.js"
CSS = "/static/dashboard/style.css"


@pytest.mark.parametrize("url, source", [
    (CHARTJS, BASE_DIR / "dashboard/static/vendor/chartjs/chart.umd.min.js"),
    (CSS, BASE_DIR / "dashboard/static/dashboard/style.css"),
])
def test_static_files_are_served_without_debug(settings, url, source):
    settings.DEBUG = False
    response = Client().get(url)  # a fresh client builds the middleware under DEBUG=False
    assert response.status_code == 200
    assert b"".join(response.streaming_content) == source.read_bytes()


def test_pages_link_the_served_static_files(settings, ui):
    settings.DEBUG = False
    page = ui.get("/").content.decode()
    assert CSS in page and Client().get(CSS).status_code == 200
