"""Celery tasks of the dashboard: thin wrappers around plain functions (JSON arguments and results).

Queue ``dashboard.ingest``: ``dashboard.ingest``. Queue ``dashboard.control``: everything else.
Periodic (``CELERY_BEAT_SCHEDULE``): reconcile_configs, rollup_occupancy, sync_master_quotas,
sample_master_quotas.
"""
from __future__ import annotations

import logging
from typing import Any

from dashboard.celery import app
from dashboard.master_admin import MasterUnavailable
from dashboard.purge import purge_result  # noqa: F401  (registers the task dashboard.purge_result)

log = logging.getLogger("kvpool.dashboard.tasks")


@app.task(name="dashboard.ingest", ignore_result=True)
def ingest(messages: list[dict[str, Any]]) -> dict[str, int]:
    """Store a batch of agent messages (acks, reports, heartbeats); see ``dashboard.ingest``."""
    from dashboard.ingest import ingest as run

    return run(messages).as_dict()


@app.task(name="dashboard.push_nodes", ignore_result=True, autoretry_for=(Exception,), retry_backoff=True,
          retry_jitter=True, max_retries=5)
def push_nodes(node_names: list[str]) -> dict[str, int]:
    """Render, version and send the config documents of the named nodes."""
    from dashboard.push import push_nodes as run

    return run(node_names)


@app.task(name="dashboard.reconcile_configs", ignore_result=True)
def reconcile_configs() -> dict[str, int]:
    """Periodic: re-render every node, send new versions, re-send to nodes whose ack lags."""
    from dashboard.push import reconcile

    return reconcile()


@app.task(name="dashboard.rollup_occupancy", ignore_result=True)
def rollup_occupancy() -> dict[str, int]:
    """Periodic: raw → 1 min → 1 h rollups and retention."""
    from dashboard.rollup import rollup

    return rollup()


@app.task(name="dashboard.sync_master_quotas", ignore_result=True, autoretry_for=(MasterUnavailable,),
          retry_backoff=True, retry_jitter=True, max_retries=5)
def sync_master_quotas(tenant_ids: list[str] | None = None) -> dict[str, int]:
    """Push registry quotas to the master admin API and rewrite ``tenant_quotas.yaml``."""
    from dashboard.master_admin import sync_quotas

    return sync_quotas(tenant_ids)


@app.task(name="dashboard.sample_master_quotas", ignore_result=True)
def sample_master_quotas() -> int:
    """Periodic: store each tenant's requested/effective/charged bytes and admission flags from the master."""
    from dashboard.master_admin import sample_quotas

    try:
        return sample_quotas()
    except MasterUnavailable as exc:
        log.warning("master quota sampling skipped: %s", exc)
        return 0
