"""Client of the Mooncake master's tenant quota admin API (mooncake_master 0.3.13.post1, metrics port), and
the registry → master quota synchronisation built on it (``sync_quotas``, ``delete_tenant``,
``sample_quotas``, ``write_policy_file``).

Endpoints (checked against the released binary):
  ``GET    /api/v1/tenant_quotas``                 → ``{"success": true, "data": [snapshot, ...]}``
  ``GET    /api/v1/tenant_quotas?tenant_id=T``     → ``{"success": true, "data": snapshot}``; 404 ``-704``
  ``PUT    /api/v1/tenant_quotas?tenant_id=T``     body ``{"requested_quota_bytes": N}`` → snapshot;
                                                   400 ``-600`` for N outside [1, 2^63-1] or a bad body
  ``DELETE /api/v1/tenant_quotas?tenant_id=T``     → ``data: null``; 404 ``-704`` unknown tenant;
                                                   **409 ``-1702`` TENANT_NOT_EMPTY** while the tenant owns objects
Errors come as ``{"success": false, "error_code": C, "error_message": M}``; in HA mode a standby answers every
call with HTTP 503 ``-1011`` (``MasterUnavailable`` here: only the leader takes quota calls). A snapshot has
``tenant_id``, ``requested_quota_bytes``, ``effective_quota_bytes`` (scaled to mounted capacity, 0 while
nothing is mounted), ``charged_bytes``, ``admission_closed``, ``over_quota``, ``has_explicit_policy``.
"""
from __future__ import annotations

import json
import logging
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("kvpool.dashboard.master")

TENANT_NOT_EMPTY = -1702
#: A standby's answer to the admin API in HA mode (HTTP 503, "service plane is not active").
SERVICE_NOT_ACTIVE = -1011
UNKNOWN_TENANT = -704
INVALID_ARGUMENT = -600


