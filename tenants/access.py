"""Tenant-scoped access: who sees and who changes which tenant's objects.

* **Platform admins** — superusers, and users holding the permission ``tenants.platform_admin`` (directly or
  through a group) — see every tenant. Each of their writes needs the Django model permission of that write
  (``tenants.change_release`` ...), granted in the Django admin, as before tenant membership existed.
* **Everyone else** sees only the tenants they hold a ``TenantMembership`` in, and may do in each tenant exactly
  what its role grants (``ROLE_PERMISSIONS``: viewer, operator, admin). Model permissions of the ``tenants`` app
  granted to such a user in the Django admin do not apply: they would reach every tenant.
* **Objects without a tenant**: a node runs instances of several tenants, so nodes (name, host, ports, drift) are
  visible to every authenticated user while their per-tenant content (instances, occupancy, engine facts, the
  instances of a node's config document) is filtered; node writes, pushes and signing secrets are platform-admin
  only. Reports, config documents as stored, agent message refusals: platform admins only.

``scope(queryset, user)`` is the one queryset-scoping helper: every API viewset's ``get_queryset``, every
FilterSet's related-object choices, every page, chart data view and download narrows its rows with it. It knows
how each model reaches its tenant (``SCOPES``) and refuses a model it does not know (so a new model must decide).
``TenantAccessBackend`` (``AUTHENTICATION_BACKENDS``) makes ``user.has_perm(perm, obj)`` answer with these rules,
which DRF's permission classes, the pages and the templates' ``perms`` use.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.contrib.auth.backends import ModelBackend
from django.core.exceptions import ImproperlyConfigured
from django.db.models import Model, QuerySet

from tenants.choices import TenantRole
from tenants.models.membership import PLATFORM_ADMIN_PERMISSION

_VIEW = frozenset({
    "tenants.view_tenant", "tenants.view_servedmodel", "tenants.view_release", "tenants.view_requestgroup",
    "tenants.view_instanceassignment", "tenants.view_auditentry", "tenants.view_reservednamespace",
    "tenants.view_reservedsalt",
})
_OPERATE = _VIEW | {
    "tenants.add_servedmodel", "tenants.change_servedmodel",
    "tenants.add_release", "tenants.change_release",
    "tenants.add_requestgroup", "tenants.change_requestgroup",
    "tenants.add_instanceassignment", "tenants.change_instanceassignment", "tenants.delete_instanceassignment",
}
_ADMINISTER = _OPERATE | {
    "tenants.delete_servedmodel", "tenants.delete_release", "tenants.delete_requestgroup", "tenants.change_tenant",
}

#: The Django model permissions each role grants inside its tenant. Creating or deleting tenants, nodes and
#: memberships, pushing configuration and reading node secrets are platform-admin actions.
ROLE_PERMISSIONS: dict[str, frozenset[str]] = {
    TenantRole.VIEWER: _VIEW,
    TenantRole.OPERATOR: frozenset(_OPERATE),
    TenantRole.ADMIN: frozenset(_ADMINISTER),
}

#: Fields of a tenant only a platform admin may change: the Mooncake name, the quota (a share of the pool every
#: tenant draws on) and the engine account (the node account the tenant's engines run as: naming another account
#: would run them as it). A tenant admin may change the description.
PLATFORM_TENANT_FIELDS = ("tenant_id", "quota_bytes", "engine_user")

#: Apps whose permissions follow the tenant rules for users who are not platform admins.
_SCOPED_APPS = frozenset({"tenants"})


@dataclass(frozen=True)
class TenantScope:
    """How rows of a model reach their tenant.

    ``kind``: ``"pk"`` — ``path`` is a lookup to the ``Tenant`` (``"model__tenant"``) or to a tenant primary key
    (``"tenant_pk"``); ``"name"`` — ``path`` is a field holding the Mooncake ``tenant_id`` as text (telemetry rows,
    reserved names: they outlive the tenant); ``"all"`` — visible to every authenticated user (nodes);
    ``"platform"`` — platform admins only.
    """

    kind: str
    path: str = ""


#: ``<app_label>.<model_name>`` -> its ``TenantScope``. Models of other apps are named as text (``tenants`` does
#: not import the dashboard).
SCOPES: dict[str, TenantScope] = {
    "tenants.tenant": TenantScope("pk", "pk"),
    "tenants.servedmodel": TenantScope("pk", "tenant"),
    "tenants.release": TenantScope("pk", "model__tenant"),
    "tenants.requestgroup": TenantScope("pk", "tenant"),
    "tenants.instanceassignment": TenantScope("pk", "release__model__tenant"),
    "tenants.tenantmembership": TenantScope("pk", "tenant"),
    "tenants.auditentry": TenantScope("pk", "tenant_pk"),
    "tenants.reservednamespace": TenantScope("name", "tenant_id"),
    "tenants.reservedsalt": TenantScope("name", "tenant_id"),
    "tenants.reservedtenantid": TenantScope("platform"),
    "tenants.reservedengineuser": TenantScope("platform"),
    "tenants.node": TenantScope("all"),
    "auth.user": TenantScope("platform"),
    "dashboard.occupancysample": TenantScope("name", "tenant_id"),
    "dashboard.instancestats": TenantScope("name", "tenant_id"),
    "dashboard.masterquotasample": TenantScope("name", "tenant_id"),
    "dashboard.masterquotasync": TenantScope("name", "tenant_id"),
    "dashboard.nodestate": TenantScope("all"),
    "dashboard.configversion": TenantScope("platform"),
    "dashboard.configack": TenantScope("platform"),
    "dashboard.report": TenantScope("platform"),
    "dashboard.messagerejection": TenantScope("platform"),
}


def scope_of(model: type[Model]) -> TenantScope:
    """The ``TenantScope`` of ``model``; raises ``ImproperlyConfigured`` for a model ``SCOPES`` does not name."""
    try:
        return SCOPES[model._meta.label_lower]
    except KeyError:
        raise ImproperlyConfigured(f"tenants.access.SCOPES does not say how {model._meta.label_lower} rows reach "
                                   "their tenant; add it there.") from None


def is_platform_admin(user: Any) -> bool:
    """True for an active superuser or a user holding ``tenants.platform_admin`` (directly or by group)."""
    if user is None or not getattr(user, "is_authenticated", False) or not user.is_active:
        return False
    return bool(user.is_superuser or ModelBackend().has_perm(user, PLATFORM_ADMIN_PERMISSION))


def tenant_roles(user: Any) -> dict[int, str]:
    """``{tenant primary key: role}`` of ``user``'s memberships (empty for anonymous users); cached on the user
    object for the request."""
    if user is None or not getattr(user, "is_authenticated", False):
        return {}
    cached = getattr(user, "_kvpool_tenant_roles", None)
    if cached is None:
        from tenants.models.membership import TenantMembership

        cached = dict(TenantMembership.objects.filter(user=user).values_list("tenant_id", "role"))
        user._kvpool_tenant_roles = cached
    return cached


def member_tenants(user: Any) -> QuerySet:
    """The ``Tenant`` rows ``user`` holds a membership in (a queryset, usable as a subquery)."""
    from tenants.models.tenant import Tenant

    if user is None or not getattr(user, "is_authenticated", False):
        return Tenant.objects.none()
    return Tenant.objects.filter(memberships__user=user)


def visible_tenants(user: Any) -> QuerySet:
    """The tenants ``user`` may see: all of them for a platform admin, else those of their memberships."""
    from tenants.models.tenant import Tenant

    return Tenant.objects.all() if is_platform_admin(user) else member_tenants(user)


def visible_tenant_ids(user: Any) -> frozenset[str] | None:
    """Mooncake ``tenant_id`` names ``user`` may see, or ``None`` for "every tenant" (a platform admin)."""
    if is_platform_admin(user):
        return None
    return frozenset(member_tenants(user).values_list("tenant_id", flat=True))


def scope(queryset: QuerySet, user: Any) -> QuerySet:
    """``queryset`` narrowed to the rows ``user`` may see (see the module docstring and ``SCOPES``).

    Raises ``ImproperlyConfigured`` for a model without a ``TenantScope``.
    """
    rule = scope_of(queryset.model)
    if user is None or not getattr(user, "is_authenticated", False) or not user.is_active:
        return queryset.none()
    if rule.kind == "all" or is_platform_admin(user):
        return queryset
    if rule.kind == "platform":
        return queryset.none()
    if rule.kind == "name":
        return queryset.filter(**{f"{rule.path}__in": member_tenants(user).values("tenant_id")})
    if rule.path == "tenant_pk":
        return queryset.filter(tenant_pk__in=member_tenants(user).values("pk"))
    return queryset.filter(**{f"{rule.path}__in": member_tenants(user)})


def tenant_pk_of(obj: Any) -> int | None:
    """Primary key of the tenant ``obj`` belongs to (saved or not), ``None`` when it belongs to none.

    Follows ``SCOPES``: ``Release`` -> ``model.tenant_id``; a name-scoped row looks its tenant up by name.
    """
    from tenants.models.tenant import Tenant

    if isinstance(obj, Tenant):
        return obj.pk
    rule = SCOPES.get(obj._meta.label_lower)
    if rule is None or rule.kind in ("all", "platform"):
        return None
    if rule.kind == "name":
        return Tenant.objects.filter(tenant_id=getattr(obj, rule.path)).values_list("pk", flat=True).first()
    if rule.path == "tenant_pk":
        return obj.tenant_pk
    *hops, last = rule.path.split("__")
    current = obj
    for hop in hops:
        if getattr(current, f"{hop}_id", None) is None:
            return None
        current = getattr(current, hop)
    return getattr(current, f"{last}_id", None)


class TenantAccessBackend(ModelBackend):
    """Django's ``ModelBackend`` with the tenant rules of this module (listed in ``AUTHENTICATION_BACKENDS``).

    ``has_perm(user, perm, obj)``:

    * a platform admin: the user's model permissions, whatever ``obj`` (``obj`` is ignored);
    * anyone else, for a ``tenants.*`` permission: with ``obj``, whether their role in ``obj``'s tenant grants
      ``perm`` (``False`` for an object of no tenant); without ``obj``, whether a role in some tenant grants it
      (what a page may offer: "New release" for an operator of any tenant);
    * other apps' permissions: the model permissions, as ``ModelBackend``.
    """

    def has_perm(self, user_obj, perm, obj=None) -> bool:
        if not user_obj.is_active:
            return False
        if perm.partition(".")[0] not in _SCOPED_APPS or is_platform_admin(user_obj):
            return super().has_perm(user_obj, perm)
        roles = tenant_roles(user_obj)
        if obj is None:
            return any(perm in ROLE_PERMISSIONS[role] for role in roles.values())
        tenant_pk = tenant_pk_of(obj)
        role = roles.get(tenant_pk) if tenant_pk is not None else None
        return role is not None and perm in ROLE_PERMISSIONS[role]

    def has_module_perms(self, user_obj, app_label) -> bool:
        if app_label in _SCOPED_APPS and user_obj.is_active and not is_platform_admin(user_obj):
            return bool(tenant_roles(user_obj))
        return super().has_module_perms(user_obj, app_label)


def platform_fields_changed(user: Any, stored: Any, data: dict[str, Any]) -> list[str]:
    """Names of ``PLATFORM_TENANT_FIELDS`` that ``data`` (new values by field name) would change on the tenant
    ``stored``, when ``user`` is not a platform admin (empty list otherwise, or when nothing of them changes)."""
    if is_platform_admin(user):
        return []
    return [name for name in PLATFORM_TENANT_FIELDS if name in data and data[name] != getattr(stored, name)]
