"""The Django admin for platform admins only (``INSTALLED_APPS`` names ``PlatformAdminConfig`` in place of
``django.contrib.admin``).

The admin lists every tenant's objects and every user's API tokens (their digests), so a staff user needs to be a
platform admin too (``tenants.access.is_platform_admin``); a member of some tenants works in the dashboard pages and
the API, which show their tenants only.
"""
from __future__ import annotations

from django.contrib import admin
from django.contrib.admin.apps import AdminConfig


class PlatformAdminSite(admin.AdminSite):
    """``admin.site``: active staff users who are platform admins."""

    def has_permission(self, request) -> bool:
        from tenants.access import is_platform_admin

        return super().has_permission(request) and is_platform_admin(request.user)


class PlatformAdminConfig(AdminConfig):
    """``django.contrib.admin`` with ``PlatformAdminSite`` as ``admin.site``."""

    default_site = "tenants.admin_site.PlatformAdminSite"
