"""Unit tests of the demo's parts and of the simulated engine traffic (no services: a fake store).

The end-to-end run is ``test_demo.py``; the simulator on a real master is ``test_demo_workload.py``.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest

from agent.contract.messages import ConfigDocument, MessageError
from agent.datapath.ledger import Ledger
from agent.sim.trace import TraceRequest
from agent.sim.workload import (
    EngineSimulator,
    WorkItem,
    WorkloadBatch,
    load_overrides,
    parse_batch,
)
from demo import cli, scenario
from demo.procs import DemoError, Service
from demo.replay import Expected, Replayer
from demo.summary import format_table, summarize
from tests.support.fakes import FakeStore

MIB = 1 << 20


# --- scenario and routing ------------------------------------------------------------------------------------


def deployment() -> scenario.Deployment:
    dep = scenario.Deployment()
    dep.group_salts = {("acme", "support-bot"): "s1", ("acme", "code-assistant"): "s2"}
    n = 0
    for tenant, namespaces in (("acme", (scenario.SERVING, scenario.WARMING)), ("globex", (scenario.SERVING,))):
        for namespace in namespaces:
            for role in ("prefill", "decode"):
                n += 1
                dep.instances[(tenant, namespace, role)] = str(n)
    dep.misconfigured_instance = "99"
    return dep


def test_routes_follow_the_conversation_and_spread_over_namespaces():
    dep = deployment()
    routes = [scenario.route([0, root, root + 1], dep) for root in range(1, 3001)]
    # every turn of a conversation (same root, longer prefix) goes to the same namespace and instances
    assert scenario.route([0, 7, 8, 9, 10], dep) == scenario.route([0, 7], dep)
    keys = {(r.tenant_id, r.namespace, r.request_group) for r in routes}
    assert keys == {("acme", scenario.SERVING, "support-bot"), ("acme", scenario.SERVING, "code-assistant"),
                    ("acme", scenario.WARMING, "support-bot"), ("acme", scenario.WARMING, "code-assistant"),
                    ("globex", scenario.SERVING, "")}
    globex = sum(r.tenant_id == "globex" for r in routes) / len(routes)
    assert abs(globex - scenario.GLOBEX_SHARE) < 0.05
    wrong = [r for r in routes if r.misconfigured]
    assert wrong and all((r.tenant_id, r.namespace) == ("acme", scenario.SERVING) for r in wrong)
    assert all(r.decode_instance == "99" and r.decode_namespace == scenario.MISTYPED_NAMESPACE for r in wrong)
    right = [r for r in routes if not r.misconfigured]
    assert all(r.decode_instance == dep.instances[(r.tenant_id, r.namespace, "decode")] for r in right)


def test_sizes_keep_budgets_inside_quotas_inside_the_pool():
    for segment_mib in (16, 64, 256):
        sizes = scenario.Sizes(segment_mib * MIB)
        assert sizes.acme_quota + sizes.globex_quota <= sizes.capacity_bytes
        acme = sum(v for (tenant, _), v in sizes.budgets.items() if tenant == "acme")
        assert 0 < acme <= sizes.acme_quota
        assert 0 < sizes.budgets[("globex", scenario.SERVING)] <= sizes.globex_quota
        assert all(v % MIB == 0 for v in sizes.budgets.values())


def test_seed_posts_the_registry_and_records_every_instance():
    calls: list[tuple[str, dict]] = []

    class Api:
        def post(self, path: str, body: dict) -> dict:
            calls.append((path, body))
            return {"id": len(calls), "cache_salt": f"salt-{len(calls)}"}

    dep = scenario.seed(Api(), scenario.Sizes(64 * MIB))
    paths = [path for path, _ in calls]
    assert paths.count("tenants/") == 2 and paths.count("models/") == 2 and paths.count("releases/") == 2
    assert any(path.endswith("/copy/") for path in paths) and paths.count("request-groups/") == 2
    assert paths.count("nodes/") == 2 and paths.count("assignments/") == 7
    assert set(dep.release_ids) == {("acme", scenario.SERVING), ("acme", scenario.WARMING),
                                    ("globex", scenario.SERVING)}
    assert len(dep.instances) == 6 and dep.misconfigured_instance
    ports = [(body["node"], body["port"]) for path, body in calls if path == "assignments/"]
    assert len(set(ports)) == len(ports)
    assert dep.groups_of("acme") == ["code-assistant", "support-bot"] and dep.groups_of("globex") == [""]
    assert scenario.launch_overrides() == {"8203": {"namespace": scenario.MISTYPED_NAMESPACE}}


# --- replay --------------------------------------------------------------------------------------------------


def trace(n: int) -> list[TraceRequest]:
    return [TraceRequest(timestamp_ms=i * 100, input_length=1024, output_length=1, hash_ids=(0, 1000 + i % 7, i + 5000))
            for i in range(n)]


def test_replayer_sends_every_request_once_in_bounded_batches():
    sent: list[tuple[str, dict]] = []
    dep = deployment()
    replayer = Replayer(trace(50), dep, lambda node, batch: sent.append((node, batch)), speed=1000, batch_max=8)
    state = replayer.run()
    assert state.sent == 50 and state.batches == len(sent)
    items = [item for _, batch in sent for item in parse_batch(batch).items]
    assert [i.request_id for i in items] == list(range(50))
    assert all(node == scenario.PREFILL_NODE for node, _ in sent)
    assert all(len(batch["items"]) <= 8 for _, batch in sent)
    assert all(i.decode_node == scenario.DECODE_NODE and i.decode_instance_id for i in items)
    assert replayer.expected.total == 2 * sum(len(r.hash_ids) for r in trace(50))


def test_replayer_paces_requests_by_the_trace_timestamps():
    sent: list[float] = []
    replayer = Replayer(trace(6), deployment(), lambda node, batch: sent.append(time.monotonic()), speed=1,
                        batch_max=1)
    start = time.monotonic()
    replayer.run()
    assert len(sent) == 6
    assert sent[-1] - start >= 0.45  # the last request is due 0.5 s of trace time after the first


def test_expected_counts_the_decode_lookup_under_the_namespace_it_reads():
    expected = Expected()
    r = scenario.Route("acme", "qwen3-8b", scenario.SERVING, "support-bot", "1", "99", True)
    expected.add(r, [0, 1, 2])
    assert expected.lookups == {("acme", "qwen3-8b", scenario.SERVING, "support-bot"): 3,
                                ("acme", "qwen3-8b", scenario.MISTYPED_NAMESPACE, "support-bot"): 3}
    typo = ("acme", "qwen3-8b", scenario.MISTYPED_NAMESPACE, "support-bot")
    assert expected.by_node[(scenario.DECODE_NODE, typo)] == 3


def test_replayer_refuses_bad_speed():
    for speed in (0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="speed"):
            Replayer(trace(1), deployment(), lambda *a: None, speed=speed)


# --- summary -------------------------------------------------------------------------------------------------


def sample(node, namespace, **values):
    return {"node_name": node, "tenant_id": "acme", "served_model_name": "qwen3-8b", "namespace": namespace,
            "request_group": "g", "ts": "2026-11-30T00:00:00Z", **values}


def test_summary_sums_nodes_and_marks_unregistered_namespaces():
    rows = summarize([sample("node-a", "rel", blocks=10, bytes=10 * MIB, hit_blocks=5, miss_blocks=15),
                      sample("node-b", "rel", hit_blocks=12, miss_blocks=8, evicted_blocks=0),
                      sample("node-b", "typo", hit_blocks=0, miss_blocks=9)])
    row = rows[("acme", "qwen3-8b", "rel", "g")]
    assert (row.blocks, row.bytes, row.lookups) == (10, 10 * MIB, 40)
    assert row.hit_ratio == pytest.approx(17 / 40)
    assert row.per_node == {"node-a": (5, 15), "node-b": (12, 8)}
    table = format_table(rows, {("acme", "qwen3-8b", "rel")})
    lines = table.splitlines()
    assert lines[0].split()[:5] == ["tenant", "model", "release", "request", "group"]
    assert "rel " in lines[2] and "42.5%" in lines[2] and "5/12" in lines[2] and "10.0 MiB" in lines[2]
    assert "typo !" in lines[3] and "0.0%" in lines[3]


# --- workload messages and overrides -------------------------------------------------------------------------


def test_parse_batch_names_the_bad_field():
    with pytest.raises(MessageError, match="items.0.hash_ids"):
        parse_batch({"schema": 1, "kind": "workload", "node": "node-a", "batch_id": 1,
                     "items": [{"request_id": 1, "instance_id": "1", "hash_ids": []}]})
    with pytest.raises(MessageError, match="schema"):
        parse_batch({"schema": 9, "kind": "workload", "node": "node-a", "batch_id": 1})
    with pytest.raises(MessageError, match="bogus: Extra inputs"):
        parse_batch({"schema": 1, "kind": "workload", "node": "node-a", "batch_id": 1, "bogus": 1})
    batch = WorkloadBatch(node="node-a", batch_id=3, items=[WorkItem(request_id=1, instance_id="1", hash_ids=[1])])
    assert parse_batch(batch.to_wire()) == batch


def test_load_overrides_checks_every_entry(tmp_path):
    path = tmp_path / "launch.json"
    path.write_text(json.dumps({"8203": {"namespace": "production-2026-7", "cache_salt": "typo"}}))
    (override,) = load_overrides(path).values()
    assert (override.namespace, override.cache_salt) == ("production-2026-7", "typo")
    for text, message in (("[]", "expected an object"), ('{"x": {}}', "not a port"),
                          ('{"80": {"tag": "a"}}', "unknown field"), ('{"80": {"namespace": 1}}', "must be a string"),
                          ("{", "invalid JSON")):
        path.write_text(text)
        with pytest.raises(ValueError, match=message):
            load_overrides(path)


# --- the simulator on a fake store ---------------------------------------------------------------------------


def document(node: str, instances: list[dict], version: int = 1) -> SimpleNamespace:
    return SimpleNamespace(document=ConfigDocument.model_validate({
        "node": node, "version": version, "issued_at": "2026-11-30T00:00:00Z",
        "store": {"master_server_address": "127.0.0.1:1", "metadata_server": "http://127.0.0.1:2/metadata",
                  "global_segment_size": 16 * MIB, "local_buffer_size": MIB},
        "instances": instances}))


def instance(instance_id: str, role: str, port: int, *, engine: str = "vllm", budget: int | None = None) -> dict:
    return {"instance_id": instance_id, "engine": engine, "role": role, "port": port, "tenant_id": "alpha",
            "served_model_name": "m", "namespace": "rel-a", "release_state": "serving",
            "kv_layout": {"num_layers": 2, "num_kv_heads": 1, "head_dim": 16, "block_size": 4},
            "hash_algo": "sha256_cbor" if engine == "vllm" else "sha256",
            "request_groups": [{"name": "g", "cache_salt": "salt-g"}], "node_budget_bytes": budget}


@pytest.fixture
def pair():
    """A prefill simulator handing off to a decode simulator, both on one shared fake store per tenant."""
    stores: dict[str, FakeStore] = {}
    opened: list[tuple[int, str]] = []

    def opener(endpoints, tenant_id):
        opened.append((endpoints.global_segment_size, tenant_id))
        return stores.setdefault(tenant_id, FakeStore(tenant_id))

    decode = EngineSimulator("node-b", Ledger(), store_opener=opener, cache_blocks=4,
                             overrides=load_overrides_dict({9: "rel-typo"}))
    prefill = EngineSimulator("node-a", Ledger(), store_opener=opener, cache_blocks=4,
                              handoff=lambda node, batch: decode.run_batch(batch))
    prefill.on_apply(document("node-a", [instance("1", "prefill", 8), instance("5", "prefill", 10, engine="sglang")]))
    decode.on_apply(document("node-b", [instance("2", "decode", 8), instance("3", "decode", 9),
                                        instance("6", "decode", 11, engine="sglang")]))
    return SimpleNamespace(prefill=prefill, decode=decode, stores=stores, opened=opened)


def load_overrides_dict(mapping: dict[int, str]):
    from agent.sim.workload import LaunchOverride

    return {port: LaunchOverride(namespace=value) for port, value in mapping.items()}


def items(decode_instance: str, prefill_instance: str = "1", n: int = 3, length: int = 10) -> list[WorkItem]:
    return [WorkItem(request_id=i, instance_id=prefill_instance, request_group="g",
                     hash_ids=[0, *range(100 * (i % 2) + 1, 100 * (i % 2) + length)],
                     decode_node="node-b", decode_instance_id=decode_instance) for i in range(n)]


def rows(sim: EngineSimulator) -> dict:
    return {(r["namespace"], r["request_group"]): r for r in sim.snapshot()}


def test_decode_loads_what_prefill_stored_byte_for_byte(pair):
    # one client per tenant per node, and only the first client of a process mounts a segment
    assert pair.opened == [(16 * MIB, "alpha"), (16 * MIB, "alpha")]
    batch = WorkloadBatch(node="node-a", batch_id=1, items=items("2", n=4, length=10))
    result = pair.prefill.run_batch(batch.to_wire())
    assert result["failed_requests"] == 0 and result["handed_off"] == 4
    assert result["stored_blocks"] > 0 and result["hit_blocks"] > 0  # turns 3 and 4 reuse turns 1 and 2
    decode = rows(pair.decode)[("rel-a", "g")]
    assert decode["hit_blocks"] == 40 and decode["miss_blocks"] == 0 and decode["gets"] == 40
    assert rows(pair.prefill)[("rel-a", "g")]["bytes"] > 0 and decode["bytes"] == 0


def test_a_corrupted_block_is_counted(pair):
    pair.prefill.handoff = None
    pair.prefill.run_batch(WorkloadBatch(node="node-a", batch_id=1, items=items("2", n=1)).to_wire())
    store = pair.stores["alpha"]
    key = next(iter(store.objects))
    store.objects[key] = bytes(len(store.objects[key]))
    again = WorkItem(request_id=9, instance_id="2", request_group="g", hash_ids=items("2")[0].hash_ids)
    batch = WorkloadBatch(node="node-b", batch_id=2, items=[again])
    result = pair.decode.run_batch(batch.to_wire())
    assert result["mismatched_blocks"] == 1 and result["loaded_blocks"] == 10


def test_a_hand_typed_tag_gets_zero_hits_under_its_own_namespace(pair):
    result = pair.prefill.run_batch(WorkloadBatch(node="node-a", batch_id=1, items=items("3")).to_wire())
    assert result["handed_off"] == 3
    decode = rows(pair.decode)
    assert ("rel-a", "g") not in decode
    assert decode[("rel-typo", "g")]["hit_blocks"] == 0 and decode[("rel-typo", "g")]["miss_blocks"] == 30
    # the daemon reports these rows beside the document's (the dashboard shows the namespace as unregistered)
    assert {(s.namespace, s.request_group) for s in pair.decode.launched_scopes()} == {("rel-typo", "g"),
                                                                                       ("rel-typo", "")}
    assert pair.prefill.launched_scopes() == set()


def test_sglang_instances_store_k_and_v_objects(pair):
    pair.prefill.run_batch(WorkloadBatch(node="node-a", batch_id=1, items=items("6", "5", n=1)).to_wire())
    keys = pair.stores["alpha"].objects
    assert any(k.endswith("_k") for k in keys) and any(k.endswith("_v") for k in keys)
    assert rows(pair.decode)[("rel-a", "g")]["hit_blocks"] == 10


def test_the_budget_is_kept_leaf_first_without_orphans():
    store = FakeStore("alpha")
    sim = EngineSimulator("node-a", Ledger(), store_opener=lambda e, t: store, cache_blocks=4)
    block = 2 * 2 * 1 * 16 * 4 * 2  # layers * K/V * heads * dims * tokens * bf16
    sim.on_apply(document("node-a", [instance("1", "prefill", 8, budget=20 * block)]))
    result = sim.run_batch(WorkloadBatch(node="node-a", batch_id=1, items=[
        WorkItem(request_id=i, instance_id="1", request_group="g", hash_ids=list(range(1000 * i, 1000 * i + 15)))
        for i in range(4)]).to_wire())
    row = rows(sim)[("rel-a", "g")]
    assert result["evicted_blocks"] > 0 and row["evicted_blocks"] == result["evicted_blocks"]
    assert row["bytes"] <= 20 * block and row["orphaned_bytes"] == 0
    assert len(store.objects) == row["blocks"]
    table = sim.ledger.table(next(iter(sim._applied.instances["1"].keyspaces.values())))
    assert all(not table.is_orphan(e) for e in table.owned_present())


def test_bad_requests_fail_alone_and_are_counted(pair):
    result = pair.prefill.run_batch(WorkloadBatch(node="node-a", batch_id=1, items=[
        WorkItem(request_id=1, instance_id="404", hash_ids=[1]),
        WorkItem(request_id=2, instance_id="1", request_group="nope", hash_ids=[1]),
        WorkItem(request_id=3, instance_id="1", request_group="g", hash_ids=[1, 2])]).to_wire())
    assert result["failed_requests"] == 2 and result["prefill"] == 1
    assert "instance 404 is not in applied config version 1" in result["errors"][0]
    assert "request group 'nope'" in result["errors"][1]
    with pytest.raises(MessageError, match="node-b"):
        pair.prefill.run_batch(WorkloadBatch(node="node-b", batch_id=1).to_wire())


def test_a_failed_hand_off_is_a_failed_request(pair):
    def broken(node, batch):
        raise ConnectionError("broker down")

    pair.prefill.handoff = broken
    result = pair.prefill.run_batch(WorkloadBatch(node="node-a", batch_id=1, items=items("2", n=2)).to_wire())
    assert result["failed_requests"] == 2 and "broker down" in result["errors"][0]


def test_snapshot_reports_requests_in_flight(pair):
    seen: list[int] = []
    original = pair.prefill._prefill

    def spy(*args):
        seen.append(rows(pair.prefill)[("rel-a", "g")]["in_flight_requests"])
        return original(*args)

    pair.prefill._prefill = spy
    pair.prefill.handoff = None
    pair.prefill.run_batch(WorkloadBatch(node="node-a", batch_id=1, items=[
        WorkItem(request_id=i, instance_id="1", request_group="g", hash_ids=[i + 1]) for i in range(3)]).to_wire())
    assert seen == [3, 2, 1]
    assert "in_flight_requests" not in rows(pair.prefill)[("rel-a", "g")]


def test_a_new_document_applies_from_the_next_batch(pair):
    pair.prefill.handoff = None
    pair.prefill.on_apply(document("node-a", [{**instance("1", "prefill", 8), "namespace": "rel-b"}], version=2))
    pair.prefill.run_batch(WorkloadBatch(node="node-a", batch_id=1, items=items("2", n=1)).to_wire())
    assert ("rel-b", "g") in rows(pair.prefill)


# --- workload result files (what the demo's verdict reads) ----------------------------------------------------


def test_every_batch_and_every_refusal_is_one_result_line(pair, tmp_path):
    from agent.sim.workload import RESULTS_FILE, ResultFile, read_results

    pair.prefill.results = ResultFile(tmp_path / "a" / RESULTS_FILE)
    pair.decode.results = ResultFile(tmp_path / "b" / RESULTS_FILE)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    first = pair.prefill.run_batch(WorkloadBatch(node="node-a", batch_id=1, items=items("2", n=3)).to_wire())
    pair.prefill.run_batch(WorkloadBatch(node="node-a", batch_id=2, items=[
        WorkItem(request_id=7, instance_id="404", hash_ids=[1])]).to_wire())
    with pytest.raises(MessageError):
        pair.prefill.run_batch(WorkloadBatch(node="node-b", batch_id=3).to_wire())
    lines = read_results(tmp_path / "a" / RESULTS_FILE)
    assert [(r["kind"], r.get("batch_id")) for r in lines] == [
        ("workload_result", 1), ("workload_result", 2), ("workload_refused", None)]
    assert {k: v for k, v in lines[0].items() if k not in ("schema", "kind", "finished_at")} == first
    assert lines[1]["failed_requests"] == 1 and "instance 404" in lines[1]["errors"][0]
    assert "node-b" in lines[2]["error"] and lines[2]["node"] == "node-a"
    decode = read_results(tmp_path / "b" / RESULTS_FILE)  # the three hand-offs, one batch each
    assert [r["requests"] for r in decode] == [1, 1, 1] and all(r["node"] == "node-b" for r in decode)
    assert all(line.endswith("\n") for line in (tmp_path / "a" / RESULTS_FILE).read_text().splitlines(True))


def test_reading_results_skips_a_torn_last_line_and_foreign_lines(tmp_path):
    from agent.sim.workload import read_results

    path = tmp_path / "results.jsonl"
    assert read_results(path) == []
    good = '{"schema":1,"kind":"workload_result","requests":2}\n'
    path.write_text(good + "not json\n" + '{"schema":2,"kind":"workload_result"}\n' + "[1]\n" + good
                    + '{"schema":1,"kind":"workload_res')
    assert read_results(path) == [json.loads(good)] * 2


def test_result_totals_sum_requests_failures_and_corrupted_blocks():
    from agent.sim.workload import ResultTotals

    totals = ResultTotals().add([
        {"kind": "workload_result", "node": "node-a", "batch_id": 1, "requests": 16, "failed_requests": 0,
         "mismatched_blocks": 0, "errors": []},
        {"kind": "workload_result", "node": "node-b", "batch_id": 4, "requests": 3, "failed_requests": 2,
         "mismatched_blocks": 5, "errors": ["request 9: boom", "request 10: boom"]},
        {"kind": "workload_refused", "node": "node-b", "error": "schema: unsupported"},
    ])
    assert (totals.batches, totals.requests, totals.failed, totals.corrupted, totals.refused) == (2, 19, 2, 5, 1)
    assert totals.first_error == "node node-b batch 4: request 9: boom"
    counts, text = cli.agent_totals_text(totals)
    assert counts == {"requests": 19, "failed": 2, "corrupted": 5}
    assert text == ("agents ran 19 request(s): 2 failed, 5 corrupted block(s), 1 batch(es) refused; "
                    "first error: node node-b batch 4: request 9: boom")
    assert cli.agent_totals_text(ResultTotals())[1] == "agents ran 0 request(s): 0 failed, 0 corrupted block(s)"


def test_the_demo_verdict_reads_the_agents_result_files_not_their_logs(tmp_path):
    from agent.sim.workload import RESULTS_FILE, BatchResult, ResultFile

    trace = tmp_path / "trace.jsonl"  # the verdict reads no trace; any file will do where ../shared is absent
    trace.write_text("")
    demo = cli.Demo(cli.parse_args(["--var-dir", str(tmp_path / "run"), "--trace", str(trace)]))
    demo.agents = {"node-a": None, "node-b": None}  # only the names are read
    for node, failed in (("node-a", 0), ("node-b", 1)):
        demo.agent_state_dir(node).mkdir(parents=True)
        result = BatchResult(node, 1, requests=4)
        for _ in range(failed):
            result.error("request 3: no route")
        ResultFile(demo.agent_state_dir(node) / RESULTS_FILE).batch(result)
    counts, text = demo.agent_errors()
    assert counts == {"requests": 8, "failed": 1, "corrupted": 0}
    assert text == "agents ran 8 request(s): 1 failed, 0 corrupted block(s); first error: node node-b batch 1: " \
                   "request 3: no route"
    assert not hasattr(cli, "_BATCH_LINE")


# --- command line and processes ------------------------------------------------------------------------------


def test_parse_args_defaults_and_refusals(capsys):
    args = cli.parse_args(["--once"])
    assert args.requests == cli.ONCE_REQUESTS and args.speed == 20.0 and args.segment_mib == 64
    assert cli.parse_args([]).requests is None
    for argv, message in ((["--segment-mib", "8"], "at least 16 MiB"), (["--speed", "0"], "greater than 0"),
                          (["--port", "70000"], "not a TCP port"),
                          (["--private-redis", "--redis-url", "redis://x"], "not allowed with"),
                          (["--trace", "/nonexistent.jsonl"], "is not a file")):
        with pytest.raises(SystemExit):
            cli.parse_args(argv)
        assert message in capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    (["--speed", "nan"], "--speed: 'nan' is not a finite number"),
    (["--speed", "inf"], "--speed: 'inf' is not a finite number"),
    (["--timeout", "nan"], "--timeout: 'nan' is not a finite number"),
    (["--redis-url", "foo://x"], "--redis-url: 'foo://x' is not a supported broker URL"),
    (["--redis-url", "notaurl"], "--redis-url: 'notaurl' is not a supported broker URL"),
    (["--redis-url", "memory://"], "is not a supported broker URL"),
    (["--redis-url", "redis://"], "names no host"),
])
def test_parse_args_refuses_non_finite_numbers_and_non_redis_urls(capsys, argv, message):
    with pytest.raises(SystemExit) as exited:
        cli.parse_args(argv)
    assert exited.value.code == 2
    assert message in capsys.readouterr().err
    assert cli.parse_args(["--redis-url", "redis://127.0.0.1:6379/11"]).redis_url == "redis://127.0.0.1:6379/11"


def test_demo_command_line_refuses_bad_input_without_a_traceback():
    env = {**os.environ, "PYTHONPATH": str(cli.ROOT)}
    for argv in (["--speed", "nan"], ["--redis-url", "foo://x"]):
        done = subprocess.run([sys.executable, "-m", "demo", *argv], capture_output=True, text=True, env=env,
                              cwd=cli.ROOT, timeout=60)
        assert done.returncode == 2 and "error: argument" in done.stderr, done.stderr
        assert "Traceback" not in done.stderr


def test_a_non_demo_directory_is_never_wiped(tmp_path):
    (tmp_path / "precious.txt").write_text("keep")
    demo = cli.Demo(cli.parse_args(["--var-dir", str(tmp_path)]))
    with pytest.raises(DemoError, match="not created by the demo"):
        demo.prepare_var()
    assert (tmp_path / "precious.txt").read_text() == "keep"
    run_dir = tmp_path / "run"
    demo = cli.Demo(cli.parse_args(["--var-dir", str(run_dir)]))
    demo.prepare_var()
    (run_dir / "db.sqlite3").write_text("old run")
    demo.prepare_var()
    assert not (run_dir / "db.sqlite3").exists() and (run_dir / cli.MARKER).exists()


def test_stopping_a_service_stops_its_whole_process_group(tmp_path):
    service = Service("sleepers", ["sh", "-c", "sleep 60 & echo $! > child.pid; wait"], os.environ,
                      tmp_path / "log", cwd=tmp_path).start()
    service.wait_until(lambda: (tmp_path / "child.pid").exists(), 10, "the child pid")
    child = int((tmp_path / "child.pid").read_text())
    service.stop(grace=5)
    assert not service.alive
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and _running(child):
        time.sleep(0.05)
    assert not _running(child)


def test_stopping_a_service_also_stops_a_child_that_left_its_group(tmp_path):
    """A child in its own process group (``setpgrp``) that ignores SIGTERM is still in the service's session: stop()
    kills it and returns only once it is gone."""
    script = ("import os, signal, time\n"
              "if os.fork() == 0:\n"
              "    os.setpgrp(); signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
              "    open('child.pid', 'w').write(str(os.getpid()))\n"
              "    while True: time.sleep(1)\n"
              "while True: time.sleep(1)\n")
    service = Service("escaper", [sys.executable, "-c", script], os.environ, tmp_path / "log", cwd=tmp_path).start()
    service.wait_until(lambda: (tmp_path / "child.pid").is_file() and (tmp_path / "child.pid").read_text(), 10,
                       "the child pid")
    child = int((tmp_path / "child.pid").read_text())
    try:
        service.stop(grace=5)
        assert not _running(child)
    finally:
        if _running(child):
            os.kill(child, signal.SIGKILL)


def test_a_service_that_exits_is_reported_with_its_log(tmp_path):
    service = Service("broken", ["sh", "-c", "echo boom; exit 3"], os.environ, tmp_path / "log", cwd=tmp_path).start()
    with pytest.raises(DemoError, match=r"broken exited with status 3(.|\n)*boom"):
        service.wait_until(lambda: False, 10, "nothing")


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie waiting for its reaper is gone for our purpose
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().split()[2] != "Z"
    except OSError:
        return False


def test_unknown_signal_handler_raises_keyboard_interrupt():
    with pytest.raises(KeyboardInterrupt):
        cli._interrupt(signal.SIGTERM, None)


def test_agent_command_runs_the_agent_module_with_simulated_engines(tmp_path):
    assert cli.AGENT_COMMAND[1:] == ["-m", "agent", "run", "--single-user"]
    env = {**os.environ, "PYTHONPATH": str(cli.ROOT)}

    def agent(*argv: str) -> subprocess.CompletedProcess:
        return subprocess.run([*cli.AGENT_COMMAND, "--node", "node-x", "--broker", "redis://127.0.0.1:1/0", *argv],
                              capture_output=True, text=True, env={**env, "KVPOOL_NODE_SECRET": "s"}, cwd=cli.ROOT,
                              timeout=60)

    helped = subprocess.run([*cli.AGENT_COMMAND, "--help"], capture_output=True, text=True, env=env, cwd=cli.ROOT)
    assert helped.returncode == 0 and "--simulate-engines" in helped.stdout and "--launch-overrides" in helped.stdout
    refused = agent("--launch-overrides", str(tmp_path / "x.json"))
    assert refused.returncode != 0 and "--launch-overrides needs --simulate-engines" in refused.stderr
    bad = tmp_path / "bad.json"
    bad.write_text('{"8203": {"tag": "x"}}')
    refused = agent("--simulate-engines", "--launch-overrides", str(bad), "--state-dir", str(tmp_path / "state"))
    assert refused.returncode != 0 and "--launch-overrides" in refused.stderr
    assert "unknown field(s) tag" in refused.stderr


def test_blocks_under_a_read_lease_are_not_removed_and_the_trim_ends():
    store = FakeStore("alpha")
    sim = EngineSimulator("node-a", Ledger(), store_opener=lambda e, t: store, cache_blocks=4)
    block = 2 * 2 * 1 * 16 * 4 * 2
    sim.on_apply(document("node-a", [instance("1", "prefill", 8, budget=20 * block)]))
    first = WorkItem(request_id=0, instance_id="1", request_group="g", hash_ids=list(range(15)))
    sim.run_batch(WorkloadBatch(node="node-a", batch_id=0, items=[first]).to_wire())
    for key in list(store.objects):  # a decode node is reading every block of the first request
        store.fail[key] = -706
    result = sim.run_batch(WorkloadBatch(node="node-a", batch_id=1, items=[
        WorkItem(request_id=1, instance_id="1", request_group="g", hash_ids=list(range(1000, 1015)))]).to_wire())
    assert result["failed_requests"] == 0
    assert all(key in store.objects for key in store.fail)  # leased blocks stayed
    row = rows(sim)[("rel-a", "g")]
    assert result["evicted_blocks"] == 15 - 3 and row["bytes"] == 18 * block and row["orphaned_bytes"] == 0
    store.remove = lambda keys, force=True: [-706] * len(keys)  # everything leased: the trim gives up
    result = sim.run_batch(WorkloadBatch(node="node-a", batch_id=2, items=[
        WorkItem(request_id=2, instance_id="1", request_group="g", hash_ids=list(range(2000, 2010)))]).to_wire())
    assert result["failed_requests"] == 0 and result["evicted_blocks"] == 0


def test_an_instance_that_leaves_the_document_releases_its_cache(pair):
    store = pair.stores["alpha"]
    registered = len(store.registered)
    pair.prefill.on_apply(document("node-a", [instance("1", "prefill", 8)], version=2))
    assert len(pair.prefill._engines) == 1 and len(store.registered) == registered - 1


@pytest.mark.parametrize("password", ["-Zq3x_9", "--help", "plain-pass"])
def test_setup_db_command_line_keeps_a_password_that_starts_with_a_dash(password):
    """secrets.token_urlsafe() may start with '-': passed as '--password VALUE' argparse took it for an option
    and the demo failed to migrate (seen on CI)."""
    from demo.cli import setup_db_argv
    from demo.setup_db import build_parser

    argv = setup_db_argv("admin", password)
    assert argv[1:3] == ["-m", "demo.setup_db"]
    args = build_parser().parse_args(argv[3:])
    assert (args.username, args.password) == ("admin", password)
