"""Django settings of the demo: the project's settings plus what a single-machine run needs.

* ``KVPOOL_GLOBAL_SEGMENT_SIZE`` / ``KVPOOL_LOCAL_BUFFER_SIZE`` (bytes) from the environment: the Store segment
  each agent mounts and its transfer buffer, sized small so the replay fills the Store (the project settings
  leave them to ``tenants.rendering.StoreEndpoints``' defaults of 4 GiB / 512 MiB).

SQLite (the web server, the Celery worker ingesting every second and the demo itself write the same file) is in WAL
mode with ``IMMEDIATE`` transactions and a 30 s busy timeout, as ``dashboard.settings`` sets for every SQLite
database.
"""
from __future__ import annotations

from dashboard.env import env_int
from dashboard.settings import *  # noqa: F401,F403

KVPOOL_GLOBAL_SEGMENT_SIZE = env_int("KVPOOL_GLOBAL_SEGMENT_SIZE", 64 << 20, minimum=0)
KVPOOL_LOCAL_BUFFER_SIZE = env_int("KVPOOL_LOCAL_BUFFER_SIZE", 16 << 20, minimum=0)
