"""``agent.node.engines.NodeEngines`` and the daemon wired to it: instance directories written on apply, one SUB
socket per instance connected to the socket its engine binds in its directory (real ZMQ, recorded vLLM 0.32.0
frames replayed by a PUB bound at ``<instance dir>/kv-events.sock`` as an engine binds it), attribution into the
ledger, per-instance facts in the report, engine hits in the scope rows,
reconcile and budgets against an in-memory Store (the real Store path: tests/integration/test_vllm_engine.py)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
import zmq

from agent.contract import signing
from agent.contract.messages import (
    ConfigDocument,
    InstanceSpec,
    LaunchSpec,
    NodeSettings,
    Report,
    StoreEndpoints,
)
from agent.contract.scope import ENGINE_LOOKUPS, CacheScope
from agent.datapath.ledger import Ledger
from agent.node.daemon import Daemon
from agent.node.engines import NodeEngines
from agent.node.instance_dirs import read_launch
from agent.sim.master import free_ports
from tests.support.captures import frames, instance, meta, retopic, store_blocks
from tests.support.engines import Publisher, bind_publisher, events_flag, send_when_joined
from tests.support.fakes import FakeStore
from tests.support.waiting import wait_for

RUN = "embedded-int"
SECRET = "s3cret"


def launch(instance_id: str, **kwargs) -> LaunchSpec:
    return LaunchSpec(instance_id=instance_id, argv=("python", "-m", "vllm.entrypoints.openai.api_server",
                                                     *events_flag(instance_id)), **kwargs,
                      env={"VLLM_HOST_IP": "127.0.0.1"}, file_env={"MOONCAKE_CONFIG_PATH": "mooncake.json"},
                      files={"mooncake.json": "{}\n"})


def spec(instance_id: str = "7", *, run: str = RUN, budget: int | None = None, **kwargs) -> InstanceSpec:
    base = instance(run, instance_id=instance_id, **kwargs)
    return base.model_copy(update={"launch": launch(instance_id), "node_budget_bytes": budget})


def document(instances: list[InstanceSpec], port: int, *, version: int = 1, node: str = "node-a",
             settings: NodeSettings | None = ...) -> ConfigDocument:  # type: ignore[assignment]
    return ConfigDocument(
        node=node, version=version, issued_at="2026-12-01T12:00:00.000000Z",
        store=StoreEndpoints(master_server_address="127.0.0.1:50051", metadata_server="http://127.0.0.1:8080/metadata",
                             global_segment_size=1 << 30, local_buffer_size=1 << 28),
        instances=instances,
        node_settings=NodeSettings(kv_events_port=port) if settings is ... else settings)


class Stores:
    """Opens one FakeStore per tenant (and remembers every opening and every remove's ``force``)."""

    def __init__(self) -> None:
        self.by_tenant: dict[str, FakeStore] = {}
        self.opened: list[tuple[StoreEndpoints, str]] = []
        self.forced: list[bool] = []

    def __call__(self, endpoints: StoreEndpoints, tenant_id: str) -> FakeStore:
        self.opened.append((endpoints, tenant_id))
        store = self.by_tenant.setdefault(tenant_id, FakeStore(tenant_id))
        remove = store.remove

        def tracked(keys: list[str], *, force: bool = True) -> list[int]:
            self.forced.append(force)
            return remove(keys, force=force)

        store.remove = tracked  # type: ignore[method-assign]
        return store


@pytest.fixture
def engines(tmp_path: Path) -> Iterator[NodeEngines]:
    ne = NodeEngines("node-a", Ledger(), tmp_path / "instances", state_dir=tmp_path, interval=0, metrics_interval=0,
                     store_opener=Stores(), observer_options={"poll_ms": 20, "retry_max": 0.1},
                     is_privileged=False)
    try:
        yield ne
    finally:
        ne.close()


@pytest.fixture
def pub(tmp_path: Path) -> Iterator[Callable[[str], Publisher]]:
    """``bind(instance_id)``: the instance's engine binds its KV-event socket in its instance directory."""
    ctx = zmq.Context()
    sockets: list[Publisher] = []

    def bind(instance_id: str) -> Publisher:
        sockets.append(bind_publisher(ctx, tmp_path / "instances" / instance_id))
        return sockets[-1]

    try:
        yield bind
    finally:
        for sock in sockets:
            sock.close()
        ctx.term()


def publish(engines: NodeEngines, sock: Publisher, topic: str, run: str = RUN) -> int:
    """Send the run's recorded messages under ``topic`` once the observer's SUB joined the engine's PUB (probes under
    the topic ``probe`` until one arrives); returns how many probes arrived."""
    observer = engines.observer
    return send_when_joined(sock.send_multipart, lambda: observer.received, retopic(frames(run), topic))


def present_keys(ledger: Ledger) -> set[str]:
    return {key for table in ledger.tables() for key in ledger.present_keys(table.scope)}


def store_of(engines: NodeEngines, run: str = RUN) -> FakeStore:
    """The fake Store of the run's tenant that the engines' maintenance opens, holding the keys the run's master
    held (what the engine really wrote)."""
    opener: Stores = engines._store_opener  # type: ignore[assignment]
    tenant = meta(run)["tenant_id"]
    store = opener.by_tenant.setdefault(tenant, FakeStore(tenant))
    store.objects = {key: b"x" for key in meta(run)["store_keys"]["keys_present"]}
    return store


def test_apply_writes_instance_dirs_connects_to_the_instance_socket_and_attributes_engine_writes(engines, pub,
                                                                                                 tmp_path):
    (port,) = free_ports(1)
    engines.on_apply(document([spec("7")], port))
    directory = tmp_path / "instances" / "7"
    assert read_launch(directory)["env"]["MOONCAKE_CONFIG_PATH"] == str(directory / "mooncake.json")
    assert (directory / "launch.sh").stat().st_mode & 0o111 and (directory / "env").is_file()
    assert engines.observer.running and engines.observer.status("7")[0] == "waiting"  # no engine yet
    publish(engines, pub("7"), "7")
    wait_for(lambda: engines.observer.attributor("7").snapshot()["attributed"] == 19, what="19 attributed blocks")
    assert present_keys(engines.ledger) == set()  # hints until the Store confirms them
    store_of(engines)
    assert engines.confirm_writes() == {"confirmed": 19, "unconfirmed": 0, "waiting": 0}
    assert present_keys(engines.ledger) == set(meta(RUN)["store_keys"]["keys_present"])
    (stats,) = engines.report_fields()["instances"]
    assert (stats.instance_id, stats.tenant_id, stats.namespace) == ("7", meta(RUN)["tenant_id"],
                                                                      meta(RUN)["cache_prefix"])
    assert (stats.attributed, stats.blocks_seen, stats.hash_mismatch, stats.unknown_salt) == (19, 19, 0, 0)
    assert stats.attributed_by_group == {"default": 15, "group-a": 4} and stats.seq_gaps == 0
    assert (stats.confirmed, stats.unconfirmed, stats.pending) == (19, 0, 0)
    assert stats.last_event_at is not None and stats.observed_since <= stats.last_event_at
    assert (stats.events_status, stats.events_problem, stats.events_endpoint) == ("connected", "",
                                                                                  "ipc://kv-events.sock")


def test_messages_under_another_topic_than_their_socket_s_instance_are_dropped_and_counted(engines, pub):
    (port,) = free_ports(1)
    engines.on_apply(document([spec("7"), spec("8", port=8001)], port))
    probes = publish(engines, pub("7"), "8")  # instance 7's socket, instance 8's topic: never 8's blocks
    blocks = store_blocks(RUN)
    wait_for(lambda: engines.observer.unknown_topic_blocks == blocks, what="unknown-topic blocks")
    fields = engines.report_fields()
    assert fields["unknown_topic_blocks"] == blocks
    assert fields["unknown_topic_messages"] == len(frames(RUN)) + probes
    seven, eight = fields["instances"]
    assert seven.topic_mismatch == len(frames(RUN)) + probes and eight.topic_mismatch == 0
    assert seven.blocks_seen == eight.blocks_seen == 0 and not present_keys(engines.ledger)


def test_a_release_whose_engines_hash_otherwise_shows_hash_mismatches(engines, pub):
    (port,) = free_ports(1)
    engines.on_apply(document([spec("7", hash_seed="4242")], port))  # the engine ran without PYTHONHASHSEED
    publish(engines, pub("7"), "7")
    att = engines.observer.attributor("7")
    wait_for(lambda: att.snapshot()["blocks_seen"] == 19, what="19 blocks seen")
    (stats,) = engines.instance_stats()
    assert stats.attributed == 0 and stats.hash_mismatch + stats.unknown_salt == 19 and stats.hash_mismatch > 0


def test_reapply_keeps_unchanged_connections_and_a_document_without_vllm_stops_observing(engines, pub, tmp_path):
    (port,) = free_ports(1)
    engines.on_apply(document([spec("7"), spec("8", port=8001)], port))
    observer = engines.observer
    publish(engines, pub("7"), "7")
    wait_for(lambda: observer.attributor("7").snapshot()["attributed"] == 19, what="attribution")
    engines.on_apply(document([spec("7")], port, version=2))
    assert engines.observer is observer and observer.status("7")[0] == "connected"  # state and socket kept
    assert sorted(p.name for p in (tmp_path / "instances").iterdir()) == ["7"]  # 8's directory went
    assert observer.attributor("7").snapshot()["attributed"] == 19
    engines.on_apply(document([], port, version=3))
    assert engines.observer is None and not observer.running and list((tmp_path / "instances").iterdir()) == []


def test_schema_1_documents_and_simulated_engines_run_no_observer(tmp_path):
    (port,) = free_ports(1)
    plain = NodeEngines("node-a", Ledger(), tmp_path / "a", interval=0)
    plain.on_apply(document([instance(RUN, instance_id="7")], port, settings=None))  # no node settings
    assert plain.observer is None and plain.instance_dirs == []
    simulated = NodeEngines("node-a", Ledger(), tmp_path / "b", observe=False)
    simulated.on_apply(document([spec("7")], port))
    assert simulated.observer is None and simulated.segment is None and simulated.budget is None
    assert [p.name for p in simulated.instance_dirs] == ["7"]
    assert simulated.tick() == {"checked": 0, "missing": 0, "removed": 0, "orphans_removed": 0}
    plain.close()
    simulated.close()


def test_a_bad_launch_keeps_the_old_directories_and_the_rest_still_applies(engines, tmp_path):
    (port,) = free_ports(1)
    engines.on_apply(document([spec("7")], port))
    bad = spec("8").model_copy(update={"launch": LaunchSpec.model_construct(
        instance_id="8", argv=("python",), env={}, file_env={}, files={"launch.sh": "x"})})
    engines.on_apply(document([spec("7"), bad], port, version=2))
    assert "instance_dirs" in engines.errors and [p.name for p in (tmp_path / "instances").iterdir()] == ["7"]
    assert engines.observer.attributor("8") is not None  # the observer took the new document anyway


def test_reconcile_drops_blocks_the_store_lost(engines, pub):
    (port,) = free_ports(1)
    engines.on_apply(document([spec("7")], port))
    publish(engines, pub("7"), "7")
    wait_for(lambda: engines.observer.attributor("7").snapshot()["attributed"] == 19, what="attribution")
    opener: Stores = engines._store_opener  # type: ignore[assignment]
    tenant = meta(RUN)["tenant_id"]
    store = store_of(engines)
    engines.confirm_writes()
    keys = sorted(meta(RUN)["store_keys"]["keys_present"])
    store.objects = {key: b"x" for key in keys[:12]}  # the master evicted 7 of them
    counts = engines.reconcile_now()
    assert counts["missing"] == 7 and present_keys(engines.ledger) == set(keys[:12])
    endpoints, opened_for = opener.opened[-1]
    assert opened_for == tenant and endpoints.global_segment_size == 0  # the maintenance client mounts nothing
    orphaned = sum(t.orphaned_blocks for t in engines.ledger.tables())
    assert orphaned > 0  # blocks below an evicted one: unreachable by prefix lookup
    assert engines.tick(full=True)["orphans_removed"] == 0  # the default rule: no pressure, orphans stay
    engines.maintenance.orphan_collection = "eager"
    counts = engines.tick(full=True)  # collects them: removed by exact key, the ledger forgets them
    assert counts["orphans_removed"] == orphaned and counts["missing"] == 0
    assert present_keys(engines.ledger) == set(store.objects) and len(store.objects) == 12 - orphaned
    assert all(row["orphaned_bytes"] == 0 for row in engines.ledger.snapshot())


def test_a_probe_between_reconciles_finds_an_emptied_store_and_checks_every_block(engines, pub):
    (port,) = free_ports(1)
    engines.on_apply(document([spec("7")], port))
    publish(engines, pub("7"), "7")
    wait_for(lambda: engines.observer.attributor("7").snapshot()["attributed"] == 19, what="attribution")
    opener: Stores = engines._store_opener  # type: ignore[assignment]
    store = opener(engines.document.store, meta(RUN)["tenant_id"])
    store.objects = {key: b"x" for key in meta(RUN)["store_keys"]["keys_present"]}
    # a fake store loses objects whatever their leases; a real master keeps a block this agent's check leased (the
    # confirmation of each write) until the lease ends, which lease-aware checks count on: 0 checks every block
    engines.maintenance.lease_ttl = 0
    assert engines.tick()["checked"] == 19  # the first tick reconciles; the next reconcile is 30 s away
    engines.maintenance.probe_interval = 0
    assert engines.tick() == {"checked": 0, "missing": 0, "removed": 0, "orphans_removed": 0}  # no probe
    store.objects = {}  # the master restarted: every object is gone
    engines.maintenance.probe_interval = 0.01
    time.sleep(0.02)
    counts = engines.tick()
    assert counts["missing"] == 19 and counts["checked"] == 4 + 19  # the probe's sample, then every block
    assert present_keys(engines.ledger) == set()


def test_budgets_remove_leaves_through_the_store_without_force(engines, pub):
    (port,) = free_ports(1)
    block = 16 << 10
    engines.on_apply(document([spec("7", budget=10 * block)], port))
    publish(engines, pub("7"), "7")
    wait_for(lambda: engines.observer.attributor("7").snapshot()["attributed"] == 19, what="attribution")
    opener: Stores = engines._store_opener  # type: ignore[assignment]
    store = opener(engines.document.store, meta(RUN)["tenant_id"])
    store.objects = {key: b"x" for key in meta(RUN)["store_keys"]["keys_present"]}
    counts = engines.tick(full=True)
    rows = engines.ledger.snapshot()
    held = sum(row["bytes"] for row in rows)
    assert counts["removed"] == 19 - held // block and held <= 9 * block  # trimmed to 90 % of the budget
    assert all(row["orphaned_bytes"] == 0 for row in rows)
    assert set(store.objects) == present_keys(engines.ledger)  # exactly the removed keys went
    assert opener.forced and not any(opener.forced)  # never force=True
    assert engines.tick(full=True)["removed"] == 0  # under budget now


METRICS = """vllm:external_prefix_cache_queries_total{{engine="0"}} {queries}
vllm:external_prefix_cache_hits_total{{engine="0"}} {hits}
vllm:prefix_cache_queries_total{{engine="0"}} {queries}
vllm:prefix_cache_hits_total{{engine="0"}} 0.0
"""


def test_engine_hits_become_hit_and_miss_blocks_of_the_release_scope(tmp_path):
    answers = [OSError("connection refused"), METRICS.format(queries=650.0, hits=330.0),
               METRICS.format(queries=1300.0, hits=660.0), METRICS.format(queries=20.0, hits=0.0)]

    def fetch(url: str, timeout: float) -> str:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    (port,) = free_ports(1)
    ledger = Ledger()
    engines = NodeEngines("node-a", ledger, tmp_path / "i", interval=0, metrics_interval=0,
                          observer_options={"fetch": fetch, "poll_ms": 20}, is_privileged=False)
    try:
        engines.on_apply(document([spec("7")], port))
        scope = CacheScope(meta(RUN)["tenant_id"], "tiny-llama", meta(RUN)["cache_prefix"], ENGINE_LOOKUPS)

        def row() -> tuple[int, int]:
            found = [r for r in ledger.snapshot() if CacheScope(r["tenant_id"], r["served_model_name"],
                                                                r["namespace"], r["request_group"]) == scope]
            return (found[0]["hit_blocks"], found[0]["miss_blocks"]) if found else (0, 0)

        engines.observer.scrape_metrics_now()  # the engine is not up yet
        engines.observer.scrape_metrics_now()  # it came up after the agent: all of its counts are new
        engines.credit_hits()
        assert row() == (330 // 32, 320 // 32)  # 10 hit blocks, 10 miss blocks; remainders carried
        engines.observer.scrape_metrics_now()
        (stats,) = engines.report_fields()["instances"]
        assert (stats.external_prefix_cache_hits, stats.external_prefix_cache_queries) == (660, 1300)
        assert row() == (660 // 32, 640 // 32)
        engines.observer.scrape_metrics_now()  # the engine restarted: its counters start again
        engines.credit_hits()
        assert row() == (660 // 32, 660 // 32)  # never down
    finally:
        engines.close()


def test_the_daemon_applies_documents_through_the_engines_hook_and_reports_their_facts(tmp_path, pub):
    (port,) = free_ports(1)
    published: list[list[dict]] = []
    ledger = Ledger()
    engines = NodeEngines("node-a", ledger, tmp_path / "instances", interval=0, metrics_interval=0,
                          observer_options={"poll_ms": 20, "retry_max": 0.1}, is_privileged=False)
    calls: list[str] = []
    daemon = Daemon("node-a", SECRET, tmp_path / "state", publish=published.append, ledger=ledger,
                    on_apply=[lambda applied: calls.append("first") or 1 / 0, engines.on_apply],
                    report_fields=engines.report_fields)
    try:
        wire = document([spec("7")], port, version=4).to_wire()
        wire.pop("signature")
        wire["sent_at"] = signing.timestamp(datetime.now(UTC))  # stamped when the dashboard sends it
        ack = daemon.handle_document(signing.signed(wire, SECRET))
        assert ack["status"] == "applied" and calls == ["first"]  # a failing hook does not skip the next one
        assert (tmp_path / "instances" / "7" / "launch.sh").is_file()
        publish(engines, pub("7"), "7")
        wait_for(lambda: engines.observer.attributor("7").snapshot()["attributed"] == 19, what="attribution")
        engines._store_opener = Stores()
        store_of(engines)
        engines.confirm_writes()
        daemon.report_now()
        daemon.flush()
        reports = [Report.model_validate(m) for batch in published for m in batch if m["kind"] == "report"]
        (stats,) = reports[-1].instances
        assert stats.attributed == 19 and reports[-1].unknown_topic_blocks == 0
        assert sum(row.blocks for row in reports[-1].scopes) == 19
    finally:
        daemon.stop()
        engines.close()


def test_both_paths_poll_the_masters_eviction_counters_the_document_names(tmp_path):
    """``NodeSettings.master_metrics_urls`` reach the one maintenance policy on the real-engine path and in the
    simulator (which then runs its rounds at the poll interval, not only every ``reconcile_seconds``)."""
    from types import SimpleNamespace

    from agent.sim.workload import EngineSimulator

    (port,) = free_ports(1)
    urls = ("http://127.0.0.1:9003/metrics",)
    doc = document([instance(RUN, instance_id="7")], port,
                   settings=NodeSettings(kv_events_port=port, master_metrics_urls=urls))
    plain = NodeEngines("node-a", Ledger(), tmp_path / "a", interval=0, store_opener=Stores())
    simulator = EngineSimulator("node-a", Ledger(), reconcile_seconds=30, open_on_apply=False)
    try:
        assert plain.maintenance is not None and not plain.maintenance.eviction_watch.active
        plain.on_apply(doc)
        assert plain.maintenance.eviction_watch.urls == urls
        assert simulator._maintenance_wait() == 30
        simulator.on_apply(SimpleNamespace(document=doc))
        assert simulator.maintenance.eviction_watch.urls == urls and simulator._maintenance_wait() == 1.0
        plain.on_apply(document([instance(RUN, instance_id="7")], port, version=2, settings=None))
        assert not plain.maintenance.eviction_watch.active  # a document without them: the periodic reconcile only
    finally:
        plain.close()
        simulator.close()


def test_the_maintenance_thread_wakes_for_the_eviction_signal_between_ticks(tmp_path, monkeypatch):
    """With the masters' metrics named, the thread's next round comes after the eviction counters' poll interval
    (a light :meth:`NodeEngines.signal_tick`), not only every ``interval``; without them, every ``interval``."""
    import agent.node.engines as engines_module

    engines = NodeEngines("node-a", Ledger(), tmp_path / "i", interval=2.0, metrics_interval=0,
                          store_opener=Stores(), is_privileged=False)
    try:
        now = 100.0
        monkeypatch.setattr(engines_module.time, "monotonic", lambda: now)  # a fixed clock: no wall-clock speed
        assert engines._wait(now) == engines_module.CONFIRM_INTERVAL == 0.5  # a light round: confirm the writes
        engines.maintenance.set_master_metrics(["http://127.0.0.1:9/metrics"])
        assert engines._wait(now) == 0.5                 # the counters' poll (1 s) comes at every other one
        engines.maintenance.eviction_watch.poll_interval = 0.25
        assert engines._wait(now) == 0.25
        assert engines._wait(now - 5.0) == 0.0           # a full tick overdue: at once
        assert engines.signal_tick() == {"checked": 0, "missing": 0}  # no document: no tenant, nothing checked
    finally:
        engines.close()


def test_instance_stats_clamp_counters_to_the_contract_bounds():
    from datetime import UTC, datetime

    from agent.contract.messages import MAX_BYTES, MAX_COUNT
    from agent.node.engines import _instance_stats

    stats = _instance_stats(instance_id="1", observed_since=datetime(2026, 1, 1, tzinfo=UTC), messages=2 ** 60,
                            events=3, attributed_by_group={"g": 2 ** 64}, unknown_namespace_bytes={"p@m": 2 ** 63})
    assert (stats.messages, stats.events) == (MAX_COUNT, 3)
    assert stats.attributed_by_group == {"g": MAX_COUNT} and stats.unknown_namespace_bytes == {"p@m": MAX_BYTES}
