"""The node's mooncake_client supervisor (agent.node.segment): flags, restart with backoff, clean stop, and
against a real mooncake_master: the segment is mounted, comes back after SIGKILL, and goes after stop."""
from __future__ import annotations

import json
import os
import signal
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from agent.node.segment import (
    SegmentConfig,
    SegmentError,
    SegmentSupervisor,
    find_client_binary,
    supervisor_for,
)
from tests.support.waiting import wait_for as _wait

MIB = 1 << 20


def _config(**overrides) -> SegmentConfig:
    fields = {"master_server_address": "127.0.0.1:50051", "metadata_server": "http://127.0.0.1:8080/metadata",
              "segment_bytes": 32 * MIB}
    fields.update(overrides)
    return SegmentConfig(**fields)


def test_flags_round_trip_with_the_rendered_line():
    config = _config(host="10.0.0.7", port=50100, device_name="mlx5_0")
    argv = config.argv()
    assert argv == ["mooncake_client", "--host=10.0.0.7", "--port=50100", "--master_server_address=127.0.0.1:50051",
                    "--metadata_server=http://127.0.0.1:8080/metadata", "--protocol=tcp",
                    f"--global_segment_size={32 * MIB}", "--device_names=mlx5_0"]
    assert SegmentConfig.from_argv(argv) == config
    with pytest.raises(ValueError, match="unexpected"):
        SegmentConfig.from_argv(["mooncake_client", "--bogus=1"])
    with pytest.raises(ValueError, match="16 MiB"):
        _config(segment_bytes=MIB)


def test_finds_the_wheel_binary():
    path = find_client_binary()
    assert os.access(path, os.X_OK) and Path(path).name == "mooncake_client"


def _fake_client(tmp_path: Path, body: str) -> str:
    fake = tmp_path / "fake-client"
    fake.write_text(f"#!{sys.executable}\nimport sys, time\n{body}\n")
    fake.chmod(0o755)
    return str(fake)


def test_restarts_with_growing_backoff_and_stops(tmp_path):
    binary = _fake_client(tmp_path, "print('up', sys.argv[1:], flush=True); sys.exit(3)")
    supervisor = SegmentSupervisor(_config(), binary=binary, log_path=tmp_path / "client.log",
                                   backoff_initial=0.1, backoff_max=0.4, poll_interval=0.02)
    started = time.monotonic()
    supervisor.start()
    _wait(lambda: supervisor.restarts >= 4, 10, "four restarts")
    # waits 0.1 + 0.2 + 0.4 + 0.4 s at least
    assert time.monotonic() - started >= 1.0
    assert supervisor.last_exit == 3
    supervisor.stop()
    restarts = supervisor.restarts
    time.sleep(0.5)
    assert supervisor.restarts == restarts and not supervisor.supervising and not supervisor.running
    assert "--global_segment_size=33554432" in (tmp_path / "client.log").read_text()


def test_stop_kills_a_client_that_ignores_sigterm(tmp_path):
    binary = _fake_client(tmp_path, "import signal; signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                                    "print('Starting real client service on x', flush=True)\ntime.sleep(60)")
    supervisor = SegmentSupervisor(_config(), binary=binary, log_path=tmp_path / "client.log").start()
    supervisor.wait_ready(10)
    pid = supervisor.pid
    started = time.monotonic()
    supervisor.stop(grace=0.5)
    assert time.monotonic() - started < 5 and supervisor.last_exit == -signal.SIGKILL
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_wait_ready_reports_the_log(tmp_path):
    binary = _fake_client(tmp_path, "print('E1201 something broke', flush=True); time.sleep(60)")
    supervisor = SegmentSupervisor(_config(), binary=binary, log_path=tmp_path / "client.log").start()
    try:
        with pytest.raises(SegmentError, match="something broke"):
            supervisor.wait_ready(0.5)
    finally:
        supervisor.stop(grace=1)


def _capacity(master) -> float:
    return master.metrics().get("master_total_capacity_bytes", 0.0)


def _segments(master) -> list[str]:
    with urllib.request.urlopen(f"{master.admin_url}/get_all_segments", timeout=5) as resp:
        return resp.read().decode().split()


@pytest.mark.integration
def test_mounts_a_segment_and_comes_back_after_sigkill(mooncake_master_factory, tmp_path):
    from agent.sim.master import free_ports

    master = mooncake_master_factory({"acme": 1 << 30, "other": 1 << 30}, client_ttl=2)
    assert _capacity(master) == 0
    (port,) = free_ports(1)
    config = SegmentConfig(master_server_address=master.rpc_address, metadata_server=master.metadata_server,
                           segment_bytes=64 * MIB, port=port)
    supervisor = SegmentSupervisor(config, log_path=tmp_path / "client.log", backoff_initial=0.2)
    try:
        supervisor.start()
        supervisor.wait_ready(30)
        _wait(lambda: _capacity(master) == 64 * MIB, 15, "the master to count the mounted segment")
        first = _segments(master)
        assert len(first) == 1, first
        # a client with no segment of its own (as a standalone-store engine) can store into it: the object
        # lands in the node's segment and is charged to the writer's tenant
        _put_one(master, "acme")
        assert master.tenant_quota("acme")["charged_bytes"] > 0

        old_pid = supervisor.pid
        os.kill(old_pid, signal.SIGKILL)
        _wait(lambda: supervisor.restarts == 1 and supervisor.running, 15, "the restart")
        assert supervisor.pid != old_pid and supervisor.last_exit == -signal.SIGKILL
        supervisor.wait_ready(30)
        # the dead client's segment leaves after client_ttl; the new one stays
        _wait(lambda: _capacity(master) == 64 * MIB and _segments(master) != first, 30,
              "only the restarted client's segment")
    finally:
        supervisor.stop()
    assert not supervisor.running
    _wait(lambda: _capacity(master) == 0, 30, "the segment to leave after stop")


def _put_one(master, tenant: str) -> None:
    """Store one 64 KiB object as ``tenant`` through a client that mounts nothing (in a child: the Mooncake client
    keeps threads and its transfer engine until the process ends)."""
    import subprocess

    code = (
        "import json, sys\n"
        "from mooncake.store import MooncakeDistributedStore\n"
        "a = json.loads(sys.argv[1]); s = MooncakeDistributedStore()\n"
        "rc = s.setup('127.0.0.1', a['meta'], 0, 16 << 20, 'tcp', '', a['rpc'], tenant_id=a['tenant'])\n"
        "assert rc == 0, rc\n"
        "assert s.put('segment-test-key', b'x' * 65536) == 0\n"
        "assert s.is_exist('segment-test-key') == 1\n"
        "print('ok')\n")
    arg = json.dumps({"meta": master.metadata_server, "rpc": master.rpc_address, "tenant": tenant})
    out = subprocess.run([sys.executable, "-c", code, arg], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-2000:]


def test_supervisor_for_follows_the_document(tmp_path):
    binary = _fake_client(tmp_path, "print('Starting real client service on x', flush=True); time.sleep(60)")
    assert supervisor_for(None, None) is None
    current = supervisor_for(_config(), None, binary=binary, log_path=tmp_path / "c.log")
    try:
        current.wait_ready(10)
        pid = current.pid
        assert supervisor_for(_config(), current) is current and current.pid == pid  # unchanged: kept
        assert supervisor_for(_config(segment_bytes=64 * MIB), current) is current
        current.wait_ready(10)
        assert current.pid != pid and current.config.segment_bytes == 64 * MIB
    finally:
        assert supervisor_for(None, current) is None
    assert not current.running