class MasterAdminError(Exception):
    """The master refused a request or could not be reached.

    ``status`` is the HTTP status (0 when there was no answer), ``code`` the master's ``error_code``.
    """

    def __init__(self, message: str, *, status: int = 0, code: int | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code


class MasterUnavailable(MasterAdminError):
    """No HTTP answer (connection refused, timeout, not JSON)."""


class TenantNotEmpty(MasterAdminError):
    """409 ``TENANT_NOT_EMPTY``: the master keeps a tenant that still owns objects in the Store."""


@dataclass(frozen=True)
class QuotaSnapshot:
    """One tenant's quota state on the master; sizes in bytes."""

    tenant_id: str
    requested_quota_bytes: int
    effective_quota_bytes: int
    charged_bytes: int
    admission_closed: bool
    over_quota: bool
    has_explicit_policy: bool

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> QuotaSnapshot:
        """Build from the master's JSON object; raises ``MasterAdminError`` when a field is missing."""
        try:
            return cls(
                tenant_id=str(data["tenant_id"]),
                requested_quota_bytes=int(data["requested_quota_bytes"]),
                effective_quota_bytes=int(data["effective_quota_bytes"]),
                charged_bytes=int(data["charged_bytes"]),
                admission_closed=bool(data["admission_closed"]),
                over_quota=bool(data["over_quota"]),
                has_explicit_policy=bool(data.get("has_explicit_policy", False)),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise MasterAdminError(f"unexpected quota snapshot from the master: {data!r} ({exc})") from None


class MasterAdminClient:
    """Blocking client for one master; ``base_url`` like ``http://127.0.0.1:9003``, ``timeout`` in seconds."""

    def __init__(self, base_url: str, *, timeout: float = 3.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout

    def _url(self, tenant_id: str | None) -> str:
        url = f"{self.base_url}/api/v1/tenant_quotas"
        if tenant_id is not None:
            url += "?" + urllib.parse.urlencode({"tenant_id": tenant_id})
        return url

    def _call(self, method: str, tenant_id: str | None, body: dict[str, Any] | None = None) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(self._url(tenant_id), data=data, method=method,
                                         headers={"Content-Type": "application/json"} if data else {})
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                status, raw = response.status, response.read()
        except urllib.error.HTTPError as exc:
            status, raw = exc.code, exc.read()
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise MasterUnavailable(f"master admin API at {self.base_url} unreachable: {reason}") from None
        try:
            payload = json.loads(raw or b"{}")
        except ValueError:
            raise MasterUnavailable(f"master admin API answered HTTP {status} with non-JSON: {raw[:200]!r}",
                                    status=status) from None
        if status == 200 and payload.get("success"):
            return payload.get("data")
        code = payload.get("error_code")
        message = payload.get("error_message") or f"HTTP {status}"
        where = f"tenant {tenant_id!r}" if tenant_id is not None else "tenant quotas"
        if code == SERVICE_NOT_ACTIVE:
            raise MasterUnavailable(f"master admin API at {self.base_url} is a standby's, not the leader's: "
                                    f"{message} ({code})", status=status, code=code)
        if status == 409 or code == TENANT_NOT_EMPTY:
            raise TenantNotEmpty(
                f"the master refused to delete {where}: {message} ({code}) — the tenant still owns objects in "
                "the Store; remove or let them expire, then retry", status=status, code=code)
        raise MasterAdminError(f"master refused {method} for {where}: HTTP {status} {message} ({code})",
                               status=status, code=code)

    def list_quotas(self) -> list[QuotaSnapshot]:
        """Every tenant the master knows, with its quota state."""
        return [QuotaSnapshot.from_json(item) for item in (self._call("GET", None) or [])]

    def get_quota(self, tenant_id: str) -> QuotaSnapshot | None:
        """One tenant's state, or ``None`` when the master does not know it (404 ``-704``)."""
        try:
            return QuotaSnapshot.from_json(self._call("GET", tenant_id))
        except MasterAdminError as exc:
            if exc.code == UNKNOWN_TENANT:
                return None
            raise

    def put_quota(self, tenant_id: str, quota_bytes: int) -> QuotaSnapshot:
        """Set ``requested_quota_bytes``; the master persists its policy file itself. 400/-600 → error."""
        return QuotaSnapshot.from_json(self._call("PUT", tenant_id, {"requested_quota_bytes": int(quota_bytes)}))

    def delete_quota(self, tenant_id: str) -> bool:
        """Remove a tenant's policy; ``False`` when the master did not know it.

        Raises ``TenantNotEmpty`` (409) when the tenant still owns objects, ``MasterUnavailable`` when the
        master cannot be reached.
        """
        try:
            self._call("DELETE", tenant_id)
        except MasterAdminError as exc:
            if exc.code == UNKNOWN_TENANT:
                return False
            raise
        return True


# --- registry ↔ master synchronisation (Django side) -----------------------------------------------------


def client_from_settings() -> MasterAdminClient:
    """Client for the master's admin API with ``KVPOOL_MASTER_ADMIN_TIMEOUT_SECONDS``: ``KVPOOL_MASTER_ADMIN_URL``,
    or in HA mode the current leader's (``dashboard.master.leader.leader_admin_url``; only it answers).

    Raises:
        MasterUnavailable: HA mode and no master serves as leader now.
    """
    from django.conf import settings

    from dashboard.master.leader import NoLeader, leader_admin_url

    try:
        url = leader_admin_url()
    except NoLeader as exc:
        raise MasterUnavailable(str(exc)) from None
    return MasterAdminClient(url, timeout=settings.KVPOOL_MASTER_ADMIN_TIMEOUT_SECONDS)


def _record_error(tenant_id: str, exc: MasterAdminError, **fields: Any) -> None:
    from django.utils import timezone

    from dashboard.models import MasterQuotaSync

    MasterQuotaSync.objects.update_or_create(
        tenant_id=tenant_id,
        defaults={"last_error": str(exc)[:2000], "last_error_code": exc.code if exc.code is not None else exc.status,
                  "last_error_at": timezone.now(), **fields},
    )


def delete_tenant(tenant_id: str, client: MasterAdminClient | None = None) -> bool:
    """Remove ``tenant_id``'s quota policy from the master; returns whether the master is now without it.

    Raises ``TenantNotEmpty`` (after recording it in ``MasterQuotaSync.last_error``) when the master refuses
    because the tenant still owns objects. An unreachable master marks the tenant ``pending_delete`` (retried
    by ``sync_quotas``) and returns ``False``.
    """
    from dashboard.models import MasterQuotaSync

    client = client or client_from_settings()
    try:
        client.delete_quota(tenant_id)
    except TenantNotEmpty as exc:
        _record_error(tenant_id, exc)
        raise
    except MasterAdminError as exc:
        log.warning("master quota delete of tenant %s deferred: %s", tenant_id, exc)
        _record_error(tenant_id, exc, pending_delete=True, desired_quota_bytes=None)
        return False
    MasterQuotaSync.objects.filter(tenant_id=tenant_id).delete()
    log.info("master: removed tenant %s", tenant_id)
    return True


def write_policy_file(path: str | None = None) -> str:
    """Render ``tenant_quotas.yaml`` from the registry (``tenants.rendering``) and write it atomically.

    The file is what the master loads at its next restart (``--tenant_quota_connector_uri``). Returns the path.
    """
    import os
    import tempfile

    from django.conf import settings

    from tenants.models import Tenant
    from tenants.rendering import render_tenant_quotas_yaml

    path = path or settings.KVPOOL_TENANT_QUOTAS_PATH
    text = render_tenant_quotas_yaml(Tenant.objects.all())
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tenant_quotas.", dir=directory)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(text)
    os.replace(tmp, path)
    return path


def sync_quotas(tenant_ids: list[str] | None = None, client: MasterAdminClient | None = None) -> dict[str, int]:
    """Make the master's quotas equal the registry's, then rewrite the policy file.

    ``tenant_ids`` limits the work to those tenants (``None`` = all). For each registry tenant whose
    ``requested_quota_bytes`` on the master differs (or is missing): ``PUT``. Tenants marked
    ``pending_delete``, and tenants this dashboard synced before that are no longer in the registry: ``DELETE``
    (a 409 stays recorded in ``MasterQuotaSync.last_error`` and is logged as an error). Tenants the master
    has that this dashboard never synced are left alone. Returns counts; raises ``MasterUnavailable`` when the
    master cannot be listed (the policy file is written first regardless).
    """
    from django.utils import timezone

    from dashboard.models import MasterQuotaSync
    from tenants.models import Tenant

    counts = {"put": 0, "deleted": 0, "unchanged": 0, "errors": 0}
    write_policy_file()
    client = client or client_from_settings()
    wanted = dict(Tenant.objects.values_list("tenant_id", "quota_bytes"))
    on_master = {snapshot.tenant_id: snapshot for snapshot in client.list_quotas()}
    known = set(MasterQuotaSync.objects.values_list("tenant_id", flat=True))
    scope = set(tenant_ids) if tenant_ids is not None else set(wanted) | known
    for tenant_id in sorted(scope):
        if tenant_id in wanted:
            quota = wanted[tenant_id]
            current = on_master.get(tenant_id)
            if current is not None and current.requested_quota_bytes == quota and current.has_explicit_policy:
                counts["unchanged"] += 1
                MasterQuotaSync.objects.update_or_create(tenant_id=tenant_id, defaults={
                    "desired_quota_bytes": quota, "synced_quota_bytes": quota, "pending_delete": False})
                continue
            try:
                client.put_quota(tenant_id, quota)
            except MasterAdminError as exc:
                counts["errors"] += 1
                log.error("master: setting quota of tenant %s to %d bytes failed: %s", tenant_id, quota, exc)
                _record_error(tenant_id, exc, desired_quota_bytes=quota, pending_delete=False)
                continue
            counts["put"] += 1
            MasterQuotaSync.objects.update_or_create(tenant_id=tenant_id, defaults={
                "desired_quota_bytes": quota, "synced_quota_bytes": quota, "synced_at": timezone.now(),
                "pending_delete": False, "last_error": "", "last_error_code": None, "last_error_at": None})
            log.info("master: tenant %s quota set to %d bytes", tenant_id, quota)
        elif tenant_id in known:
            try:
                counts["deleted"] += int(delete_tenant(tenant_id, client))
            except TenantNotEmpty as exc:
                counts["errors"] += 1
                log.error("master: %s", exc)
    return counts


def sample_quotas(client: MasterAdminClient | None = None) -> int:
    """Read every tenant's quota state from the master and store one ``MasterQuotaSample`` each."""
    from django.utils import timezone

    from dashboard.models import MasterQuotaSample

    client = client or client_from_settings()
    now = timezone.now()
    snapshots = client.list_quotas()
    MasterQuotaSample.objects.bulk_create([
        MasterQuotaSample(ts=now, tenant_id=s.tenant_id, requested_quota_bytes=s.requested_quota_bytes,
                          effective_quota_bytes=s.effective_quota_bytes, charged_bytes=s.charged_bytes,
                          admission_closed=s.admission_closed, over_quota=s.over_quota,
                          has_explicit_policy=s.has_explicit_policy)
        for s in snapshots
    ])
    return len(snapshots)
