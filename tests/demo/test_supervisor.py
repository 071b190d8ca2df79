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


#: On SIGTERM: mark ``<name>.term``, exit cleanly only once ``<other>.term`` exists (so it needs both signalled before
#: either is waited for), then mark ``<name>.done``. Before SIGTERM: mark ``<name>.up``.
PEER = r"""
import os, signal, sys, time
d, name, other = sys.argv[1:4]
def term(*_):
    open(os.path.join(d, name + ".term"), "w").close()
    for _ in range(3000):
        if os.path.exists(os.path.join(d, other + ".term")):
            open(os.path.join(d, name + ".done"), "w").close()
            os._exit(0)
        time.sleep(0.01)
    os._exit(3)
signal.signal(signal.SIGTERM, term)
open(os.path.join(d, name + ".up"), "w").close()
while True:
    time.sleep(1)
"""
#: On SIGTERM: write which ``*.done`` marks exist (the newer services that had stopped), then exit.
BROKER = r"""
import os, signal, sys, time
d = sys.argv[1]
def term(*_):
    with open(os.path.join(d, "broker.saw"), "w") as f:
        f.write(" ".join(sorted(n for n in os.listdir(d) if n.endswith(".done"))))
    os._exit(0)
signal.signal(signal.SIGTERM, term)
open(os.path.join(d, "broker.up"), "w").close()
while True:
    time.sleep(1)
"""


def test_stop_all_signals_a_run_of_services_together_and_the_shared_broker_after_them(tmp_path):
    marks = tmp_path / "marks"
    marks.mkdir()
    sup = Supervisor()
    broker = sup.start(Service("redis-server", [sys.executable, "-c", BROKER, str(marks)], os.environ,
                               tmp_path / "broker.log"), shared=True)
    order: list[str] = []
    sup.on_stop("master", lambda: order.append("master stopped"))
    a = sup.start(Service("agent node-a", [sys.executable, "-c", PEER, str(marks), "a", "b"], os.environ,
                          tmp_path / "a.log"))
    b = sup.start(Service("agent node-b", [sys.executable, "-c", PEER, str(marks), "b", "a"], os.environ,
                          tmp_path / "b.log"))
    try:
        for name, service in (("broker", broker), ("a", a), ("b", b)):
            service.wait_until(lambda n=name: (marks / f"{n}.up").exists(), 60, "its signal handler")
    except BaseException:
        sup.stop_all()
        raise
    assert sup.stop_all(order.append) == []
    # stopped one after the other, agent node-b would wait for node-a's SIGTERM until its grace ran out (SIGKILL)
    assert (a.proc.returncode, b.proc.returncode) == (0, 0)
    assert order == ["agent node-b", "agent node-a", "master", "master stopped", "redis-server"]
    assert (marks / "broker.saw").read_text() == "a.done b.done"
    assert broker.proc.returncode == 0 and not any(s.alive for s in (a, b, broker))
