"""Registry changes → config push and master quota sync, after the transaction commits.

Receivers work out which nodes a change affects (assignments reach a node through release → served model → tenant) and
register them with ``transaction.on_commit``: nothing is sent for a rolled-back change, and the agents never see a state
the database did not commit. Names collected during one transaction are sent as ``dashboard.push_nodes`` tasks of up to
``PUSH_CHUNK`` nodes each (every receiver schedules the same flush; the first flush after the commit takes all names,
later ones find nothing). Publishing failures are logged, never raised into the request: the periodic
``dashboard.reconcile_configs`` sends whatever was missed.

Tenants: a saved tenant schedules ``dashboard.sync_master_quotas`` for its ``tenant_id`` (and the old one when
it was renamed). A deleted tenant is removed from the master **before** the row goes, synchronously, so that a
master refusal — 409 ``TENANT_NOT_EMPTY``, the tenant still owns objects — refuses the delete with
``TenantStillOwnsObjects`` (HTTP 409 in the REST API) instead of leaving the master and the registry apart.
An unreachable master does not block the delete: the tenant is marked ``pending_delete`` and retried.

Releases: a deleted release's namespace is reserved by the registry (``tenants.models.ReservedNamespace``); after
the commit the tenant's agents are asked to purge its keys (``dashboard.rollout.purge.request_reserved_purge``).

Implicit budgets (``dashboard.master.room``: a live release without a budget shares what its tenant's budgets leave
under the master's eviction point) follow every tenant's quota and every budget of the tenant: a saved tenant also
re-renders every node with implicit budgets, a saved or deleted release every node of its tenant; a change of the
mounted capacity is seen by the master probe (``dashboard.tasks.probe_master``), which re-renders those nodes too.

Senders are given as lazy ``"app_label.Model"`` strings, so this module imports no registry model at load.
"""
from __future__ import annotations

import logging
import threading

from django.conf import settings
from django.db import transaction
from django.db.models.signals import post_delete, post_save, pre_delete, pre_save
from django.dispatch import receiver
from rest_framework import status
from rest_framework.exceptions import APIException

log = logging.getLogger("kvpool.dashboard.signals")

_pending = threading.local()

#: Nodes per ``dashboard.push_nodes`` task: a change that affects many nodes fans out over several workers, and
#: each task renders, versions, signs and publishes its nodes in batches (``dashboard.rollout.push``), so what
#: a push costs per task (its registry queries, the pool's room) is paid once per this many nodes. Larger tasks
#: cost less CPU where many nodes write one release (the budget shares read every writer node's occupancy per
#: task; pushing ``bench.push``'s 1,000-node registry in process: 0.44 against 0.53 ms per document with tasks of
#: 1,000), but the first documents then leave only when the whole fleet is rendered: ``bench.fleet --quick
#: --phases push`` (ten instances a node) took p99 20.2 s against 14.9 s, its agents starting later.
PUSH_CHUNK = 200


class TenantStillOwnsObjects(APIException):
    """The master refused to delete a tenant that still owns objects (409 ``TENANT_NOT_EMPTY``)."""

    status_code = status.HTTP_409_CONFLICT
    default_code = "tenant_not_empty"
    default_detail = "The Mooncake master refused to delete the tenant: it still owns objects in the Store."


def _names() -> set[str]:
    if not hasattr(_pending, "nodes"):
        _pending.nodes = set()
        _pending.tenants = set()
    return _pending.nodes


def _tenants() -> set[str]:
    _names()
    return _pending.tenants


def discard_pending() -> None:
    """Forget names collected but not yet flushed in this thread.

    A rolled-back transaction leaves its names behind (Django drops its ``on_commit`` callbacks); the next commit
    then also pushes those nodes, which is harmless (an unchanged document is not versioned again). Tests whose
    transactions never commit call this to start clean.
    """
    _pending.nodes, _pending.tenants = set(), set()


def _flush() -> None:
    nodes, tenants = sorted(_names()), sorted(_tenants())
    _pending.nodes, _pending.tenants = set(), set()
    from dashboard import tasks

    for start in range(0, len(nodes), PUSH_CHUNK):
        chunk = nodes[start:start + PUSH_CHUNK]
        try:
            tasks.push_nodes.apply_async(args=[chunk], retry=True, retry_policy={"max_retries": 1})
        except Exception as exc:  # broker down: the periodic reconcile pushes later
            log.error("could not queue config push for nodes %s: %s", chunk, exc)
    if tenants and settings.KVPOOL_MASTER_SYNC:
        try:
            tasks.sync_master_quotas.apply_async(args=[tenants], retry=True, retry_policy={"max_retries": 1})
        except Exception as exc:
            log.error("could not queue master quota sync for tenants %s: %s", tenants, exc)


