"""``python -m demo`` end to end on real services: a small ``--once`` replay passes every check, and Ctrl-C stops
every process the demo started.

Each run uses a private ``redis-server``, free ports and its own run directory, so it never meets another run.
"""
from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agent.sim.master import free_ports
from tests.support.paths import ROOT

pytestmark = pytest.mark.integration


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST", "DJANGO_"))}
    env.update({"PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"})
    return env


def _argv(var: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "demo", "--private-redis", "--var-dir", str(var), "--port", str(free_ports(1)[0]),
            "--segment-mib", "16", *extra]


def _leftovers(marker: str) -> list[str]:
    """Live processes whose command line or environment mentions ``marker`` (the run directory)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            environ = (entry / "environ").read_bytes().decode(errors="replace")
            state = (entry / "stat").read_text().split()[2]
        except OSError:
            continue
        if state != "Z" and (marker in cmdline or marker in environ):
            found.append(f"{entry.name}: {cmdline[:120]}")
    return found


def _wait_no_leftovers(marker: str, timeout: float = 10) -> list[str]:
    deadline = time.monotonic() + timeout
    while True:
        left = _leftovers(marker)
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.2)


@pytest.mark.timeout(1000)  # hang guard above the demo's own limits
def test_once_replays_the_trace_and_passes_every_check(tmp_path):
    var = tmp_path / "run"
    done = subprocess.run(_argv(var, "--once", "--requests", "300", "--timeout", "300"), cwd=ROOT, env=_env(),
                          capture_output=True, text=True, timeout=900)  # hang guards only: a loaded CI machine is slow
    out = done.stdout
    assert done.returncode == 0, f"{out[-6000:]}\n{done.stderr[-3000:]}"
    assert re.search(r"Dashboard: http://127\.0\.0\.1:\d+/\s+login: admin / \S+", out)
    assert re.search(r"(\d+)/\1 checks passed", out), out[-3000:]
    for name in ("config pushed and acked", "replay complete", "namespaces with bytes and hits",
                 "prefill/decode sharing", "misconfigured instance gets zero hits", "dashboard checks flag it",
                 "store filled to eviction", "namespaces isolated"):
        assert f"PASS {name}:" in out, name
    # the summary table: >= 4 registered namespaces with bytes and a non-zero hit ratio, the mistyped one at 0
    # columns: tenant, model, release, request group, blocks, bytes, hit ratio, hits P/D, evictions seen, orphaned
    rows = [re.split(r"\s{2,}", line.strip()) for line in out.splitlines() if line.startswith(("acme ", "globex "))]
    assert rows and all(len(r) == 10 for r in rows), rows
    good = [r for r in rows if not r[2].endswith("!") and int(r[4]) > 0 and float(r[6].rstrip("%")) > 0]
    assert len(good) >= 4, rows
    assert all(int(r[7].split("/")[1]) > 0 for r in good)  # decode hits: node-b loaded what node-a stored
    typo = [r for r in rows if r[2] == "production-2026-7 !"]
    assert typo and all(r[4] == "0" and r[6] == "0.0%" for r in typo)
    assert "exit status 0" in out
    assert _wait_no_leftovers(str(var)) == []


def test_ctrl_c_stops_every_process_the_demo_started(tmp_path):
    var = tmp_path / "run"
    proc = subprocess.Popen(_argv(var, "--requests", "50"), cwd=ROOT, env=_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    try:
        for line in proc.stdout:
            lines.append(line)
            if "agents node-a (prefill) and node-b (decode) running" in line:
                break
        assert _leftovers(str(var)), "the demo started no process that mentions its run directory"
        proc.send_signal(signal.SIGINT)
        rest, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    out = "".join(lines) + rest
    assert proc.returncode == 130, out[-3000:]
    assert "interrupted" in out and "stopping agent node-a" in out and "stopping mooncake_master" in out
    assert _wait_no_leftovers(str(var)) == []


def test_an_error_midway_stops_what_was_started(tmp_path):
    var = tmp_path / "run"
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        argv = _argv(var, "--once")
        argv[argv.index("--port") + 1] = str(port)
        done = subprocess.run(argv, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stdout[-3000:]
    assert f"error: --port {port} is in use" in done.stdout
    assert "stopping mooncake_master" in done.stdout and "stopping redis-server" in done.stdout
    assert _wait_no_leftovers(str(var)) == []
