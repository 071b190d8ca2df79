"""Is the Mooncake master up, did it restart, did another master take over? (mooncake_master 0.3.13.post1,
Prometheus ``/metrics`` and, in HA mode, each master's ``/health``.)

One master without HA: a restarted master starts empty (every object gone, every client segment remounted)
and exports no process start time. ``probe_master`` reads its ``/metrics`` on the metrics port (the admin API's
port, ``KVPOOL_MASTER_ADMIN_URL``) every ``KVPOOL_MASTER_PROBE_SECONDS`` and keeps one ``MasterHealth`` row. A
restart is detected (``restart_reason``) when the master's request counters (the sum of every ``master_*_total``
family) went down against the previous successful read: counters only reset with the process.

Not evidence alone, so only reported: the key count (``master_key_count``: evictions, purges and a client leaving
drop keys too) and ``master_remount_segment_requests_total`` (seen growing at a normal start, when the agents'
clients mount their segments). A detected restart is flagged on the Checks page (``master_healthy``, for
``KVPOOL_MASTER_RESTART_FLAG_SECONDS``) and in ``/metrics`` (``kvpool_master_up``,
``kvpool_master_restarts_total``); the agents find out by themselves (their Store probe sees their blocks gone,
``agent.node.engines``), so their ledgers match the Store again within seconds.

HA mode (``tenants.masters``; ``docs/ha.md``): each probe reads every master's ``/health``
(``dashboard.master.leader``) and the serving leader's ``/metrics``. A new election (``view_version`` changed, or
another master leads) is a **failover**: counted (``MasterHealth.failovers``), flagged on the Checks page
(``master_healthy``, for ``KVPOOL_MASTER_FAILOVER_FLAG_SECONDS``) and in ``/metrics``
(``kvpool_master_failovers_total``), and the quota sync pushes the registry's quotas to the new leader
(``dashboard.tasks.probe_master``). Restart detection compares the counters of one leader only. While no master
serves (an election, the new leader's warm-up of about 5 s) the master is down.
"""
from __future__ import annotations

import logging
import urllib.error
import urllib.request
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

log = logging.getLogger("kvpool.dashboard.master")

#: Counter family of client segment remounts (kept in ``MasterHealth.remounts_total``; no evidence of a restart).
REMOUNT_FAMILY = "master_remount_segment_requests"


class MasterMetricsError(Exception):
    """The master's ``/metrics`` could not be read or parsed (the message says why)."""


@dataclass(frozen=True)
class MasterReading:
    """One read of the master's ``/metrics``: gauges in keys / bytes, ``counters_total`` = sum of every
    ``master_*_total`` counter, ``remounts_total`` = ``master_remount_segment_requests_total``."""

    key_count: int
    capacity_bytes: int
    allocated_bytes: int
    counters_total: float
    remounts_total: float


def parse_master_metrics(text: str) -> MasterReading:
    """Parse the exposition text of ``mooncake_master`` 0.3.13.post1.

    Raises:
        MasterMetricsError: not Prometheus text, or ``master_key_count`` is missing (not a Mooncake master).
    """
    gauges: dict[str, float] = {}
    counters = remounts = 0.0
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                name = sample.name
                if not name.startswith("master_"):
                    continue
                if name.endswith("_total"):
                    counters += sample.value
                    if name == f"{REMOUNT_FAMILY}_total":
                        remounts = sample.value
                elif not sample.labels:
                    gauges[name] = sample.value
    except ValueError as exc:
        raise MasterMetricsError(f"the master's /metrics is not Prometheus text: {exc}") from None
    if "master_key_count" not in gauges:
        raise MasterMetricsError("the master's /metrics has no master_key_count (is this a mooncake_master?)")
    return MasterReading(key_count=int(gauges["master_key_count"]),
                         capacity_bytes=int(gauges.get("master_total_capacity_bytes", 0)),
                         allocated_bytes=int(gauges.get("master_allocated_bytes", 0)),
                         counters_total=counters, remounts_total=remounts)


def read_master_metrics(metrics_url: str, timeout: float = 3.0) -> MasterReading:
    """GET ``metrics_url`` (``http://HOST:METRICS_PORT/metrics``) and parse it.

    Raises:
        MasterMetricsError: no answer, an HTTP error, or not a master's metrics.
    """
    try:
        with urllib.request.urlopen(metrics_url, timeout=timeout) as response:
            text = response.read().decode("utf-8", errors="replace")
    except (urllib.error.URLError, OSError) as exc:
        raise MasterMetricsError(f"master metrics at {metrics_url} unreachable: "
                                 f"{getattr(exc, 'reason', exc)}") from None
    return parse_master_metrics(text)


def restart_reason(previous: Any, reading: MasterReading) -> str:
    """Why ``reading`` comes from a restarted master, given the ``previous`` successful read (an object with
    ``counters_total`` and ``key_count``; None fields = no previous read); "" when it does not."""
    if previous is None or previous.counters_total is None or reading.counters_total >= previous.counters_total:
        return ""
    keys = f"; keys {previous.key_count} → {reading.key_count}" if previous.key_count is not None else ""
    return (f"the master restarted (its request counters went back from {previous.counters_total:.0f} to "
            f"{reading.counters_total:.0f}){keys}")