def schedule_push(names) -> None:
    """Push the config of the named nodes once the current transaction commits (now, in autocommit)."""
    names = {name for name in names if name}
    if names:
        _names().update(names)
        transaction.on_commit(_flush, robust=True)


def schedule_quota_sync(tenant_ids) -> None:
    """Sync these tenants' quotas to the master once the current transaction commits."""
    tenant_ids = {tid for tid in tenant_ids if tid}
    if tenant_ids:
        _tenants().update(tenant_ids)
        transaction.on_commit(_flush, robust=True)


def _node_names(**lookup) -> set[str]:
    from tenants.models import Node

    return set(Node.objects.filter(**lookup).values_list("name", flat=True).distinct())


def implicit_budget_nodes() -> set[str]:
    """Nodes running an instance of a live release without a budget: their documents carry implicit budgets, which
    follow every tenant's quota and the mounted capacity (``dashboard.master.room``)."""
    from tenants.choices import ReleaseState
    from tenants.models import InstanceAssignment

    live = (InstanceAssignment.objects.filter(release__budget_bytes__isnull=True)
            .exclude(release__state=ReleaseState.RETIRED))
    return _node_names(assignments__in=live)


@receiver(post_save, sender="tenants.Tenant", dispatch_uid="kvpool-push-tenant-save")
def tenant_saved(sender, instance, created, **kwargs):
    """Quota or tenant_id changed: re-render the tenant's nodes, and every node with implicit budgets (a quota
    change moves other tenants' effective quotas and watermark shares when the pool is overcommitted); sync the
    master."""
    schedule_push(_node_names(assignments__release__model__tenant=instance) | implicit_budget_nodes())
    schedule_quota_sync({instance.tenant_id, getattr(instance, "_kvpool_old_tenant_id", "")})


@receiver(pre_save, sender="tenants.Tenant", dispatch_uid="kvpool-tenant-old-id")
def tenant_saving(sender, instance, **kwargs):
    """Remember the stored ``tenant_id`` so a rename removes the old name from the master."""
    if instance.pk is not None:
        old = sender._base_manager.filter(pk=instance.pk).values_list("tenant_id", flat=True).first()
        if old and old != instance.tenant_id:
            instance._kvpool_old_tenant_id = old


@receiver(pre_delete, sender="tenants.Tenant", dispatch_uid="kvpool-tenant-delete-master")
def tenant_deleting(sender, instance, **kwargs):
    """Remove the tenant from the master first; refuse the delete if the master says it still owns objects."""
    if not settings.KVPOOL_MASTER_SYNC:
        return
    from dashboard.master.quota_sync import TenantNotEmpty, delete_tenant

    try:
        delete_tenant(instance.tenant_id)
    except TenantNotEmpty as exc:
        log.error("refusing to delete tenant %s: %s", instance.tenant_id, exc)
        raise TenantStillOwnsObjects(str(exc)) from None


@receiver(post_delete, sender="tenants.Tenant", dispatch_uid="kvpool-tenant-deleted")
def tenant_deleted(sender, instance, **kwargs):
    """Rewrite the master's policy file without the tenant."""
    schedule_quota_sync({instance.tenant_id})


@receiver(post_save, sender="tenants.ServedModel", dispatch_uid="kvpool-push-model-save")
def served_model_saved(sender, instance, **kwargs):
    schedule_push(_node_names(assignments__release__model=instance))


@receiver(post_save, sender="tenants.Release", dispatch_uid="kvpool-push-release-save")
def release_saved(sender, instance, **kwargs):
    """Re-render every node of the tenant: a release's budget or state moves the implicit budgets of the tenant's
    releases without one (``dashboard.master.room``)."""
    schedule_push(_node_names(assignments__release__model__tenant_id=instance.model.tenant_id))


@receiver(pre_delete, sender="tenants.Release", dispatch_uid="kvpool-push-release-delete")
def release_deleting(sender, instance, **kwargs):
    """A deleted release frees its budget (or its implicit share) for the tenant's other releases."""
    schedule_push(_node_names(assignments__release__model__tenant_id=instance.model.tenant_id))


