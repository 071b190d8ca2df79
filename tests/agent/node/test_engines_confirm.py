"""``NodeEngines``' confirmation step: engine events are hints the Store confirms under the instance's tenant, before
any budget, orphan or report figure sees them; an engine writing under another namespace is found and named
(fake Stores; the real master: test_engines_forged.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from agent.contract.messages import InstanceSpec
from agent.datapath.ledger import Ledger
from agent.node.engines import NodeEngines
from agent.sim.master import free_ports
from tests.agent.node.test_engines import RUN, Stores, document, present_keys, spec, store_of
from tests.support.captures import forged_store_events, frames, meta, retopic
from tests.support.waiting import wait_for

BLOCK = 16 << 10


@pytest.fixture
def engines(tmp_path: Path) -> Iterator[NodeEngines]:
    ne = NodeEngines("node-a", Ledger(), tmp_path / "instances", state_dir=tmp_path, interval=0, metrics_interval=0,
                     store_opener=Stores(), observer_options={"poll_ms": 20, "attributor_options": {"grace": 0.0}})
    try:
        yield ne
    finally:
        ne.close()


def feed(engines: NodeEngines, msgs: list[list[bytes]], instance_id: str = "7") -> None:
    """Hand ``msgs`` to the observer as if they arrived on ``instance_id``'s socket."""
    for raw in msgs:
        engines.observer.handle_instance_frames(instance_id, raw)


def test_forged_events_count_against_no_budget_and_remove_no_real_key(tmp_path, request) -> None:
    """The attack of issue 16 item 2: 200 forged BlockStored events with the tenant's seed, then one maintenance
    tick, used to count them against the release's budget and remove all of its real keys."""
    engines = NodeEngines("node-a", Ledger(), tmp_path / "instances", state_dir=tmp_path, interval=0,
                          metrics_interval=0, store_opener=Stores(), observer_options={"poll_ms": 20})
    request.addfinalizer(engines.close)
    (port,) = free_ports(1)
    engines.on_apply(document([spec("7", budget=19 * BLOCK)], port))
    store = store_of(engines)  # the engine's 19 real blocks
    real = set(store.objects)
    feed(engines, forged_store_events(RUN, 200, topic="7") + retopic(frames(RUN), "7"))
    att = engines.observer.attributor("7")
    wait_for(lambda: att.snapshot()["attributed"] == 219, what="219 attributed blocks")
    counts = engines.tick(full=True)
    assert counts["removed"] == 0 and engines.removed_over_budget == 0
    assert set(store.objects) == real and "remove" not in store.calls  # no byte of the Store changed
    assert present_keys(engines.ledger) == real  # the real ones, confirmed
    assert sum(row["bytes"] for row in engines.ledger.snapshot()) == 19 * BLOCK
    (stats,) = engines.instance_stats()
    assert (stats.attributed, stats.confirmed, stats.pending) == (219, 19, 200)  # forged ones wait for the grace
    att.pending.grace = 0.0
    engines.tick()
    (stats,) = engines.instance_stats()
    assert (stats.confirmed, stats.unconfirmed, stats.pending) == (19, 200, 0)
    assert set(store.objects) == real and engines.removed_over_budget == 0


def test_nothing_is_booked_while_the_store_has_not_confirmed_it(engines) -> None:
    (port,) = free_ports(1)
    engines.on_apply(document([spec("7")], port))
    opener: Stores = engines._store_opener  # type: ignore[assignment]
    feed(engines, retopic(frames(RUN), "7"))
    att = engines.observer.attributor("7")
    wait_for(lambda: att.snapshot()["attributed"] == 19, what="attribution")
    assert present_keys(engines.ledger) == set()  # nothing a budget could count
    opener.by_tenant.clear()
    engines._stores.clear()
    store = store_of(engines)
    assert engines.confirm_writes()["confirmed"] == 19
    assert present_keys(engines.ledger) == set(store.objects)


