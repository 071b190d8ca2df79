"""Placement rules between the tenants of a node: devices, instance caps and the node's model roots.

A node runs instances of several tenants, and every instance of a node is part of the one config document each of
them receives. So an instance (``InstanceAssignment``):

* **devices** — holds the GPUs of its ``gpu_ids`` (``CUDA_VISIBLE_DEVICES``); on a ``cuda`` node a blank
  ``gpu_ids`` holds every GPU (the engine then sees them all). No two instances of a node may hold a common GPU,
  whoever's they are, except instances of one served model (the releases of a rolling upgrade, whose copies take
  the old instances' layout; the old release's instances are removed when it retires). ``cpu`` nodes hold none.
* **caps** — a node runs at most ``KVPOOL_MAX_INSTANCES_PER_NODE`` instances, one tenant at most
  ``KVPOOL_MAX_INSTANCES_PER_TENANT_PER_NODE`` of them, and at most ``KVPOOL_MAX_INSTANCES_PER_TENANT`` in all
  (settings; defaults in ``dashboard/settings.py``).
  Checked when an instance is created or moved (to another node or release); instances saved before a cap was
  lowered stay.
* **paths** — loads an absolute ``model_path`` or adapter path only from under one of the node's ``model_roots``
  (``path == root`` or ``path`` starts with ``root + "/"``; both are in normal form, see
  ``tenants.validators.validate_absolute_directory``). Hub ids are downloaded by the engine and need no root.
  Checked when an instance is created or moved, when a model's path or a release's adapters change, and when a
  node's roots change.

Refusals say "not available" and name nothing of another tenant (its instances, releases, GPUs it holds).
``tenants.services.validated_save`` locks the nodes a write places instances on, so two concurrent writes cannot
both pass these checks.
"""
from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from django.conf import settings
from django.core.exceptions import ValidationError

from tenants.choices import NodeDevice
from tenants.validators import lora_adapters, validate_gpu_ids

if TYPE_CHECKING:
    from tenants.models import InstanceAssignment, Node, Release, ServedModel

def held_devices(node: Node, gpu_ids: str) -> frozenset[int] | None:
    """The GPUs an instance with ``gpu_ids`` holds on ``node``: ``None`` for every GPU (a blank list on a ``cuda``
    node), an empty set on a ``cpu`` node."""
    if node.device == NodeDevice.CPU:
        return frozenset()
    if not gpu_ids:
        return None
    return frozenset(int(part) for part in gpu_ids.split(","))


def _overlap(mine: frozenset[int] | None, theirs: frozenset[int] | None) -> bool:
    if mine is None:
        return theirs is None or bool(theirs)
    return bool(mine) and (theirs is None or bool(mine & theirs))


def device_refusal(assignment: InstanceAssignment) -> str | None:
    """Why ``assignment``'s ``gpu_ids`` are not available on its node, or ``None``.

    ``gpu_ids`` must already be valid (``validate_gpu_ids``). The message names the caller's own GPU ids only.
    """
    from tenants.models import InstanceAssignment

    try:
        validate_gpu_ids(assignment.gpu_ids)
    except ValidationError:
        return None  # reported by the field's rule
    node = assignment.node
    mine = held_devices(node, assignment.gpu_ids)
    if mine is not None and not mine:
        return None
    others = (InstanceAssignment._base_manager.filter(node_id=node.pk).exclude(pk=assignment.pk)
              .exclude(release__model_id=assignment.release.model_id).values_list("gpu_ids", flat=True))
    taken: set[int] = set()
    for gpu_ids in others:
        theirs = held_devices(node, gpu_ids)
        if not _overlap(mine, theirs):
            continue
        if mine is None:
            return (f"gpu_ids is blank, which gives the instance every GPU of node '{node}', and some of them are "
                    "not available: list the GPUs the instance may use.")
        taken |= mine if theirs is None else mine & theirs
    if not taken:
        return None
    listed = ", ".join(str(gpu) for gpu in sorted(taken))
    return f"GPU {listed} {'is' if len(taken) == 1 else 'are'} not available on node '{node}': choose other GPUs."


def cap_refusal(assignment: InstanceAssignment) -> str | None:
    """Why ``assignment`` may not be added to its node (it is new there, or moves there or to another tenant)
    under the instance caps, or ``None``. Counts exclude ``assignment`` itself."""
    from tenants.models import InstanceAssignment

    node = assignment.node
    tenant = assignment.release.model.tenant
    others = InstanceAssignment._base_manager.exclude(pk=assignment.pk)
    per_node = settings.KVPOOL_MAX_INSTANCES_PER_NODE
    if others.filter(node_id=node.pk).count() >= per_node:
        return (f"Node '{node}' is not available: it runs the most instances a node may "
                f"(KVPOOL_MAX_INSTANCES_PER_NODE = {per_node}). Choose another node.")
    per_tenant_node = settings.KVPOOL_MAX_INSTANCES_PER_TENANT_PER_NODE
    mine = others.filter(release__model__tenant_id=tenant.pk)
    if mine.filter(node_id=node.pk).count() >= per_tenant_node:
        return (f"Tenant '{tenant}' already runs {per_tenant_node} instances on node '{node}', the most one tenant "
                "may run on a node (KVPOOL_MAX_INSTANCES_PER_TENANT_PER_NODE). Choose another node.")
    per_tenant = settings.KVPOOL_MAX_INSTANCES_PER_TENANT
    if mine.count() >= per_tenant:
        return (f"Tenant '{tenant}' already runs {per_tenant} instances, the most one tenant may run "
                "(KVPOOL_MAX_INSTANCES_PER_TENANT). Remove one first.")
    return None


