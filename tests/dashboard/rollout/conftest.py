"""Fixtures of the rollout tests (push, upgrade, purge): logged-in test clients, a private Redis as the push broker
(autouse: no real master reached, no leftover pushes)."""
from tests.support.registry import operator, viewer
from tests.support.telemetry import _no_leftover_pushes, dashboard_broker, master, redis_server, workers
from tests.support.ui import _isolated, ui, viewer_ui