def metrics_url_from_settings() -> str:
    """``KVPOOL_MASTER_ADMIN_URL`` + ``/metrics`` (the master serves both on its metrics port)."""
    from django.conf import settings

    return settings.KVPOOL_MASTER_ADMIN_URL.rstrip("/") + "/metrics"


def current_health():
    """The ``MasterHealth`` row (unsaved defaults when the master was never probed)."""
    from dashboard.models import MasterHealth

    return MasterHealth.objects.filter(pk=1).first() or MasterHealth(pk=1)


def failover_reason(row: Any, elected: Any) -> str:
    """Why ``elected`` (a ``dashboard.master.leader.MasterState``: the master that won the newest election) means
    a failover against ``row`` (the ``MasterHealth`` row: the leader seen before), or "" when it does not: another
    master leads, or the election counter (``view_version``) moved. Nothing before (first probe): ""."""
    if elected is None or not row.leader_address:
        return ""
    moved = elected.rpc_address != row.leader_address
    reelected = (elected.view_version is not None and row.view_version is not None
                 and elected.view_version != row.view_version)
    if not moved and not reelected:
        return ""
    keys = f"; {row.key_count} key(s) before" if row.key_count is not None else ""
    versions = f" (election {row.view_version} → {elected.view_version})" if reelected else ""
    who = (f"master {elected.rpc_address} took over from {row.leader_address}" if moved
           else f"master {elected.rpc_address} was elected again")
    return f"failover: {who}{versions}{keys}"


def _read_ha(timeout: float) -> tuple[Any, MasterReading | None, str]:
    """HA mode: ``(view, leader's reading or None, error)`` from every master's ``/health`` and the serving leader's
    ``/metrics``."""
    from dashboard.master.leader import describe, read_masters

    view = read_masters(timeout=timeout)
    leader = view.leader
    if leader is None:
        return view, None, f"no master serves as leader: {describe(view)}"
    try:
        return view, read_master_metrics(leader.admin_url.rstrip("/") + "/metrics", timeout=timeout), ""
    except MasterMetricsError as exc:
        return view, None, str(exc)


def probe_master(metrics_url: str | None = None, *, now: datetime | None = None) -> tuple[Any, str]:
    """Read the master's metrics once and update the ``MasterHealth`` row (HA mode: every master's ``/health`` too,
    module docstring).

    Returns ``(row, event)``: ``event`` is the reason when this probe detected a restart or a failover
    (``row.last_restart_reason`` / ``row.last_failover_reason``), else "". An unreachable master (HA: no serving
    leader) marks the row down (``down_since``, ``last_error``) and keeps the last readings, so a restart is still
    detected when it answers again.
    """
    from django.conf import settings
    from django.db import transaction
    from django.utils import timezone

    from dashboard.models import MasterHealth
    from tenants.masters import ha_configured

    now = now or timezone.now()
    timeout = settings.KVPOOL_MASTER_ADMIN_TIMEOUT_SECONDS
    ha = metrics_url is None and ha_configured()
    view = None
    if ha:
        view, reading, error = _read_ha(timeout)
    else:
        url = metrics_url or metrics_url_from_settings()
        try:
            reading, error = read_master_metrics(url, timeout=timeout), ""
        except MasterMetricsError as exc:
            reading, error = None, str(exc)
    with transaction.atomic():
        row, _ = MasterHealth.objects.select_for_update().get_or_create(pk=1)
        row.checked_at = now
        event = ""
        if view is not None:
            elected = view.elected
            failover = failover_reason(row, elected)
            if failover:
                log.warning("%s", failover)
                row.failovers += 1
                row.last_failover_at, row.last_failover_reason = now, failover
                row.counters_total = None  # the new leader's counters start over: no restart to see in them
                event = failover
            if elected is not None:
                row.leader_address, row.leader_admin_url = elected.rpc_address, elected.admin_url
                row.view_version = elected.view_version
            row.standbys = view.standbys
            row.masters_down = "; ".join(f"{m.rpc_address}: {m.error}" for m in view.down)[:2000]
        elif metrics_url is None:  # one master (again): no leader, standbys or down masters to show
            row.leader_address = row.leader_admin_url = row.masters_down = ""
            row.view_version = row.standbys = None
        if reading is None:
            if row.up or row.down_since is None:
                log.warning("master down: %s", error)
                row.down_since = now
            row.up, row.last_error = False, error[:2000]
        else:
            restarted = restart_reason(row, reading)
            if restarted:
                event = restarted
                log.warning("%s", restarted)
                row.restarts += 1
                row.last_restart_at, row.last_restart_reason = now, restarted
                row.key_count_before_restart = row.key_count
            if not row.up or restarted:
                row.up_since = now
            row.up, row.last_error, row.down_since = True, "", None
            row.key_count, row.capacity_bytes, row.allocated_bytes = (reading.key_count, reading.capacity_bytes,
                                                                      reading.allocated_bytes)
            row.counters_total, row.remounts_total = reading.counters_total, reading.remounts_total
        row.save()
    return row, event
