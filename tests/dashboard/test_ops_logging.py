"""The dashboard's log lines appear once, in runserver/gunicorn and in a Celery worker alike."""
from __future__ import annotations

import subprocess
import sys

from tests.support.paths import ROOT

SCRIPT = """
import logging, os
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dashboard.settings")
import django
django.setup()
if os.environ.get("AS_WORKER"):
    from dashboard.celery import app
    app.log.setup(loglevel="INFO", redirect_stdouts=False)  # what `celery worker` does: it takes over the root
logging.getLogger("kvpool.dashboard.test").info("one-line-check")
logging.getLogger("kvpool.dashboard.test").debug("debug-line-check")
"""


def _stderr(worker: bool) -> str:
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "DJANGO_SECRET_KEY": "k" * 50}
    if worker:
        env["AS_WORKER"] = "1"
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, timeout=120,
                          check=True)
    return done.stdout + done.stderr


def test_kvpool_lines_print_once_outside_and_inside_a_celery_worker():
    for worker in (False, True):
        out = _stderr(worker)
        assert out.count("one-line-check") == 1, (worker, out)
        assert "debug-line-check" not in out  # KVPOOL_LOG_LEVEL defaults to INFO
