"""The audit log: one row per create, update or delete of a registry object."""
from __future__ import annotations

from django.conf import settings
from django.db import models

from tenants.choices import AuditAction


class AuditEntry(models.Model):
    """Who changed what, when, with the object's state before and after (JSON, secrets redacted).

    ``actor`` is the authenticated user (``None`` for agents, Celery tasks and scripts); ``actor_repr`` is
    always filled (``username``, ``agent:node-a``, ``system``). ``object_type`` is ``app_label.model``;
    ``request_id`` ties together the entries of one HTTP request or task. ``tenant_pk`` is the primary key of the
    tenant the entry is about (``None``: about no tenant, e.g. a node, or not known); members of that tenant see
    the entry (``tenants.access``), platform admins see every entry. Written by ``tenants.audit``.
    """

    timestamp = models.DateTimeField(auto_now_add=True, db_index=True)
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    actor_repr = models.CharField(max_length=255)
    action = models.CharField(max_length=16, choices=AuditAction.choices)
    object_type = models.CharField(max_length=100, db_index=True)
    object_id = models.CharField(max_length=64, db_index=True)
    object_repr = models.CharField(max_length=255)
    before = models.JSONField(null=True, blank=True)
    after = models.JSONField(null=True, blank=True)
    request_id = models.CharField(max_length=64, blank=True, db_index=True)
    tenant_pk = models.PositiveBigIntegerField(
        null=True, blank=True, db_index=True,
        help_text="Primary key of the tenant the entry is about (a plain number: the tenant may be deleted since).")

    class Meta:
        ordering = ["-timestamp", "-id"]
        verbose_name_plural = "audit entries"

    def __str__(self) -> str:
        when = f"{self.timestamp:%Y-%m-%d %H:%M:%S}"
        return f"{when} {self.actor_repr} {self.action} {self.object_type} {self.object_repr}"

    def changed_fields(self) -> list[str]:
        """Names of the fields whose value differs between ``before`` and ``after``."""
        before, after = self.before or {}, self.after or {}
        return sorted(name for name in set(before) | set(after) if before.get(name) != after.get(name))
