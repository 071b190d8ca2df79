"""Builders of valid registry objects for the tests; every write goes through ``validated_save``."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
from django.core.exceptions import ValidationError

from tenants.models import (
    InstanceAssignment,
    Node,
    Release,
    RequestGroup,
    ServedModel,
    Tenant,
)
from tenants.quota import parse_quota
from tenants.services import validated_save

RELEASE_DEFAULTS: dict[str, Any] = {
    "num_layers": 36,
    "num_kv_heads": 8,
    "head_dim": 128,
    "block_size": 16,
    "engine": "vllm",
    "engine_version": "0.33.0",
}


@dataclass(frozen=True)
class RegistryObjects:
    """One object of every registry kind (what the ``registry`` fixtures build); :meth:`of` looks one up by its
    REST resource name (``tenants``, ``models``, ``releases``, ``request-groups``, ``nodes``, ``assignments``)."""

    tenant: Tenant
    model: ServedModel
    release: Release
    request_group: RequestGroup
    node: Node
    assignment: InstanceAssignment

    def of(self, resource: str) -> Tenant | ServedModel | Release | RequestGroup | Node | InstanceAssignment:
        """The object of REST resource ``resource``."""
        return {"tenants": self.tenant, "models": self.model, "releases": self.release,
                "request-groups": self.request_group, "nodes": self.node, "assignments": self.assignment}[resource]


def make_tenant(tenant_id: str = "acme", quota: int | str = "200GB", **kwargs: Any) -> Tenant:
    return validated_save(Tenant(tenant_id=tenant_id, quota_bytes=parse_quota(quota), **kwargs))


def make_model(
    tenant: Tenant, served_model_name: str = "qwen3-8b", model_path: str = "Qwen/Qwen3-8B", **kwargs: Any
) -> ServedModel:
    return validated_save(ServedModel(tenant=tenant, served_model_name=served_model_name, model_path=model_path,
                                      **kwargs))


def make_release(model: ServedModel, namespace: str = "production-2026-07", **kwargs: Any) -> Release:
    return validated_save(Release(model=model, namespace=namespace, **{**RELEASE_DEFAULTS, **kwargs}))


def make_group(tenant: Tenant, name: str = "app-a", **kwargs: Any) -> RequestGroup:
    return validated_save(RequestGroup(tenant=tenant, name=name, **kwargs))


#: The model roots a test node declares unless told otherwise: where the tests' absolute model and adapter paths lie.
TEST_MODEL_ROOTS = ["/adapters", "/models", "/srv"]


def make_node(name: str = "node-a", hostname: str = "10.0.0.1", **kwargs: Any) -> Node:
    kwargs.setdefault("model_roots", list(TEST_MODEL_ROOTS))
    return validated_save(Node(name=name, hostname=hostname, **kwargs))


def make_assignment(node: Node, release: Release, port: int = 8000, **kwargs: Any) -> InstanceAssignment:
    return validated_save(InstanceAssignment(node=node, release=release, port=port, **kwargs))


#: Every write permission of the registry models (what an operator is granted in the Django admin).
REGISTRY_MODELS = ("tenant", "servedmodel", "release", "requestgroup", "node", "instanceassignment")


def grant(user: Any, *perms: str) -> Any:
    """Give ``user`` the permissions ``perms`` (``"tenants.add_tenant"``, ...); returns the user, reloaded
    (Django caches permissions on the user object)."""
    from django.contrib.auth.models import Permission

    for perm in perms:
        app_label, codename = perm.split(".")
        user.user_permissions.add(Permission.objects.get(content_type__app_label=app_label, codename=codename))
    return type(user).objects.get(pk=user.pk)


def grant_registry_writes(user: Any) -> Any:
    """Make ``user`` a platform admin with add/change/delete on every registry model (not superuser, not staff);
    returns it reloaded."""
    return grant(user, PLATFORM_ADMIN, *(f"tenants.{action}_{model}" for model in REGISTRY_MODELS
                                         for action in ("add", "change", "delete")))


#: The platform admin flag (``tenants.access``): sees every tenant; writes still need the model permissions.
PLATFORM_ADMIN = "tenants.platform_admin"


def grant_role(user: Any, tenant: Tenant, role: str) -> Any:
    """Give ``user`` the ``role`` (viewer, operator, admin) in ``tenant``; returns the user, reloaded."""
    from tenants.models import TenantMembership

    validated_save(TenantMembership(user=user, tenant=tenant, role=role))
    return type(user).objects.get(pk=user.pk)


def refused(obj: Any) -> dict[str, list[str]]:
    """``full_clean()`` must fail; return ``message_dict``."""
    with pytest.raises(ValidationError) as info:
        obj.full_clean()
    return info.value.message_dict


def refused_save(obj: Any) -> dict[str, list[str]]:
    """``validated_save()`` must fail; return ``message_dict``."""
    with pytest.raises(ValidationError) as info:
        validated_save(obj)
    return info.value.message_dict
