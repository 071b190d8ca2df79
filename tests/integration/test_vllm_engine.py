"""A real vLLM engine writes through the control plane, observed by the real node agent: registry -> pushed config
document (schema 2: launch spec, node settings) -> ``Daemon`` + ``NodeEngines`` in-process (instance directory,
supervised ``mooncake_client`` of the standalone-store node, KV-event socket on the node's port) -> vLLM (CPU build
0.32.0) + MooncakeStoreConnector started from the directory the agent wrote -> a multi-tenant mooncake_master.

Checks that the Store holds exactly the keys the agent's hashing and key grammar predict for the prompts sent (one
of them salted by a request group), charged to the tenant; that the agent attributes every one of them (0 unknown,
0 hash mismatches; the salted prompt in its request group) and books them once the Store confirms them (all at the
first check: vLLM publishes a Store event after its put returned), that its ledger equals the Store per scope after a
reconcile (also after an object disappears behind its back), that its report carries the instance's facts, that a
budget below the occupancy brings the release under it with no orphan, that a purge of the release removes
every one of its keys and the ledger forgets them, and that ``demo.engine.EngineInstance.stop`` after the API server
was killed (SIGKILL) ends the EngineCore and worker it left running.

Needs the engine environment: ``scripts/engine_env.sh`` runs here (installs it the first time, about a minute
and 3.6 GB; the test is skipped, with the script's output as reason, only when that install fails) and the tiny
model is built once. About a minute once the environment exists (the engine is ready in 30-50 s on 2 cores).
"""
from __future__ import annotations

import os
import signal
from datetime import UTC, datetime
from pathlib import Path

import pytest

from agent.contract import keys, signing
from agent.contract.messages import PurgeRequest, Report, signed_request
from agent.contract.scope import ENGINE_LOOKUPS, NO_REQUEST_GROUP, CacheScope
from agent.datapath.hashing import VllmBlockHasher
from agent.datapath.ledger import Ledger
from agent.node.daemon import Daemon
from agent.node.engines import NodeEngines
from agent.node.instance_dirs import read_launch
from agent.node.purge import daemon_store_opener, handle_purge
from agent.sim.master import free_ports
from demo.procs import session_members
from tests.support.factories import make_assignment, make_group, make_model, make_node, make_release, make_tenant
from tests.support.waiting import wait_for as _wait

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


def _prompts() -> dict[str, tuple[list[int], str | None]]:
    from demo.engine import random_prompt

    a = random_prompt(150, seed=1)
    b = a[:96] + random_prompt(64, seed=2)
    return {"a": (a, None), "b": (b, None), "c": (a, SALT)}


def _present(ledger: Ledger, scope: CacheScope | None = None) -> set[str]:
    tables = [ledger.table(scope)] if scope is not None else ledger.tables()
    return {key for table in tables for key in ledger.present_keys(table.scope)}


