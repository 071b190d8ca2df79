"""Login and password pages (``/accounts/``): the login form, the answer to a locked-out login, and password reset
by e-mail, which exists only where mail is configured.

* Wrong passwords are counted by django-axes per username and client address (``AXES_*`` in the settings): past
  the limit that pair is refused, the right password included, until the cool-off ends — the login form shows
  ``registration/locked_out.html`` with HTTP 429, the API token endpoint a JSON ``{"detail": ...}`` with HTTP 429.
* Password reset sends a link by e-mail. Without ``DJANGO_EMAIL_HOST`` there is no mail to send it with, so the
  reset pages answer HTTP 404 saying so (nothing is sent, nothing pretends to be) and the login page offers no
  reset link; an administrator sets a new password instead (``manage.py changepassword USER``).
"""
from __future__ import annotations

from django.conf import settings
from django.contrib.auth import views as auth_views
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render


def mail_configured() -> bool:
    """True when the dashboard can send mail (``EMAIL_HOST`` set, from ``DJANGO_EMAIL_HOST``)."""
    return bool(settings.EMAIL_HOST)


class LoginView(auth_views.LoginView):
    """Django's login page, offering the password reset link only where mail is configured."""

    def get_context_data(self, **kwargs):
        return {**super().get_context_data(**kwargs), "password_reset_enabled": mail_configured()}


def _without_mail(view):
    """``view`` where mail is configured; elsewhere the page saying that password reset is not available (404)."""

    def gated(request: HttpRequest, *args, **kwargs) -> HttpResponse:
        if not mail_configured():
            return render(request, "registration/password_reset_unavailable.html", status=404)
        return view(request, *args, **kwargs)

    gated.__doc__ = view.__doc__
    return gated


password_reset = _without_mail(auth_views.PasswordResetView.as_view())
password_reset_done = _without_mail(auth_views.PasswordResetDoneView.as_view())
password_reset_confirm = _without_mail(auth_views.PasswordResetConfirmView.as_view())
password_reset_complete = _without_mail(auth_views.PasswordResetCompleteView.as_view())


def lockout_response(request: HttpRequest, original_response=None, credentials=None) -> HttpResponse:
    """``AXES_LOCKOUT_CALLABLE``: HTTP 429 for a login refused because its username and address are locked —
    JSON ``{"detail": ...}`` under ``/api/``, the ``registration/locked_out.html`` page elsewhere."""
    if request.path_info.startswith("/api/"):
        return JsonResponse({"detail": lockout_detail()}, status=429)
    return render(request, "registration/locked_out.html", {"detail": lockout_detail()}, status=429)


def lockout_detail() -> str:
    """The message of a locked-out login, with the cool-off in minutes."""
    minutes = int(settings.AXES_COOLOFF_TIME.total_seconds() // 60)
    return (f"Too many wrong passwords for this username from this address: locked for {minutes} minutes after the "
            "last one. Try again later, or ask an administrator to lift the lock (manage.py axes_reset_username).")
