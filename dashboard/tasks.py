"""Celery tasks of the dashboard: thin wrappers around plain functions (JSON arguments and results).

Queue ``dashboard.ingest``: ``dashboard.ingest`` (which also stores the ingest tasks queued behind it, see
``dashboard.telemetry.drain``) and the agents' ``dashboard.purge_result``; any other task runs only when the
dashboard signed it (``dashboard.task_queues``), whichever queue it came from.

Queue ``dashboard.control``: everything else.
Periodic (``CELERY_BEAT_SCHEDULE``): reconcile_configs, rollup_occupancy, sync_master_quotas,
sample_master_quotas, probe_master (which starts sync_quotas_to_leader after a failover).
"""
from __future__ import annotations

import logging
from typing import Any

from agent.contract.messages import INGEST_QUEUE
from dashboard.celery import app
from dashboard.master.quota_sync import MasterUnavailable
from dashboard.rollout.purge import purge_result  # noqa: F401  (registers the task dashboard.purge_result)

log = logging.getLogger("kvpool.dashboard.tasks")


#: An ingest task that finds the database unreachable is retried this often (every 1, 2, 4, 8, then 10 s: about
#: 10 minutes), so a database restart loses no agent message.
INGEST_DB_RETRIES = 64


@app.task(name="dashboard.ingest", ignore_result=True, bind=True, max_retries=INGEST_DB_RETRIES, acks_late=True,
          reject_on_worker_lost=True)
def ingest(self, messages: list[dict[str, Any]]) -> dict[str, int]:
    """Verify and store a batch of agent messages (acks, reports, heartbeats); see ``dashboard.ingest``.

    Acknowledged after it ran (``acks_late``), so a worker that dies mid-batch loses nothing: a pool process
    killed under a live worker has its task put back at once (``reject_on_worker_lost``), a dead worker's tasks
    come back after ``KVPOOL_INGEST_REDELIVER_SECONDS`` (``dashboard.telemetry.redeliver``).

    Each message must be signed by the node it names and fresh (``dashboard.telemetry.agent_auth``); a refused one is
    logged, counted per reason (``kvpool_agent_messages_rejected_total``) and not stored.

    Run by a worker from the ``dashboard.ingest`` queue, it also takes the ingest tasks waiting behind it and
    stores everything in one transaction (``dashboard.telemetry.drain``); the result then counts all of them and
    ``tasks`` says how many tasks were stored. Called directly or eagerly it stores only ``messages``.
    Arguments that are not a list are logged and dropped (counted as ``invalid``). While the database is unreachable
    (``OperationalError``, ``InterfaceError``: nothing was stored) the task is sent again with a backoff, up to
    ``INGEST_DB_RETRIES`` times (storing is idempotent per ``(node, sequence)``).
    """
    from django.db import InterfaceError, OperationalError

    try:
        return _ingest(self, messages)
    except (OperationalError, InterfaceError) as exc:  # Celery's Django fixup drops the broken connection
        log.warning("ingest: database unavailable (%s); task %s retried (attempt %d)", exc, self.request.id,
                    self.request.retries + 1)
        raise self.retry(exc=exc, countdown=min(2 ** self.request.retries, 10)) from None


def _ingest(self: Any, messages: Any) -> dict[str, int]:
    from dashboard.telemetry.agent_auth import count_refused
    from dashboard.telemetry.ingest import IngestResult
    from dashboard.telemetry.ingest import ingest as run

    if not isinstance(messages, list):
        log.warning("ingest: dropped task %s: its argument is %s, not a list of agent messages",
                    self.request.id, type(messages).__name__)
        count_refused("invalid", f"ingest task argument is {type(messages).__name__}, not a list")
        return {**IngestResult(invalid=1, rejected={"invalid": 1}).as_dict(), "tasks": 1}
    queue = (self.request.delivery_info or {}).get("routing_key")
    if self.request.called_directly or self.request.is_eager or queue != INGEST_QUEUE:
        return {**run(messages).as_dict(), "tasks": 1}
    from dashboard.telemetry.drain import ingest_queued

    properties = getattr(self.request, "properties", None) or {}  # the broker's delivery tag (Redis: a uuid)
    result, taken = ingest_queued(app, messages, own_id=self.request.id or "",
                                  own_tag=str(properties.get("delivery_tag") or ""))
    return {**result.as_dict(), "tasks": 1 + taken}