@pytest.mark.django_db
def test_engine_writes_are_observed_by_the_agent(engine_python, mooncake_master_factory, tmp_path, settings):
    from dashboard.rollout.push import ensure_version
    from demo.engine import TINY_MODEL, start_instance
    from tenants.services import validated_save

    # the registry: a tenant with a quota, the tiny model, a release with a hash seed, the shared request group and
    # a salted one, a CPU node in standalone-store mode, one instance
    api_port, events_port, client_port = free_ports(3)
    tenant = make_tenant("acme", quota="1GB")
    model = make_model(tenant, "tiny", model_path=str(TINY_MODEL))
    release = make_release(model, NAMESPACE, num_layers=2, num_kv_heads=2, head_dim=32, block_size=BLOCK,
                           engine_version="0.32.0", hash_seed=SEED)
    make_group(tenant, "shared", cache_salt="")  # the default shared cache: requests without a salt
    make_group(tenant, "app-b", cache_salt=SALT)
    node = make_node("cpu-a", hostname="127.0.0.1", device="cpu", kv_events_port=events_port,
                     store_mode="standalone-store", store_segment_bytes=128 << 20, store_client_port=client_port,
                     model_roots=[str(TINY_MODEL.parent)])
    assignment = make_assignment(node, release, port=api_port)

    # the master with the registry's tenants and quotas; the dashboard renders for it. Reads lease objects for 1 s
    # (the demo's --default_kv_lease_ttl; Mooncake's default is 10 s): the budget step below waits for the leases
    # the checks before it took to end, and a shorter lease is all that changes
    master = mooncake_master_factory({tenant.tenant_id: tenant.quota_bytes}, default_kv_lease_ttl=1000)
    settings.KVPOOL_MASTER_ADDRESS = master.rpc_address
    settings.KVPOOL_METADATA_SERVER = master.metadata_server
    settings.KVPOOL_GLOBAL_SEGMENT_SIZE = 256 << 20
    settings.KVPOOL_LOCAL_BUFFER_SIZE = 64 << 20

    # the node's agent, in-process: the daemon applies the signed document, NodeEngines does the node's side
    ledger = Ledger()
    engines = NodeEngines(node.name, ledger, tmp_path / "instances", state_dir=tmp_path, interval=0,
                          metrics_interval=0, is_privileged=False)  # the engine runs as this test's own user
    published: list[list[dict]] = []
    daemon = Daemon(node.name, node.signing_secret, tmp_path / "state", publish=published.append, ledger=ledger,
                    on_apply=[engines.on_apply], report_fields=engines.report_fields)

    def push() -> dict:
        from agent.contract.sealing import seal

        document = ensure_version(node).version.document
        delivery = signing.signed({**document, "sent_at": signing.timestamp(datetime.now(UTC))}, node.signing_secret)
        ack = daemon.handle_document(seal(delivery, node.signing_secret, node=node.name))  # as send_many sends it
        assert ack["status"] == "applied", ack
        return document

    engine = probe = None
    try:
        document = push()
        assert document["schema"] == 2 and document["node_settings"]["kv_events_port"] == events_port
        directory = tmp_path / "instances" / str(assignment.pk)
        assert read_launch(directory)["env"]["MOONCAKE_CONFIG_PATH"] == str(directory / "mooncake.json")
        assert engines.observer.running and engines.segment is not None
        engines.segment.wait_ready(30)
        engine = start_instance(directory, log_path=tmp_path / "vllm.log", engine_python=engine_python,
                                timeout=300)
        engines.observer.scrape_metrics_now()  # the engine's counters before any request: the baseline
        # the engine serves while nobody observes its events (an agent restarting, or started after its engines):
        # a ZMQ subscriber gets nothing published before it joined; the agent catches up through vLLM's replay socket
        engines.observer.stop()
        prompts = _prompts()
        for name, (tokens, salt) in prompts.items():
            response = engine.complete(tokens, max_tokens=4, cache_salt=salt)
            assert response["usage"]["prompt_tokens"] == len(tokens), (name, response)
        engines.observer.start()
        _wait(lambda: engines.observer.status(str(assignment.pk))[0] == "connected", 60,
              "the agent connected to the engine's event socket")

        # what the agent predicts: vLLM block hashes (sha256, the release's seed, the group's salt on block 0)
        # and the MooncakeStoreConnector key grammar with the release namespace as cache_prefix
        predicted: dict[str, list[str]] = {"": [], "app-b": []}
        for tokens, salt in prompts.values():
            hasher = VllmBlockHasher("sha256", block_size=BLOCK, seed=SEED, cache_salt=salt)
            predicted["app-b" if salt else ""] += [keys.vllm_key("tiny-llama", digest, cache_prefix=NAMESPACE)
                                                   for digest in hasher.block_hashes(tokens)]
        every = list(dict.fromkeys(predicted[""] + predicted["app-b"]))
        assert len(every) == 4 + 2 + 4  # a: 4 blocks, b: 3 shared + 2 own, c: 4 salted
        unseeded = VllmBlockHasher("sha256", block_size=BLOCK, seed=None).block_hashes(prompts["a"][0])
        wrong = [keys.vllm_key("tiny-llama", digest, cache_prefix=NAMESPACE) for digest in unseeded]

        # the engine's Store events are hints: the agent books them once the Store holds their keys in the tenant.
        # vLLM publishes BlockStored after its put returned, so the first check already finds every key
        att = engines.observer.attributor(str(assignment.pk))
        _wait(lambda: att.snapshot()["blocks_seen"] >= len(every), 30, "the engine's Store events at the agent")
        assert _present(ledger) == set()
        assert engines.confirm_writes() == {"confirmed": len(every), "unconfirmed": 0, "waiting": 0}

        from agent.datapath.store import open_store

        probe = open_store(master.endpoints(global_segment_size=0, local_buffer_size=16 << 20), tenant.tenant_id)
        _wait(lambda: probe.exists(every) == [1] * len(every), 30, "every predicted key in the Store")
        assert probe.exists(wrong) == [0] * len(wrong)
        metrics = master.metrics()
        assert metrics["master_key_count"] == len(every)  # nothing else was stored
        assert master.tenant_quota(tenant.tenant_id)["charged_bytes"] == len(every) * OBJECT_BYTES
        assert metrics["master_total_capacity_bytes"] == 128 << 20  # only the node's client mounted memory

        # the agent attributed every Store key: 0 unknown, 0 hash mismatches, the salted prompt in its group
        engines.observer.scrape_metrics_now()
        (stats,) = engines.instance_stats()
        assert (stats.blocks_seen, stats.attributed, stats.unknown_salt, stats.hash_mismatch) == (10, 10, 0, 0)
        # the engine bound its own ipc socket in its instance directory, and only that socket was read
        assert (stats.events_status, stats.events_endpoint, stats.topic_mismatch) == ("connected",
                                                                                     "ipc://kv-events.sock", 0)
        assert (directory / "kv-events.sock").is_socket() and (directory / "kv-events-replay.sock").is_socket()
        caught_up = engines.observer.snapshot()["instances"][str(assignment.pk)]
        assert caught_up["replayed"] > 0 and caught_up["replay_timeouts"] == 0  # every event came from the replay
        assert (stats.seq_gaps, stats.decode_errors, stats.unresolved_parent) == (0, 0, 0)
        assert (stats.confirmed, stats.unconfirmed, stats.pending, stats.unknown_namespace_keys) == (10, 0, 0, {})
        assert stats.attributed_by_group == {"shared": 6, "app-b": 4}
        scope = CacheScope(tenant.tenant_id, "tiny", NAMESPACE, NO_REQUEST_GROUP)  # the release's row without a group
        assert _present(ledger) == set(every)
        assert _present(ledger, scope._replace(request_group="app-b")) == set(predicted["app-b"])
        assert stats.prefix_cache_queries > 0 and stats.store_keys.get("save_put") == len(every)

        # the ledger equals the Store per scope after a reconcile, also when an object goes behind its back
        assert engines.reconcile_now() == {"checked": len(every), "missing": 0, "removed": 0, "orphans_removed": 0}
        leaf = keys.vllm_key("tiny-llama", VllmBlockHasher("sha256", block_size=BLOCK, seed=SEED, cache_salt=SALT)
                             .block_hashes(prompts["c"][0])[-1], cache_prefix=NAMESPACE)
        assert probe.remove([leaf]) == [0]  # gone behind the agent's back, as the master's eviction does
        assert engines.reconcile_now()["missing"] == 1
        for table in ledger.tables():
            held = sorted(ledger.present_keys(table.scope))
            assert probe.exists(held) == [1] * len(held)
        assert len(_present(ledger)) == master.metrics()["master_key_count"] == len(every) - 1

        # the report carries the instance's facts and the engine's lookups in the release's row of engine lookups
        daemon.report_now()
        daemon.flush()
        report = Report.model_validate([m for batch in published for m in batch if m["kind"] == "report"][-1])
        assert report.instances[0].attributed == 10 and report.unknown_topic_blocks == 0
        rows = {row.scope: row for row in report.scopes}
        assert sum(row.blocks for row in rows.values()) == len(every) - 1
        assert stats.external_prefix_cache_queries > 0  # the connector looked every uncached prompt up
        expected = (stats.external_prefix_cache_hits // BLOCK,
                    (stats.external_prefix_cache_queries - stats.external_prefix_cache_hits) // BLOCK)
        lookups = rows[scope._replace(request_group=ENGINE_LOOKUPS)]
        assert (lookups.hit_blocks, lookups.miss_blocks, lookups.bytes) == (*expected, 0)

        # a budget below the occupancy: the release goes under it, leaves only, no orphan. The reconciles and the
        # probe's checks above leased every object (Mooncake 0.3.13.post1: batch_is_exist takes a read lease for
        # --default_kv_lease_ttl, 1 s here): removals without force wait for the leases to end, tick after tick
        release.budget_bytes = 5 * OBJECT_BYTES
        validated_save(release)
        push()
        removed = 0

        def under_budget() -> bool:
            nonlocal removed
            removed += engines.tick()["removed"]
            # at most the budget: an enforcement round aims at 90 % of it, but a block still under a read
            # lease stays, and a release at (not over) its budget is left alone
            return len(_present(ledger)) * OBJECT_BYTES <= 5 * OBJECT_BYTES

        _wait(under_budget, 30, "the release under its budget")
        held = _present(ledger)
        assert removed == len(every) - 1 - len(held) and 0 < len(held) <= 5
        assert all(row["orphaned_bytes"] == 0 for row in ledger.snapshot())
        assert probe.exists(sorted(held)) == [1] * len(held)
        assert master.metrics()["master_key_count"] == len(held)

        # a purge of the release removes exactly its keys in its tenant, and the ledger forgets them
        request = PurgeRequest(purge_id="p1", node=node.name, tenant_id=tenant.tenant_id, engine="vllm",
                               namespace=NAMESPACE, model="tiny-llama", served_model_name="tiny",
                               issued_at=signing.timestamp(datetime.now(UTC)))
        result = handle_purge(signed_request(request, node.signing_secret), node=node.name,
                              secret=node.signing_secret, open_store=daemon_store_opener(daemon), ledger=ledger)
        assert result["error"] == "" and result["removed"] == len(held)
        assert probe.exists(every) == [0] * len(every) and master.metrics()["master_key_count"] == 0
        assert _present(ledger) == set()

        # an API server killed with SIGKILL leaves its EngineCore and worker running (vLLM 0.32 CPU: about 2.3 GiB);
        # EngineInstance.stop ends them and returns once they are gone (the systemd unit does the same with the
        # instance's cgroup)
        sid = engine.pid
        assert len(session_members(sid)) >= 3  # the API server, its EngineCore and a worker (and helpers)
        os.kill(engine.pid, signal.SIGKILL)
        _wait(lambda: not engine.alive, 60, "the API server to die")
        assert session_members(sid), "the EngineCore left with the API server: nothing to clean up"
        engine.stop()
        assert session_members(sid) == [] and engine.leftover == []
    finally:
        if probe is not None:
            probe.close()
        if engine is not None:
            engine.stop()
            for pid in session_members(engine.pid):
                os.kill(pid, signal.SIGKILL)
        daemon.stop()
        engines.close()
    assert not engine.alive and engines.segment is None
