"""API tokens (django-rest-knox): hashed at rest and shown once, listed without the token, revoked one by one,
expiring; the token endpoint is throttled and locked (django-axes) after repeated wrong passwords; the commands."""
from __future__ import annotations

import io
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.test import Client
from django.utils import timezone
from knox.models import AuthToken
from rest_framework.test import APIClient

from tests.support.factories import PLATFORM_ADMIN, grant

pytestmark = pytest.mark.django_db
V1 = "/api/v1"


def _obtain(username: str = "operator", password: str = "operator-pw", client: APIClient | None = None):
    return (client or APIClient()).post(f"{V1}/auth-token/", {"username": username, "password": password},
                                        format="json")


def _with(token: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    return client


def _database_text() -> str:
    out = io.StringIO()
    call_command("dumpdata", stdout=out)
    return out.getvalue()


def test_a_token_is_shown_once_and_stored_only_as_a_digest(operator):
    response = _obtain()
    assert response.status_code == 200 and response["Cache-Control"] == "no-store"
    token = response.json()["token"]
    assert len(token) == 64 and response.json()["token_key"] == token[:15]
    assert _with(token).get(f"{V1}/tenants/").status_code == 200
    stored = AuthToken.objects.get(user=operator)
    assert stored.digest != token and token not in stored.digest
    assert token not in _database_text()  # no table holds the token (only its first 15 characters, as token_key)
    listed = _with(token).get(f"{V1}/tokens/").json()
    assert listed["count"] == 1 and set(listed["results"][0]) == {"token_key", "created", "expiry"}
    assert token not in _with(token).get(f"{V1}/tokens/").content.decode()


def test_revoking_one_token_leaves_the_others(operator, superuser):
    first, second = _obtain().json()["token"], _obtain().json()["token"]
    other = _obtain("root-admin", "admin-pw").json()
    client = _with(first)
    assert client.delete(f"{V1}/tokens/{other['token_key']}/").status_code == 404  # not the caller's
    assert client.delete(f"{V1}/tokens/{first[:15]}/").status_code == 204
    assert _with(first).get(f"{V1}/tenants/").status_code == 401
    assert _with(second).get(f"{V1}/tenants/").status_code == 200
    assert _with(other["token"]).get(f"{V1}/tenants/").status_code == 200


def test_tokens_expire(operator, settings):
    response = _obtain()
    token = response.json()["token"]
    expiry = AuthToken.objects.get(user=operator).expiry
    assert abs(expiry - (timezone.now() + timedelta(hours=30 * 24))) < timedelta(minutes=1)
    assert response.json()["expiry"] is not None
    AuthToken.objects.filter(user=operator).update(expiry=timezone.now() - timedelta(seconds=1))
    assert _with(token).get(f"{V1}/tenants/").status_code == 401
    assert not AuthToken.objects.filter(user=operator).exists()  # knox deletes an expired token it meets


def test_the_token_endpoint_is_throttled_per_address(operator):
    # a different username each time: django-axes (per username and address) does not lock, the throttle does
    statuses = [_obtain(f"guess-{n}", "wrong").status_code for n in range(11)]
    assert statuses == [400] * 10 + [429]  # the "auth-token" rate: 10/min
    assert _obtain().status_code == 429  # the right password too, from this address
    assert _obtain(client=APIClient(REMOTE_ADDR="10.9.9.9")).status_code == 200  # another address
    spoofed = APIClient(REMOTE_ADDR="127.0.0.1", HTTP_X_FORWARDED_FOR="10.7.7.7")
    assert _obtain(client=spoofed).status_code == 429  # X-Forwarded-For is not the client's to choose


def test_wrong_passwords_lock_the_username_for_the_address(operator, settings):
    statuses = [_obtain(password="wrong").status_code for _ in range(settings.AXES_FAILURE_LIMIT)]
    assert statuses == [400] * (settings.AXES_FAILURE_LIMIT - 1) + [429]


def test_lockout_refuses_the_right_password_until_the_cool_off_ends(operator, settings):
    from axes.models import AccessAttempt

    for _ in range(settings.AXES_FAILURE_LIMIT):
        _obtain(password="wrong")
    locked = _obtain()
    assert locked.status_code == 429 and "locked for 15 minutes" in locked.json()["detail"]
    assert not AuthToken.objects.filter(user=operator).exists()
    AccessAttempt.objects.update(attempt_time=timezone.now() - settings.AXES_COOLOFF_TIME - timedelta(seconds=1))
    assert _obtain().status_code == 200


def test_login_form_locks_after_wrong_passwords(operator, settings):
    from axes.models import AccessAttempt

    browser = Client()
    for _ in range(settings.AXES_FAILURE_LIMIT - 1):
        assert browser.post("/accounts/login/", {"username": "operator", "password": "wrong"}).status_code == 200
    last = browser.post("/accounts/login/", {"username": "operator", "password": "wrong"})
    assert last.status_code == 429 and 'id="locked-out"' in last.content.decode()
    right = browser.post("/accounts/login/", {"username": "operator", "password": "operator-pw"})
    assert right.status_code == 429 and "_auth_user_id" not in browser.session
    AccessAttempt.objects.update(attempt_time=timezone.now() - settings.AXES_COOLOFF_TIME - timedelta(seconds=1))
    assert browser.post("/accounts/login/", {"username": "operator", "password": "operator-pw"}).status_code == 302
    assert browser.session["_auth_user_id"] == str(operator.pk)


def test_create_and_revoke_commands(operator):
    out, err = io.StringIO(), io.StringIO()
    call_command("create_api_token", "operator", "--hours", "2", stdout=out, stderr=err)
    token = out.getvalue().strip()
    assert _with(token).get(f"{V1}/tenants/").status_code == 200 and "not shown again" in err.getvalue()
    assert AuthToken.objects.get(user=operator).expiry < timezone.now() + timedelta(hours=2, minutes=1)
    out = io.StringIO()
    call_command("revoke_api_tokens", "operator", "--key", token[:15], stdout=out)
    assert "Revoked 1" in out.getvalue() and _with(token).get(f"{V1}/tenants/").status_code == 401
    from django.core.management.base import CommandError

    with pytest.raises(CommandError, match="No user named"):
        call_command("create_api_token", "nobody")


def test_the_admin_is_for_platform_admins_and_shows_no_token(django_user_model, operator):
    token = _obtain().json()["token"]
    staff = django_user_model.objects.create_user("staff", password="pw", is_staff=True)
    grant(staff, "knox.view_authtoken", "auth.view_user")
    browser = Client()
    browser.force_login(staff)
    assert browser.get("/admin/knox/authtoken/").status_code == 302  # not a platform admin: to the login page
    grant(staff, PLATFORM_ADMIN)
    page = browser.get("/admin/knox/authtoken/")
    assert page.status_code == 200 and "operator" in page.content.decode()
    assert token not in page.content.decode()


@pytest.mark.parametrize("raw", ["ten", "10", "0/min", "10/week", "-1/s", "1.5/min", "10/ min"])
def test_a_malformed_token_rate_stops_start_up(monkeypatch, raw):
    from dashboard.env import ImproperlyConfiguredValue, env_rate

    monkeypatch.setenv("KVPOOL_AUTH_TOKEN_RATE", raw)
    with pytest.raises(ImproperlyConfiguredValue, match="KVPOOL_AUTH_TOKEN_RATE"):
        env_rate("KVPOOL_AUTH_TOKEN_RATE", "10/min")


def test_token_rates(monkeypatch):
    from dashboard.env import env_rate

    assert env_rate("KVPOOL_AUTH_TOKEN_RATE", "10/min") == "10/min"
    monkeypatch.setenv("KVPOOL_AUTH_TOKEN_RATE", "100/hour")
    assert env_rate("KVPOOL_AUTH_TOKEN_RATE", "10/min") == "100/hour"


def test_a_new_token_deletes_the_users_expired_ones_and_a_request_refuses_only_its_own(operator, superuser):
    old, live = _obtain().json()["token"], _obtain().json()["token"]
    admin_old = _obtain("root-admin", "admin-pw").json()["token"]
    AuthToken.objects.filter(token_key__in=[old[:15], admin_old[:15]]).update(
        expiry=timezone.now() - timedelta(seconds=1))
    assert _with(live).get(f"{V1}/tenants/").status_code == 200  # the expired ones neither work nor matter here
    assert _with(old).get(f"{V1}/tenants/").status_code == 401
    assert not AuthToken.objects.filter(token_key=old[:15]).exists()  # refused and deleted
    AuthToken.objects.filter(token_key=live[:15]).update(expiry=timezone.now() - timedelta(seconds=1))
    fresh = _obtain().json()["token"]
    assert sorted(AuthToken.objects.filter(user=operator).values_list("token_key", flat=True)) == [fresh[:15]]
    assert AuthToken.objects.filter(token_key=admin_old[:15]).exists()  # another user's tokens stay
    assert _with(admin_old).get(f"{V1}/tenants/").status_code == 401