@receiver(post_delete, sender="tenants.Release", dispatch_uid="kvpool-purge-deleted-release")
def release_deleted(sender, instance, **kwargs):
    """A confirmed delete reserved the release's namespace (``tenants.models.ReservedNamespace``, written by the
    registry's ``pre_delete`` receiver); once the delete commits, ask the tenant's agents to purge its keys."""
    from tenants.models import ReservedNamespace

    # The namespace it had when deleted, and any it left earlier (a rename) that no purge covered yet.
    reservations = list(ReservedNamespace.objects.filter(release_pk=instance.pk, purge_id=""))
    if not reservations:
        return

    from tenants.audit import audit_context, current_context

    deleter = current_context()  # the purge request is audited under whoever confirmed the delete

    def purge() -> None:
        from dashboard.rollout.purge import request_reserved_purge

        with audit_context(deleter.actor_repr, request_id=deleter.request_id or None, user=deleter.user,
                           request=deleter.request):
            for reservation in reservations:
                try:
                    request_reserved_purge(reservation)
                except Exception as exc:  # never into the request: the namespace stays reserved, keys get evicted
                    log.error("could not request the purge of deleted release namespace %s: %s", reservation, exc)

    transaction.on_commit(purge, robust=True)


@receiver(post_save, sender="tenants.RequestGroup", dispatch_uid="kvpool-push-group-save")
@receiver(pre_delete, sender="tenants.RequestGroup", dispatch_uid="kvpool-push-group-delete")
def request_group_changed(sender, instance, **kwargs):
    schedule_push(_node_names(assignments__release__model__tenant_id=instance.tenant_id))


@receiver(pre_save, sender="tenants.InstanceAssignment", dispatch_uid="kvpool-assignment-old-node")
def assignment_saving(sender, instance, **kwargs):
    """Remember the node an assignment moves away from (that node must drop it)."""
    if instance.pk is not None:
        old = sender._base_manager.filter(pk=instance.pk).values_list("node_id", "release_id").first()
        instance._kvpool_old_node_id, instance._kvpool_old_release_id = old or (None, None)


@receiver(post_save, sender="tenants.InstanceAssignment", dispatch_uid="kvpool-push-assignment-save")
def assignment_saved(sender, instance, **kwargs):
    """Re-render the assignment's node (and the one it left) and every node of its release (old and new): each
    node's share of the release's budget depends on the release's writer instances on all nodes."""
    from tenants.models import Node

    ids = {instance.node_id, getattr(instance, "_kvpool_old_node_id", None)} - {None}
    releases = {instance.release_id, getattr(instance, "_kvpool_old_release_id", None)} - {None}
    schedule_push(set(Node.objects.filter(pk__in=ids).values_list("name", flat=True))
                  | _node_names(assignments__release_id__in=releases))


@receiver(pre_delete, sender="tenants.InstanceAssignment", dispatch_uid="kvpool-push-assignment-delete")
def assignment_deleting(sender, instance, **kwargs):
    """Re-render the assignment's node and every node of its release (their budget shares grow)."""
    schedule_push(_node_names(assignments__release_id=instance.release_id) | _node_names(pk=instance.node_id))


@receiver(post_save, sender="tenants.Node", dispatch_uid="kvpool-push-node-save")
def node_saved(sender, instance, created, **kwargs):
    """A new node gets its first document (no instances yet); other node edits re-render (usually unchanged)."""
    schedule_push({instance.name})


@receiver(post_delete, sender="tenants.Node", dispatch_uid="kvpool-node-deleted-state")
def node_deleted(sender, instance, **kwargs):
    """Forget the deleted node's telemetry ``NodeState`` (push/ack/heartbeat bookkeeping) and the newest facts of its
    engine instances (``InstanceStats``).

    Without it ``/metrics`` would keep exporting ``kvpool_node_silent``/``behind`` (and ``kvpool_engine_*``) for the
    node and the overview would list it as "not registered — silent" for ever. History rows (acks, reports,
    occupancy samples, refused messages, config versions) stay: they roll up and expire on their own schedule.
    """
    from dashboard.models import InstanceStats, NodeState

    InstanceStats.objects.filter(node_name=instance.name).delete()
    deleted, _ = NodeState.objects.filter(node_name=instance.name).delete()
    if deleted:
        log.info("node %s deleted from the registry: its telemetry state is forgotten", instance.name)
