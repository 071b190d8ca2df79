"""The dashboard's Celery application (broker: Redis, JSON only).

Run the workers with the Django settings:
    celery -A dashboard.celery worker -Q dashboard.ingest,dashboard.control
    celery -A dashboard.celery beat            # periodic re-push, rollups, master quota sync/sampling

Queues: ``dashboard.ingest`` (agents' acks, reports, heartbeats — task ``dashboard.ingest`` — and purge results),
``dashboard.control`` (everything else the dashboard runs; agents cannot write it). The worker runs only the
agents' tasks and tasks the dashboard signed when it sent them (``dashboard.task_queues``), from either queue.
Config documents go out to ``agent.<node>``. Configuration comes from ``CELERY_*`` settings in
``dashboard/settings.py``. JSON task bodies are decoded by ``dashboard.broker_json`` (msgspec where it returns what
kombu would).

Database connections: Celery's Django fixup closes every database connection before and after each task
unless ``CELERY_DB_REUSE_MAX`` is set, which makes each task open a new PostgreSQL connection (a backend
process and authentication per ack when 200 agents ack one push). Unless the settings set it, it is set here
(``DB_REUSE_MAX_TASKS``) and the worker instead closes connections the way Django does around a request
(``close_old_connections``: after ``CONN_MAX_AGE`` seconds, or when unusable after an error).
"""
from __future__ import annotations

import os

from celery import Celery
from celery.signals import task_postrun, task_prerun

from dashboard import broker_json
from dashboard.env import load_settings_or_exit

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dashboard.settings")
load_settings_or_exit()  # unusable settings: one line "Error: improperly configured: …", exit 2

# Tasks the dashboard sends are signed; the worker runs only those and the agents' own (dashboard.task_queues).
app = Celery("dashboard", task_cls="dashboard.task_queues:QueueCheckedTask", amqp="dashboard.task_queues:SigningAMQP")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks(["dashboard"])
broker_json.use_for_json()  # task bodies decoded by msgspec where it reads them as kombu does (ingest batches)
app.steps["worker"].add("dashboard.telemetry.redeliver:RestoreStaleIngest")  # a dead worker's ingest tasks

#: Tasks per worker thread after which Celery's Django fixup closes its connections anyway.
DB_REUSE_MAX_TASKS = 1000


@app.on_after_configure.connect
def _reuse_database_connections(sender, source, **kwargs) -> None:
    """Keep connections across tasks (see the module docstring) unless the settings say otherwise."""
    if source.get("CELERY_DB_REUSE_MAX") is None:
        source.CELERY_DB_REUSE_MAX = DB_REUSE_MAX_TASKS


@task_prerun.connect
@task_postrun.connect
def _close_old_connections(sender=None, **kwargs) -> None:
    """Around each task run by a worker: close connections past ``CONN_MAX_AGE`` or broken by an error.

    Skipped for eager tasks: they run inside the caller's (possibly open) transaction.
    """
    request = getattr(sender, "request", None)
    if request is None or getattr(request, "is_eager", False):
        return
    from django.db import close_old_connections

    close_old_connections()


def use_broker(url: str) -> None:
    """Send through ``url`` from now on (tests and benchmarks that start their own Redis).

    Celery caches the connection and producer pools of the first broker it used; both are dropped here so the
    next publish connects to ``url``.
    """
    app.conf.broker_url = url
    app._pool = None
    app.amqp._producer_pool = None
