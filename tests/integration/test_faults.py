"""The fault suite's pass/fail parts (``python -m bench.faults``) on the real system: a master restart and a broker
stall are flagged on Checks and in ``/metrics`` within 15 s, no report is lost or stored twice, and the agents'
ledgers equal the Store again within 30 s of the master restart."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.support.paths import ROOT

pytestmark = pytest.mark.integration


@pytest.mark.timeout(420)
def test_master_restart_and_broker_stall_are_flagged_and_lose_nothing():
    env = {key: value for key, value in os.environ.items() if not key.startswith(("PYTEST", "DJANGO_"))}
    done = subprocess.run([sys.executable, "-m", "bench.faults", "--scenarios", "master,broker", "--requests", "3000",
                           "--warmup", "6", "--stall", "16"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=400)
    lines = done.stdout.strip().splitlines()
    assert lines, done.stderr[-3000:]
    result = json.loads(lines[-1])
    assert "error" not in result, result["error"]
    master, broker = result["scenarios"]["master"], result["scenarios"]["broker"]
    for figures in (master, broker):
        assert figures["reports_lost"] == 0 and figures["reports_duplicated"] == 0, figures
        assert figures["detect_s"] is not None and figures["detect_s"] <= 15, figures
        assert figures["recover_s"] is not None, figures
    assert master["recover_s"] <= 30 and master["occupancy_error"] <= 0.02, master
    assert result["passed"] and done.returncode == 0, done.stderr[-3000:]
