"""The fault suite's behaviour (``python -m bench.faults --patience 4``) on the real system: a master restart and a
broker stall are flagged on Checks and in ``/metrics``, no report is lost or stored twice, and the agents' ledgers
equal the Store again after the master restart; a killed agent comes back with its ledger (these three in one run:
one system set up, not two); a killed HA leader is replaced (its own run: HA masters). The bench's timing goals
(flagged within 15 s, ...) are its figures, not asserted here: a loaded machine may be 4x slower.

The two runs are two independent systems (their own PostgreSQL cluster, Redis, masters, dashboard and agents on
free ports, their own work directories), and most of a run is spent waiting for a fault to be flagged or repaired:
the ``fault_runs`` fixture starts the runs of the selected tests at once and each test reads its own run's result,
so the module takes about as long as the longer run, not the sum of both."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.paths import ROOT

pytestmark = pytest.mark.integration

#: Seconds after which a run counts as hung (a guard, not a speed limit: a loaded machine may be 4x slower).
HANG_GUARD_S = 1800

#: ``bench.faults`` arguments per test of this module (each test's own system).
RUNS = {
    "test_master_restart_broker_stall_and_killed_agent_are_flagged_and_lose_nothing": [
        "--scenarios", "master,broker,agent", "--requests", "3000", "--warmup", "6", "--stall", "16",
        "--patience", "4"],
    "test_a_killed_ha_leader_is_replaced_flagged_and_loses_no_report": [
        "--scenarios", "failover", "--requests", "3000", "--warmup", "6", "--patience", "4"],
}


class FaultRun:
    """One ``python -m bench.faults`` child, its stdout and stderr in files (two children may print a lot)."""

    def __init__(self, argv: list[str], logs: Path) -> None:
        env = {key: value for key, value in os.environ.items() if not key.startswith(("PYTEST", "DJANGO_"))}
        logs.mkdir(parents=True)
        self.out, self.err = logs / "stdout", logs / "stderr"
        with self.out.open("w") as out, self.err.open("w") as err:
            self.proc = subprocess.Popen([sys.executable, "-m", "bench.faults", *argv], cwd=ROOT, env=env,
                                         stdout=out, stderr=err, text=True)

    def result(self) -> tuple[dict, str]:
        """``(the last stdout line as JSON, the stderr tail)`` once the run ended (``HANG_GUARD_S - 60`` s at most).

        Raises:
            subprocess.TimeoutExpired: the run hung.
        """
        self.proc.wait(timeout=HANG_GUARD_S - 60)
        lines = self.out.read_text().strip().splitlines()
        stderr = self.err.read_text()[-3000:]
        assert lines, stderr
        return json.loads(lines[-1]), stderr

    def stop(self) -> None:
        """SIGINT (the bench stops its system in a ``finally``), SIGKILL after 120 s."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture(scope="module")
def fault_runs(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    """``{test name: FaultRun}`` for the tests of this module that were selected, all started now."""
    selected = {getattr(item, "originalname", "") for item in request.session.items
                if getattr(item, "module", None) is request.module}
    logs = tmp_path_factory.mktemp("faults")
    runs: dict[str, FaultRun] = {}
    try:
        for name, argv in RUNS.items():
            if name in selected:
                runs[name] = FaultRun(argv, logs / name)
        yield runs
    finally:
        for run in runs.values():
            run.stop()


@pytest.fixture
def fault_run(fault_runs: dict, request: pytest.FixtureRequest) -> FaultRun:
    """This test's run (started with the module's others by ``fault_runs``)."""
    return fault_runs[request.node.originalname]


@pytest.mark.timeout(HANG_GUARD_S)
def test_master_restart_broker_stall_and_killed_agent_are_flagged_and_lose_nothing(fault_run):
    """One system, three faults in turn (``bench.faults`` runs each after the previous recovered, with its own
    figures): a master restart and a broker stall are flagged, lose no report and store none twice; then an agent
    SIGKILLed mid-batch and restarted restores its ledger from its state directory, so once the batches queued
    meanwhile ran its reported occupancy equals what the master charges again (issue 13)."""
    result, stderr = fault_run.result()
    assert "error" not in result, result["error"]
    scenarios = result["scenarios"]
    assert list(scenarios) == ["master", "broker", "agent"], scenarios
    master, broker, agent = scenarios["master"], scenarios["broker"], scenarios["agent"]
    for figures in (master, broker, agent):
        assert figures["reports_lost"] == 0 and figures["reports_duplicated"] == 0, figures
    for figures in (master, broker):
        assert figures["detect_s"] is not None and figures["recover_s"] is not None, figures
    assert master["occupancy_error"] <= 0.02, master
    assert agent["occupancy_settled_s"] is not None, agent
    assert result["behaved"], stderr


@pytest.mark.timeout(HANG_GUARD_S)
def test_a_killed_ha_leader_is_replaced_flagged_and_loses_no_report(fault_run):
    """HA masters (a real etcd, two ``mooncake_master --enable_ha``): SIGKILL the leader under load; a standby leads,
    Checks and ``/metrics`` flag the failover, the new leader holds the registry's quotas (a change its policy file
    lacked), the agents store through it, no report is lost or stored twice."""
    result, stderr = fault_run.result()
    assert "error" not in result, result["error"]
    failover = result["scenarios"]["failover"]
    assert failover["reports_lost"] == 0 and failover["reports_duplicated"] == 0, failover
    assert failover["new_leader"] not in (None, failover["old_leader"]), failover
    assert failover["detect_s"] is not None and failover["quotas_held_s"] is not None, failover
    assert failover["stored_s"] is not None and failover["recover_s"] is not None, failover
    assert failover["remounted_s"] is not None and failover["capacity_after"] == failover["capacity_before"], failover
    assert result["behaved"], stderr
