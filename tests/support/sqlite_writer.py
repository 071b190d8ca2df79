"""A second process writing the dashboard's database in a loop, as the Celery worker does while it ingests.

    python -m tests.support.sqlite_writer --ready PATH --stop PATH [--hold-s S]

Runs with the dashboard's settings (``DJANGO_SETTINGS_MODULE``, ``DATABASE_URL`` from the environment), so its
connection is opened exactly as the worker's would be. Each round is one transaction that updates a node's state,
inserts an occupancy sample and holds the write lock ``--hold-s`` seconds (an ingest batch) before committing.
Touches ``--ready`` after its first commit, stops once ``--stop`` exists, and prints one JSON line:
``{"committed": N, "locked": M}`` (``locked``: its own rounds that failed with "database is locked").
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ready", type=Path, required=True)
    parser.add_argument("--stop", type=Path, required=True)
    parser.add_argument("--hold-s", type=float, default=0.02)
    args = parser.parse_args(argv)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dashboard.settings")
    import django

    django.setup()
    from django.db import OperationalError, transaction
    from django.utils import timezone

    from dashboard.models import NodeState, OccupancySample

    committed = locked = 0
    while not args.stop.exists():
        try:
            with transaction.atomic():
                now = timezone.now()
                NodeState.objects.update_or_create(node_name="node-writer", defaults={"heartbeat_at": now})
                OccupancySample.objects.create(ts=now, node_name="node-writer", tenant_id="writer", bytes=committed)
                time.sleep(args.hold_s)
            committed += 1
        except OperationalError as exc:
            if "locked" not in str(exc):
                raise
            locked += 1
        if committed == 1 and not args.ready.exists():
            args.ready.touch()
        time.sleep(args.hold_s / 4)
    print(json.dumps({"committed": committed, "locked": locked}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