def under_roots(path: str, roots: Iterable[str]) -> bool:
    """True when ``path`` (absolute, normal form) is one of ``roots`` or lies below one of them."""
    return any(path == root or path.startswith(root.rstrip("/") + "/") for root in roots)


def local_paths(model: ServedModel, release: Release | None = None) -> list[tuple[str, str]]:
    """``(what, path)`` of every absolute path an instance of ``model`` (and of ``release``, when given) loads:
    the model path and the paths of the release's adapters (those the launch renders)."""
    paths = [("model_path", model.model_path)] if model.model_path.startswith("/") else []
    if release is not None:
        try:
            adapters = lora_adapters(release.adapters)
        except TypeError:
            adapters = []  # reported by the adapters rule
        paths += [(f"adapter '{adapter.name}' path", adapter.path) for adapter in adapters
                  if isinstance(adapter.path, str) and adapter.path.startswith("/")]
    return paths


def path_refusal(node: Node, model: ServedModel, release: Release | None = None) -> str | None:
    """Why an instance of ``model`` / ``release`` cannot load its files on ``node`` (a path outside the node's
    ``model_roots``), or ``None``."""
    roots = node.model_roots if isinstance(node.model_roots, list) else []
    for what, path in local_paths(model, release):
        if not under_roots(path, roots):
            declared = ", ".join(f"'{root}'" for root in roots) or "none: it loads hub ids only"
            return (f"{what} '{path}' is not under a model root of node '{node}' (its model_roots: {declared}). "
                    "Use a path under one of them or a hub id, or ask a platform admin to add the root.")
    return None


def check_assignment(assignment: InstanceAssignment, moved: bool) -> dict[str, str]:
    """Errors by field for ``assignment`` (node and release set, fields valid): devices always, caps and paths when
    ``moved`` (new, or its node or release changed)."""
    errors: dict[str, str] = {}
    refusal = device_refusal(assignment)
    if refusal is not None:
        errors["gpu_ids"] = refusal
    if moved:
        refusal = cap_refusal(assignment) or path_refusal(assignment.node, assignment.release.model,
                                                          assignment.release)
        if refusal is not None:
            errors["node"] = refusal
    return errors


def check_model_paths(model: ServedModel) -> str | None:
    """Why ``model``'s (changed) path cannot be loaded on a node that runs one of its releases, or ``None``."""
    from tenants.models import Node

    if model.pk is None or not model.model_path.startswith("/"):
        return None
    for node in Node.objects.filter(assignments__release__model_id=model.pk).distinct():
        refusal = path_refusal(node, model)
        if refusal is not None:
            return refusal
    return None


def check_release_paths(release: Release) -> str | None:
    """Why ``release``'s (changed) adapters cannot be loaded on a node that runs one of its instances, or
    ``None``."""
    from tenants.models import Node

    if release.pk is None:
        return None
    for node in Node.objects.filter(assignments__release_id=release.pk).distinct():
        refusal = path_refusal(node, release.model, release)
        if refusal is not None:
            return refusal
    return None


def check_node_roots(node: Node) -> str | None:
    """Why ``node``'s (changed) ``model_roots`` leave out a path one of its instances loads, or ``None``. Node
    writes are platform-admin only, so the message names the instance."""
    from tenants.models import InstanceAssignment

    if node.pk is None:
        return None
    for assignment in InstanceAssignment._base_manager.filter(node_id=node.pk).select_related("release__model"):
        refusal = path_refusal(node, assignment.release.model, assignment.release)
        if refusal is not None:
            return f"Instance '{assignment}' on this node: {refusal}"
    return None


def placement_node_pks(obj) -> list[int]:
    """Primary keys of the nodes whose placement rules a write of ``obj`` checks (to lock, in ``validated_save``):
    a node itself; an instance's node (and the node it moves from); the nodes running a release's or a model's
    instances. Sorted, so concurrent writes lock in one order."""
    from tenants.models import InstanceAssignment, Node, Release, ServedModel

    pks: set[int] = set()
    if isinstance(obj, Node) and obj.pk is not None:
        pks.add(obj.pk)
    elif isinstance(obj, InstanceAssignment):
        if obj.node_id is not None:
            pks.add(obj.node_id)
        if obj.pk is not None:
            pks.update(InstanceAssignment._base_manager.filter(pk=obj.pk).values_list("node_id", flat=True))
    elif isinstance(obj, Release) and obj.pk is not None:
        pks.update(InstanceAssignment._base_manager.filter(release_id=obj.pk).values_list("node_id", flat=True))
    elif isinstance(obj, ServedModel) and obj.pk is not None:
        pks.update(InstanceAssignment._base_manager.filter(release__model_id=obj.pk)
                   .values_list("node_id", flat=True))
    return sorted(pks)


def lock_nodes(node_pks: list[int]) -> None:
    """Lock the node rows until the end of the current transaction (``SELECT ... FOR UPDATE``, in primary key
    order; SQLite serialises writers anyway)."""
    from tenants.models import Node

    if node_pks:
        list(Node.objects.select_for_update().filter(pk__in=node_pks).order_by("pk").values_list("pk", flat=True))
