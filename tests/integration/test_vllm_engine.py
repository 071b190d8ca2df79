"""A real vLLM engine writes through the control plane: registry -> rendered launch -> instance directory ->
vLLM (CPU build 0.32.0) + MooncakeStoreConnector -> a multi-tenant mooncake_master, with the node's segment
owned by a supervised mooncake_client (standalone-store).

Checks that the Store holds exactly the keys the agent's hashing and key grammar predict for the prompts sent
(one of them salted by a request group), charged to the tenant, and that the engine's KV events reach the node's
socket under the instance id as topic.

Needs the engine environment: ``scripts/engine_env.sh`` runs here (installs it the first time, about a minute
and 3.6 GB; the test is skipped, with the script's output as reason, only when that install fails) and the tiny
model is built once. About a minute once the environment exists (the engine is ready in 30-50 s on 2 cores).
"""
from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from agent.contract import keys
from agent.datapath.hashing import VllmBlockHasher
from agent.node.instance_dirs import read_launch, write_instance_dirs
from agent.node.segment import SegmentConfig, SegmentSupervisor
from agent.sim.master import free_ports
from tests.registry.factories import make_assignment, make_group, make_model, make_node, make_release, make_tenant

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

BLOCK = 32
NAMESPACE = "tiny-2026-12"
SEED = "4242"
SALT = "groupB-salt"
OBJECT_BYTES = 16 << 10  # 2 layers x (K, V) x 32 tokens x 2 KV heads x 32 dims x bf16


@pytest.fixture(scope="module")
def engine_python() -> Path:
    from demo.engine import EngineError, ensure_engine_env, ensure_tiny_model

    try:
        python = ensure_engine_env(echo=lambda line: print(line, flush=True))
    except EngineError as exc:
        pytest.skip(f"the vLLM engine environment could not be installed: {exc}")
    ensure_tiny_model(python=python)
    return python


class Subscriber(threading.Thread):
    """The node agent's side of KV events: one bound SUB socket; keeps (topic, payload) of every message."""

    def __init__(self, port: int) -> None:
        import zmq

        super().__init__(daemon=True)
        self.context = zmq.Context()
        self.socket = self.context.socket(zmq.SUB)
        self.socket.setsockopt(zmq.SUBSCRIBE, b"")
        self.socket.bind(f"tcp://127.0.0.1:{port}")
        self.messages: list[list[bytes]] = []
        self.stopping = False

    def run(self) -> None:
        while not self.stopping:
            if self.socket.poll(100):
                self.messages.append(self.socket.recv_multipart())

    def close(self) -> None:
        self.stopping = True
        self.join(2)
        self.socket.close(0)
        self.context.term()


def _prompts() -> dict[str, tuple[list[int], str | None]]:
    from demo.engine import random_prompt

    a = random_prompt(150, seed=1)
    b = a[:96] + random_prompt(64, seed=2)
    return {"a": (a, None), "b": (b, None), "c": (a, SALT)}


def _wait(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.25)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


@pytest.mark.django_db
def test_engine_stores_the_predicted_keys(engine_python, mooncake_master_factory, tmp_path):
    from demo.engine import TINY_MODEL, start_instance
    from tenants.rendering import RenderTarget, render_assignment, render_store_client

    # the registry: a tenant with a quota, the tiny model, a release with a hash seed, a salted request group,
    # a CPU node in standalone-store mode, one instance
    api_port, events_port, client_port = free_ports(3)
    tenant = make_tenant("acme", quota="1GB")
    model = make_model(tenant, "tiny", model_path=str(TINY_MODEL))
    release = make_release(model, NAMESPACE, num_layers=2, num_kv_heads=2, head_dim=32, block_size=BLOCK,
                           engine_version="0.32.0", hash_seed=SEED)
    make_group(tenant, "app-b", cache_salt=SALT)
    node = make_node("cpu-a", hostname="127.0.0.1", device="cpu", kv_events_port=events_port,
                     store_mode="standalone-store", store_segment_bytes=128 << 20, store_client_port=client_port)
    assignment = make_assignment(node, release, port=api_port)

    # the master with the registry's tenants and quotas
    master = mooncake_master_factory({tenant.tenant_id: tenant.quota_bytes})
    endpoints = RenderTarget(master_server_address=master.rpc_address, metadata_server=master.metadata_server,
                             global_segment_size=256 << 20, local_buffer_size=64 << 20,
                             config_dir=str(tmp_path / "instances"))
    launch = render_assignment(assignment, endpoints).launch_spec()
    (directory,) = write_instance_dirs(tmp_path / "instances", [launch])
    assert read_launch(directory)["env"]["MOONCAKE_CONFIG_PATH"] == str(directory / "mooncake.json")

    segment = SegmentSupervisor(SegmentConfig.from_argv(render_store_client(node, endpoints).argv),
                                log_path=tmp_path / "mooncake_client.log")
    subscriber = Subscriber(events_port)
    subscriber.start()
    engine = probe = None
    try:
        segment.start()
        segment.wait_ready(30)
        engine = start_instance(directory, log_path=tmp_path / "vllm.log", engine_python=engine_python,
                                timeout=300)
        prompts = _prompts()
        for name, (tokens, salt) in prompts.items():
            response = engine.complete(tokens, max_tokens=4, cache_salt=salt)
            assert response["usage"]["prompt_tokens"] == len(tokens), (name, response)

        # what the agent predicts: vLLM block hashes (sha256, the release's seed, the group's salt on block 0)
        # and the MooncakeStoreConnector key grammar with the release namespace as cache_prefix
        predicted: list[str] = []
        for tokens, salt in prompts.values():
            hasher = VllmBlockHasher("sha256", block_size=BLOCK, seed=SEED, cache_salt=salt)
            predicted += [keys.vllm_key("tiny-llama", digest, cache_prefix=NAMESPACE)
                          for digest in hasher.block_hashes(tokens)]
        predicted = list(dict.fromkeys(predicted))
        assert len(predicted) == 4 + 2 + 4  # a: 4 blocks, b: 3 shared + 2 own, c: 4 salted
        unseeded = VllmBlockHasher("sha256", block_size=BLOCK, seed=None).block_hashes(prompts["a"][0])
        wrong = [keys.vllm_key("tiny-llama", digest, cache_prefix=NAMESPACE) for digest in unseeded]

        probe_endpoints = master.endpoints(global_segment_size=0, local_buffer_size=16 << 20)
        from agent.datapath.store import open_store

        probe = open_store(probe_endpoints, tenant.tenant_id)
        _wait(lambda: probe.exists(predicted) == [1] * len(predicted), 30, "every predicted key in the Store")
        assert probe.exists(wrong) == [0] * len(wrong)
        metrics = master.metrics()
        assert metrics["master_key_count"] == len(predicted)  # nothing else was stored
        assert master.tenant_quota(tenant.tenant_id)["charged_bytes"] == len(predicted) * OBJECT_BYTES
        assert metrics["master_total_capacity_bytes"] == 128 << 20  # only the node's client mounted memory

        # KV events reach the node's one socket, under the instance id as topic
        _wait(lambda: subscriber.messages, 20, "KV events on the node's socket")
        topics = {message[0] for message in subscriber.messages}
        assert topics == {launch.instance_id.encode()}
    finally:
        if probe is not None:
            probe.close()
        if engine is not None:
            engine.stop()
        segment.stop()
        subscriber.close()
    assert not engine.alive and not segment.running
