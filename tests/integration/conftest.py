"""Fixtures of the cross-package tests on real services: private Redis, Celery workers, a real master (autouse: no
leftover pushes)."""
from tests.support.engine import engine_python
from tests.support.telemetry import _no_leftover_pushes, dashboard_broker, master, redis_server, workers