def events_config(port: int) -> dict[str, object]:
    """Instance 7's ``--kv-events-config`` as the registry renders it (its socket in its instance directory; ``port``
    is the node's unused events port)."""
    return {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": "ipc://kv-events.sock", "topic": "7"}


def rendered(port: int) -> InstanceSpec:
    """Instance 7 with the ``--kv-events-config`` the registry renders into its launch."""
    base = spec("7")
    argv = (*base.launch.argv, "--kv-events-config", json.dumps(events_config(port)))
    return base.model_copy(update={"launch": base.launch.model_copy(update={"argv": argv})})


@pytest.fixture
def events_port() -> int:
    return free_ports(1)[0]


@pytest.fixture
def engine_process(events_port: int, tmp_path: Path) -> Iterator[Callable[[], subprocess.Popen[bytes]]]:
    """``start()``: a process whose command line is a vLLM engine's, started in instance 7's directory with its
    events config (so it binds the socket the agent reads), with a mistyped cache_prefix (the registry's is
    ``production-2026-07``)."""
    transfer = {"kv_connector": "MooncakeStoreConnector", "kv_role": "kv_both",
                "kv_connector_extra_config": {"cache_prefix": "production-2026-7"}}
    events = events_config(events_port)
    procs: list[subprocess.Popen[bytes]] = []

    def start() -> subprocess.Popen[bytes]:
        procs.append(subprocess.Popen(
            [sys.executable, "-c", "import time; time.sleep(120)", "-m", "vllm.entrypoints.openai.api_server",
             "--model", "/models/tiny-llama/", "--kv-transfer-config", json.dumps(transfer),
             "--kv-events-config", json.dumps(events)], cwd=tmp_path / "instances" / "7"))
        return procs[-1]

    try:
        yield start
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def test_an_engine_writing_under_a_mistyped_namespace_is_named_with_its_keys_and_bytes(engines, engine_process,
                                                                                      events_port):
    engines.on_apply(document([rendered(events_port)], events_port))
    process = engine_process()
    store = store_of(engines)
    store.objects = {key.replace("production-2026-07@", "production-2026-7@", 1): b"x" for key in store.objects}
    feed(engines, retopic(frames(RUN), "7"))
    att = engines.observer.attributor("7")
    wait_for(lambda: att.snapshot()["attributed"] == 19, what="attribution")
    result = engines.confirm_writes()
    assert result == {"confirmed": 0, "unconfirmed": 0, "waiting": 0}
    assert present_keys(engines.ledger) == set()  # never booked to the release
    (stats,) = engines.instance_stats()
    assert stats.unknown_namespace_keys == {"production-2026-7@tiny-llama": 19}
    assert stats.unknown_namespace_bytes == {"production-2026-7@tiny-llama": 19 * BLOCK}
    assert stats.unconfirmed == 0 and stats.attributed == 19
    from agent.engines.vllm.processes import bound_to

    directory = engines.instance_root / "7"
    bound = [launch.pid for launch in engines._launches if bound_to(launch, rendered(events_port), directory)]
    assert bound == [process.pid]  # other engines on this machine publish elsewhere (another directory)


def test_without_such_an_engine_the_blocks_are_unconfirmed(engines, tmp_path) -> None:
    (port,) = free_ports(1)
    engines.proc_root = tmp_path / "no-proc"  # nothing to read: a pod's engines are not seen
    engines.on_apply(document([spec("7")], port))
    store = store_of(engines)
    store.objects = {key.replace("production-2026-07@", "production-2026-7@", 1): b"x" for key in store.objects}
    feed(engines, retopic(frames(RUN), "7"))
    wait_for(lambda: engines.observer.attributor("7").snapshot()["attributed"] == 19, what="attribution")
    assert engines.confirm_writes()["unconfirmed"] == 19
    (stats,) = engines.instance_stats()
    assert stats.unknown_namespace_keys == {} and stats.unconfirmed == 19 and meta(RUN)["tenant_id"] == stats.tenant_id
