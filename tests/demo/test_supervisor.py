"""The demo's supervisor restarts a dead agent (``restart=True``) and fails the demo for any other dead service."""
from __future__ import annotations

import os
import signal
import sys

import pytest

from demo import procs
from demo.procs import DemoError, Service, Supervisor

SLEEPER = [sys.executable, "-c", "import time; time.sleep(60)"]


def test_a_killed_agent_is_restarted_and_other_services_still_fail_the_demo(tmp_path, monkeypatch):
    sup = Supervisor()
    agent = sup.start(Service("agent node-a", SLEEPER, os.environ, tmp_path / "agent.log", restart=True))
    web = sup.start(Service("django", SLEEPER, os.environ, tmp_path / "web.log"))
    lines: list[str] = []
    try:
        first = agent.pid
        os.killpg(first, signal.SIGKILL)
        agent.proc.wait(timeout=10)
        sup.check_all(lines.append)
        assert agent.alive and agent.pid != first
        assert lines == [f"agent node-a exited with status -9; restarted it (pid {agent.pid}, 1 restart(s) in 300s)"]
        sup.check_all(lines.append)  # alive: nothing to do
        assert len(lines) == 1
        monkeypatch.setattr(procs, "MAX_RESTARTS", 1)
        os.killpg(agent.pid, signal.SIGKILL)
        agent.proc.wait(timeout=10)
        with pytest.raises(DemoError, match="agent node-a exited"):  # dies again: a crash loop stops the demo
            sup.check_all(lines.append)
        os.killpg(web.pid, signal.SIGKILL)
        web.proc.wait(timeout=10)
        monkeypatch.setattr(procs, "MAX_RESTARTS", 5)
        with pytest.raises(DemoError, match="django exited"):
            sup.check_all(lines.append)
    finally:
        sup.stop_all()