@app.task(name="dashboard.push_nodes", ignore_result=True, autoretry_for=(Exception,), retry_backoff=True,
          retry_jitter=True, max_retries=5)
def push_nodes(node_names: list[str]) -> dict[str, int]:
    """Render, version and send the config documents of the named nodes."""
    from dashboard.rollout.push import push_nodes as run

    return run(node_names)


@app.task(name="dashboard.reconcile_configs", ignore_result=True)
def reconcile_configs() -> dict[str, int]:
    """Periodic: re-render every node, send new versions, re-send to nodes whose ack lags. Re-rendering also re-plans
    the demand-weighted budget shares of releases written on several nodes (``dashboard.rollout.budget_shares``)."""
    from dashboard.rollout.push import reconcile

    return reconcile()


@app.task(name="dashboard.rollup_occupancy", ignore_result=True)
def rollup_occupancy() -> dict[str, int]:
    """Periodic: raw → 1 min → 1 h rollups and retention."""
    from dashboard.telemetry.rollup import rollup

    return rollup()


@app.task(name="dashboard.sync_master_quotas", ignore_result=True, autoretry_for=(MasterUnavailable,),
          retry_backoff=True, retry_jitter=True, max_retries=5)
def sync_master_quotas(tenant_ids: list[str] | None = None) -> dict[str, int]:
    """Push registry quotas to the master admin API and rewrite ``tenant_quotas.yaml``."""
    from dashboard.master.quota_sync import sync_quotas

    return sync_quotas(tenant_ids)


#: After a failover: seconds between attempts to reach the new leader (it serves about 5 s after its election) and
#: how many attempts (the new leader gets the registry's quotas within about a second of serving).
FAILOVER_SYNC_RETRY_SECONDS = 1
FAILOVER_SYNC_ATTEMPTS = 120


@app.task(name="dashboard.sync_quotas_to_leader", ignore_result=True, bind=True,
          max_retries=FAILOVER_SYNC_ATTEMPTS)
def sync_quotas_to_leader(self) -> dict[str, int]:
    """After a failover (``dashboard.master.health``): push the registry's quotas to the new leader as soon as it
    serves: while no master serves (election, warm-up), retry every ``FAILOVER_SYNC_RETRY_SECONDS``."""
    from dashboard.master.quota_sync import sync_quotas

    try:
        return sync_quotas()
    except MasterUnavailable as exc:
        raise self.retry(exc=exc, countdown=FAILOVER_SYNC_RETRY_SECONDS) from None


@app.task(name="dashboard.sample_master_quotas", ignore_result=True)
def sample_master_quotas() -> int:
    """Periodic: store each tenant's requested/effective/charged bytes and admission flags from the master."""
    from dashboard.master.quota_sync import sample_quotas

    try:
        return sample_quotas()
    except MasterUnavailable as exc:
        log.warning("master quota sampling skipped: %s", exc)
        return 0


@app.task(name="dashboard.probe_master", ignore_result=True)
def probe_master() -> dict[str, Any]:
    """Periodic: read the master's ``/metrics`` (HA mode: every master's ``/health`` too), record up/down and detect
    a restart or a failover (``dashboard.master.health``); after a restart, push the registry's quotas to the new
    master at once, after a failover to the new leader as soon as it serves (``sync_quotas_to_leader``); when the
    mounted capacity changed, re-render the nodes whose documents carry implicit budgets."""
    from django.conf import settings

    from dashboard.master.health import current_health
    from dashboard.master.health import probe_master as run

    before = current_health()
    capacity, failovers = before.capacity_bytes, before.failovers
    row, event = run()
    failover = row.failovers != failovers
    if event and settings.KVPOOL_MASTER_SYNC:
        (sync_quotas_to_leader if failover else sync_master_quotas).delay()
    if row.up and row.capacity_bytes != capacity:  # implicit budgets follow the mounted capacity
        from dashboard.signals import implicit_budget_nodes, schedule_push

        schedule_push(implicit_budget_nodes())
    return {"up": row.up, "restarted": bool(event) and not failover, "restarts": row.restarts,
            "failover": failover, "failovers": row.failovers}
