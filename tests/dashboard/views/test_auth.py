"""Every page needs a login; JSON endpoints answer 401; the login page logs in."""
from __future__ import annotations

import pytest
from django.urls import reverse

from tests.support.factories import make_model, make_node, make_release, make_tenant

pytestmark = pytest.mark.django_db


@pytest.fixture
def objects():
    tenant = make_tenant()
    model = make_model(tenant)
    release = make_release(model)
    node = make_node()
    return {"tenant": tenant, "model": model, "release": release, "node": node}


def page_urls(objects) -> list[str]:
    t, m, r, n = objects["tenant"], objects["model"], objects["release"], objects["node"]
    return [
        reverse("ui:overview"), reverse("ui:occupancy"), reverse("ui:checks"), reverse("ui:audit"),
        reverse("ui:registry"), reverse("ui:tenant", args=[t.pk]), reverse("ui:model", args=[m.pk]),
        reverse("ui:release", args=[r.pk]), reverse("ui:node", args=[n.pk]), reverse("ui:upgrade", args=[m.pk]),
        reverse("ui:purge", args=[r.pk]), reverse("ui:release-config", args=[r.pk]),
        reverse("ui:tenant-new"), reverse("ui:tenant-edit", args=[t.pk]), reverse("ui:tenant-delete", args=[t.pk]),
    ]


def test_pages_redirect_anonymous_users_to_the_login(client, objects):
    for url in page_urls(objects):
        response = client.get(url)
        assert response.status_code == 302, url
        assert response["Location"].startswith("/accounts/login/?next="), url


@pytest.mark.parametrize("name", ["ui:occupancy-data", "ui:checks-data"])
def test_json_endpoints_answer_401(client, name):
    response = client.get(reverse(name))
    assert response.status_code == 401
    assert response.json() == {"detail": "Authentication credentials were not provided."}


def test_post_steps_refuse_anonymous_users(client, objects):
    model = objects["model"]
    for name in ("ui:upgrade-start", "ui:upgrade-shift", "ui:upgrade-retire", "ui:upgrade-abort"):
        response = client.post(reverse(name, args=[model.pk]))
        assert response.status_code == 302 and "/accounts/login/" in response["Location"]
    assert objects["release"].state == "warming"


def test_login_page_logs_in_and_follows_next(client, operator):
    page = client.get("/accounts/login/?next=/checks/")
    assert page.status_code == 200 and b'name="username"' in page.content
    response = client.post("/accounts/login/", {"username": "operator", "password": "operator-pw", "next": "/checks/"})
    assert response.status_code == 302 and response["Location"] == "/checks/"
    assert client.get("/checks/").status_code == 200


def test_wrong_password_is_refused(client, operator):
    response = client.post("/accounts/login/", {"username": "operator", "password": "nope"})
    assert response.status_code == 200
    assert b"Please enter a correct username and password" in response.content


def test_logout_is_a_post(ui):
    assert ui.post("/accounts/logout/").status_code in (200, 302)
    assert ui.get("/").status_code == 302
