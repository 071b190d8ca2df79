"""Login and password pages: password reset by e-mail only where mail is configured (nothing sent, nothing
pretended otherwise); navigation shows platform pages (checks, admin) to platform admins only."""
from __future__ import annotations

import pytest
from django.core import mail
from django.test import Client
from django.urls import reverse

from tests.support.factories import grant_role, make_tenant

pytestmark = pytest.mark.django_db


@pytest.fixture
def user(django_user_model):
    return django_user_model.objects.create_user("mia", email="mia@example.com", password="mia-pw")


def test_without_mail_password_reset_says_so_and_sends_nothing(user, settings):
    settings.EMAIL_HOST = ""
    browser = Client()
    assert "password-reset-link" not in browser.get(reverse("login")).content.decode()
    for response in (browser.get(reverse("password_reset")),
                     browser.post(reverse("password_reset"), {"email": "mia@example.com"}),
                     browser.get(reverse("password_reset_done"))):
        page = response.content.decode()
        assert response.status_code == 404 and 'id="password-reset-unavailable"' in page
        assert "no message was sent" in page and "emailed" not in page.lower()
    assert mail.outbox == []


def test_with_mail_password_reset_sends_the_link(user, settings):
    settings.EMAIL_HOST = "smtp.example.com"
    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
    browser = Client()
    assert 'id="password-reset-link"' in browser.get(reverse("login")).content.decode()
    response = browser.post(reverse("password_reset"), {"email": "mia@example.com"})
    assert response.status_code == 302 and response["Location"] == reverse("password_reset_done")
    assert len(mail.outbox) == 1 and mail.outbox[0].to == ["mia@example.com"]
    assert "/accounts/reset/" in mail.outbox[0].body


def test_platform_pages_are_for_platform_admins(user, operator):
    member = grant_role(user, make_tenant(), "admin")
    browser = Client()
    browser.force_login(member)
    nav = browser.get(reverse("ui:overview")).content.decode()
    assert reverse("ui:checks") not in nav and reverse("admin:index") not in nav
    assert browser.get(reverse("ui:checks")).status_code == 403
    assert browser.get(reverse("ui:checks-data")).status_code == 403
    browser.force_login(operator)
    assert reverse("ui:checks") in browser.get(reverse("ui:overview")).content.decode()
    assert browser.get(reverse("ui:checks-data")).status_code == 200
