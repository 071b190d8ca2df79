"""A real vLLM API server killed with SIGKILL leaves its EngineCore and worker running (vLLM 0.32 CPU, tiny model:
3 processes, about 2.3 GiB); ``demo.engine.EngineInstance.stop`` ends them and returns once they are gone
(deploy/systemd/kvpool-engine@.service does the same with the instance's cgroup)."""
from __future__ import annotations

import os
import signal

import pytest

from agent.node.instance_dirs import write_instance_dirs
from agent.sim.master import free_ports
from demo.procs import session_members
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]


def test_stop_after_the_api_server_was_killed_leaves_no_process(engine_python, tmp_path):
    from demo.engine import TINY_MODEL, start_instance

    (port,) = free_ports(1)
    (directory,) = write_instance_dirs(tmp_path / "instances", [{"instance_id": "1", "argv": [
        "python", "-m", "vllm.entrypoints.openai.api_server", "--model", str(TINY_MODEL), "--served-model-name",
        "tiny", "--host", "127.0.0.1", "--port", str(port), "--enforce-eager", "--max-model-len", "512"],
        "env": {"VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1", "VLLM_HOST_IP": "127.0.0.1"}}])
    engine = start_instance(directory, log_path=tmp_path / "vllm.log", engine_python=engine_python, timeout=400)
    sid = engine.pid
    try:
        assert len(session_members(sid)) >= 3  # the API server, its EngineCore and a worker (and helpers)
        os.kill(engine.pid, signal.SIGKILL)
        wait_for(lambda: not engine.alive, what="the API server to die")
        orphans = session_members(sid)
        assert orphans, "the EngineCore left with the API server: nothing to clean up"
        engine.stop()
        assert session_members(sid) == [] and engine.leftover == []
    finally:
        for pid in session_members(sid):
            os.kill(pid, signal.SIGKILL)
