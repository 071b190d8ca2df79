"""Unit tests of the engine harness (demo.engine) that need no engine: trace prompts, metrics parsing, the
registry -> instance directory path, and the error naming the log of an instance that dies."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from demo import engine
from demo.engine import (
    EngineError,
    EngineInstance,
    block_tokens_for,
    metric_sum,
    parse_metrics,
    trace_prompts,
)


def _trace(tmp_path: Path, rows: list[dict]) -> Path:
    path = tmp_path / "trace.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def test_trace_prompts_share_prefixes_block_by_block(tmp_path):
    path = _trace(tmp_path, [
        {"timestamp": 0, "input_length": 1024, "output_length": 5, "hash_ids": [0, 1]},
        {"timestamp": 1, "input_length": 1300, "output_length": 5, "hash_ids": [0, 1, 2]},
        {"timestamp": 2, "input_length": 100, "output_length": 5, "hash_ids": [3]},
    ])
    a, b, c = trace_prompts(path, block_tokens=32, max_tokens=16)
    assert len(a) == 64 and a == list(block_tokens_for(0)) + list(block_tokens_for(1))
    # 1300 = 2 full trace blocks + 276 tokens: the last block keeps ceil(276 * 32 / 512) = 18 tokens
    assert b[:64] == a and len(b) == 64 + 18
    assert len(c) == 7  # ceil(100 * 32 / 512)
    assert all(0 <= t < 1020 for t in a + b + c)
    assert trace_prompts(path, block_tokens=32, max_tokens=16) == [a, b, c]  # deterministic
    assert trace_prompts(path, limit=1) == [a]


def test_trace_prompts_fit_the_model_length():
    prompts = trace_prompts(block_tokens=32, max_tokens=24, limit=300)
    assert len(prompts) == 300 and max(map(len, prompts)) == 1024 - 24
    first, second = prompts[0], prompts[1]  # both start with hash id 0 in the FAST'25 trace
    assert first[:32] == second[:32] and first[32:64] != second[32:64]


def test_metrics_parsing():
    text = ('# HELP x\nvllm:external_prefix_cache_hits_total{engine="0",model_name="tiny"} 896.0\n'
            'vllm:external_prefix_cache_hits_total{engine="1",model_name="tiny"} 4.0\n'
            'vllm:external_prefix_cache_hits_created{engine="0"} 1.7e9\nbad line\n')
    metrics = parse_metrics(text)
    assert metric_sum(metrics, "vllm:external_prefix_cache_hits_total") == 900.0


@pytest.mark.django_db
def test_registry_to_instance_directory(tmp_path):
    from agent.node.instance_dirs import read_launch, write_instance_dirs

    deployment = engine.register_tiny_release(ports=[8101, 8102], kv_events_port=6100, store_mode="standalone-store",
                                              store_segment_bytes=64 << 20, store_client_port=50110, hash_seed="7",
                                              request_groups={"app-a": "salt-a"})
    target = engine.render_target(master_server_address="127.0.0.1:50051",
                                  metadata_server="http://127.0.0.1:8080/metadata", config_dir=tmp_path)
    launches = engine.render_launches(deployment.assignments, target)
    paths = write_instance_dirs(tmp_path, launches)
    assert [p.name for p in paths] == [str(a.pk) for a in deployment.assignments]
    launch = read_launch(paths[0])
    argv = launch["argv"]
    assert argv[:5] == ["python", "-m", "vllm.entrypoints.openai.api_server", "--model", str(engine.TINY_MODEL)]
    assert argv[argv.index("--port") + 1] == "8101" and "--enforce-eager" in argv
    assert json.loads(argv[argv.index("--kv-events-config") + 1])["topic"] == str(deployment.assignments[0].pk)
    assert launch["env"]["PYTHONHASHSEED"] == "7" and launch["env"]["HF_HUB_OFFLINE"] == "1"
    mooncake = json.loads((paths[0] / "mooncake.json").read_text())
    assert mooncake["mode"] == "standalone-store" and mooncake["global_segment_size"] == 0
    assert mooncake["tenant_id"] == "acme"
    instance = EngineInstance(paths[1])
    assert (instance.port, instance.served_model_name, instance.base_url) == (8102, "tiny", "http://127.0.0.1:8102")


def test_an_instance_that_dies_names_its_log(tmp_path):
    from agent.node.instance_dirs import write_instance_dirs

    (directory,) = write_instance_dirs(tmp_path / "instances", [{
        "instance_id": "9", "argv": ["python", "-c", "import sys; print('engine exploded'); sys.exit(3)"],
        "env": {}, "files": {}}])
    with pytest.raises(EngineError, match=r"(?s)exited with status 3 .*engine exploded") as info:
        engine.start_instance(directory, log_path=tmp_path / "vllm.log", engine_python=Path(sys.executable),
                              timeout=20)
    assert str(tmp_path / "vllm.log") in str(info.value)


def test_missing_engine_interpreter_is_explained(tmp_path):
    from agent.node.instance_dirs import write_instance_dirs

    (directory,) = write_instance_dirs(tmp_path, [{"instance_id": "1", "argv": ["python", "-V"]}])
    with pytest.raises(EngineError, match="engine_env.sh"):
        EngineInstance(directory, engine_python=tmp_path / "nope").start()


#: A fake API server: forks one child that stays in its process group and one that makes its own (``os.setpgrp``,
#: as vLLM 0.32's DP supervisor does for its API servers), both ignoring SIGTERM like a busy EngineCore; it writes
#: their pids to ``children`` and leaves on SIGTERM without stopping them (as a killed API server does).
FORKING_ENGINE = """
import os, signal, time
kids = []
for own_group in (False, True):
    pid = os.fork()
    if pid == 0:
        if own_group:
            os.setpgrp()
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        while True:
            time.sleep(1)
    kids.append(pid)
with open("children.tmp", "w") as f:
    f.write(" ".join(map(str, kids)))
os.rename("children.tmp", "children")
signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
while True:
    time.sleep(1)
"""


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie does not: it holds no memory)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            return handle.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except OSError:
        return False


@pytest.mark.skipif(not Path("/proc/self/stat").is_file(), reason="needs Linux /proc")
@pytest.mark.parametrize("server_killed", [False, True], ids=["stopped", "api-server-killed-first"])
def test_stop_ends_the_whole_process_tree(tmp_path, server_killed):
    """stop() leaves no process of the instance behind: neither one that ignores SIGTERM in the server's group nor
    one that moved to its own group; also when the API server was SIGKILLed first (what left a real vLLM's
    EngineCore and workers running)."""
    import os
    import signal

    from agent.node.instance_dirs import write_instance_dirs
    from tests.support.waiting import wait_for

    (directory,) = write_instance_dirs(tmp_path / "instances", [{
        "instance_id": "4", "argv": ["python", "-c", FORKING_ENGINE], "env": {}, "files": {}}])
    instance = EngineInstance(directory, log_path=tmp_path / "vllm.log", engine_python=Path(sys.executable)).start()
    children_file = directory / "children"
    kids = [int(pid) for pid in wait_for(lambda: children_file.is_file() and children_file.read_text().split(),
                                         timeout=30, what="the fake engine's children")]
    try:
        assert all(_alive(pid) for pid in kids)
        if server_killed:
            os.kill(instance.pid, signal.SIGKILL)
            wait_for(lambda: not instance.alive, what="the API server to die")
            assert all(_alive(pid) for pid in kids)  # orphans: what the launcher has to clean up
        instance.stop(grace=5, settle=0.5)
        assert [pid for pid in kids if _alive(pid)] == []
        assert instance.leftover == []
    finally:
        for pid in kids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
