"""The dashboard's Celery application (broker: Redis, JSON only).

Run the workers with the Django settings:
    celery -A dashboard.celery worker -Q dashboard.ingest,dashboard.control
    celery -A dashboard.celery beat            # periodic re-push, rollups, master quota sync/sampling

Queues: ``dashboard.ingest`` (agents' acks, reports, heartbeats — task ``dashboard.ingest``),
``dashboard.control`` (everything else the dashboard runs). Config documents go out to ``agent.<node>``.
Configuration comes from ``CELERY_*`` settings in ``dashboard/settings.py``.
"""
from __future__ import annotations

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dashboard.settings")

app = Celery("dashboard")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks(["dashboard"])


def use_broker(url: str) -> None:
    """Send through ``url`` from now on (tests and benchmarks that start their own Redis).

    Celery caches the connection and producer pools of the first broker it used; both are dropped here so the
    next publish connects to ``url``.
    """
    app.conf.broker_url = url
    app._pool = None
    app.amqp._producer_pool = None
