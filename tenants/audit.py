"""Change log wired once: a context variable says who acts, signal receivers write ``AuditEntry`` rows.

* HTTP requests: ``tenants.middleware.AuditContextMiddleware`` sets the context (request id from
  ``X-Request-ID`` or a fresh one); the actor is read from ``request.user`` when an entry is written, so
  DRF token authentication (which happens in the view, after middleware) is seen.
* Celery tasks, agents, scripts: ``with audit_context(actor="agent:node-a", request_id=task_id): ...``.
* Without any context the actor is ``system``.

``register(model)`` connects the receivers for a model; ``TenantsConfig.ready`` registers the registry
models, other apps register theirs the same way. Entries are written in the same transaction as the change,
so a rolled-back change leaves no entry. An update that changes nothing but ``updated_at`` writes nothing.
Each entry records the tenant the object belongs to (``AuditEntry.tenant_pk``, ``tenants.access.tenant_pk_of``):
the tenant's members see it.
"""
from __future__ import annotations

import contextvars
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from django.db.models.signals import post_save, pre_delete, pre_save

from tenants.choices import AuditAction

_IGNORED_FIELDS = frozenset({"updated_at"})


@dataclass(frozen=True)
class AuditContext:
    """Who is acting: an HTTP request (actor resolved lazily) or a named actor such as ``agent:node-a``."""

    request_id: str
    actor_repr: str = "system"
    user: Any = None
    request: Any = None

    def resolve_actor(self) -> tuple[Any, str]:
        """Return ``(user or None, actor_repr)`` for the entry being written now."""
        user = self.user
        if user is None and self.request is not None:
            user = getattr(self.request, "user", None)
        if user is not None and getattr(user, "is_authenticated", False):
            return user, user.get_username()
        if self.request is not None:
            return None, "anonymous"
        return None, self.actor_repr


_current: contextvars.ContextVar[AuditContext | None] = contextvars.ContextVar("kvpool_audit_context", default=None)


def new_request_id() -> str:
    """A fresh request id (32 hex characters)."""
    return uuid.uuid4().hex


def current_context() -> AuditContext:
    """The active context, or a ``system`` context with an empty request id."""
    return _current.get() or AuditContext(request_id="")


@contextmanager
def audit_context(
    actor: str = "system", *, request_id: str | None = None, user: Any = None, request: Any = None
) -> Iterator[AuditContext]:
    """Attribute every audited change inside the block to ``actor`` (or ``user``/``request``)."""
    context = AuditContext(request_id=request_id or new_request_id(), actor_repr=actor, user=user, request=request)
    token = _current.set(context)
    try:
        yield context
    finally:
        _current.reset(token)


def _object_type(instance) -> str:
    return f"{instance._meta.app_label}.{instance._meta.model_name}"


def _write(instance, action: str, before: dict | None, after: dict | None) -> None:
    from tenants.access import tenant_pk_of
    from tenants.models import AuditEntry

    context = current_context()
    user, actor_repr = context.resolve_actor()
    AuditEntry.objects.create(
        actor=user,
        actor_repr=actor_repr[:255],
        action=action,
        object_type=_object_type(instance),
        object_id=str(instance.pk),
        object_repr=str(instance)[:255],
        before=before,
        after=after,
        request_id=context.request_id,
        tenant_pk=tenant_pk_of(instance),
    )


def _snapshot_before(sender, instance, raw=False, **kwargs) -> None:
    if raw:
        return
    stored = instance.stored()
    instance._audit_before = stored.audit_snapshot() if stored is not None else None
    instance._audit_before_secrets = stored.audit_secret_values() if stored is not None else {}


def _record_save(sender, instance, created, raw=False, **kwargs) -> None:
    if raw:
        return
    after = instance.audit_snapshot()
    before = None if created else getattr(instance, "_audit_before", None)
    if before is None:
        _write(instance, AuditAction.CREATE, None, after)
        return
    for name, value in instance.audit_secret_values().items():
        if getattr(instance, "_audit_before_secrets", {}).get(name) != value:
            after[name] = "<redacted, changed>"
    changed = [k for k in set(before) | set(after) if k not in _IGNORED_FIELDS and before.get(k) != after.get(k)]
    if changed:
        _write(instance, AuditAction.UPDATE, before, after)


def _record_delete(sender, instance, **kwargs) -> None:
    _write(instance, AuditAction.DELETE, instance.audit_snapshot(), None)


def register(model) -> None:
    """Audit every create, update and delete of ``model`` (a ``RegistryModel`` subclass)."""
    uid = f"kvpool-audit-{model._meta.label_lower}"
    pre_save.connect(_snapshot_before, sender=model, dispatch_uid=f"{uid}-pre-save")
    post_save.connect(_record_save, sender=model, dispatch_uid=f"{uid}-post-save")
    pre_delete.connect(_record_delete, sender=model, dispatch_uid=f"{uid}-pre-delete")
