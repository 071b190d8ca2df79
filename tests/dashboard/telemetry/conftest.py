"""Fixtures of the telemetry tests: private Redis, Celery workers, a real master (autouse: no leftover pushes)."""
from tests.support.telemetry import _no_leftover_pushes, dashboard_broker, master, redis_server, workers
