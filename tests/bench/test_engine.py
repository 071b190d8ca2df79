"""bench/engine.py without an engine: the figures it computes from TTFTs and /metrics readings, its command line,
and its output (human lines per model, then one JSON line with one object per model). The real-engine path is
what ``python -m bench.engine`` runs (README "Benchmarks"). No timing is asserted."""
from __future__ import annotations

import io
import json
from contextlib import redirect_stderr, redirect_stdout

import pytest

from bench import engine as bench
from demo.engine import parse_metrics


def _metrics(load_get_s: float, lookup_s: float, load_bytes: int, ttft_s: float, queue_s: float,
             prefill_s: float) -> dict[str, float]:
    labels = 'engine="0",model_name="large"'
    return parse_metrics("\n".join([
        f'vllm:mooncake_store_operation_time_seconds_sum{{{labels},operation="load_get",status="ok"}} {load_get_s}',
        f'vllm:mooncake_store_operation_time_seconds_sum{{{labels},operation="lookup_exists",status="ok"}} '
        f"{lookup_s}",
        f'vllm:mooncake_store_operation_time_seconds_sum{{{labels},operation="save_put",status="ok"}} 9.0',
        f'vllm:mooncake_store_operation_bytes_total{{{labels},operation="load_get",status="ok"}} {load_bytes}',
        f'vllm:mooncake_store_operation_bytes_total{{{labels},operation="save_put",status="ok"}} 123456789',
        f"vllm:time_to_first_token_seconds_sum{{{labels}}} {ttft_s}",
        f"vllm:request_queue_time_seconds_sum{{{labels}}} {queue_s}",
        f"vllm:request_prefill_time_seconds_sum{{{labels}}} {prefill_s}",
    ]))


def test_breakdown_takes_each_phase_from_its_own_operation():
    before = _metrics(1.0, 0.5, 1 << 20, 10.0, 2.0, 3.0)
    after = _metrics(1.25, 0.502, (1 << 20) + (8 << 20), 10.4, 2.3, 3.05)
    delta = bench.breakdown_delta(before, after)
    assert delta["store_load_ms"] == pytest.approx(250.0)
    assert delta["store_lookup_ms"] == pytest.approx(2.0)
    assert delta["store_save_check_ms"] == 0.0  # no save_exists sample: save_put is not mistaken for it
    assert delta["store_load_bytes"] == 8 << 20  # save_put bytes are not counted
    assert delta["server_ttft_ms"] == pytest.approx(400.0)
    assert (delta["queue_ms"], delta["prefill_ms"]) == (pytest.approx(300.0), pytest.approx(50.0))


def test_summarize_medians_ratio_and_hit_tokens():
    phases = [{"store_load_ms": ms, "server_ttft_ms": 100.0, "store_load_bytes": 8 << 20} for ms in (40.0, 50, 60)]
    figures = bench.summarize([3.0, 2.0, 4.0], [0.2, 0.1, 0.3], [1984, 1984, 1952], phases, prompt_tokens=2000,
                              local_s=[0.05, 0.04, 0.06])
    assert (figures["ttft_cold_ms"], figures["ttft_hit_ms"], figures["ratio"]) == (3000.0, 200.0, 15.0)
    assert (figures["ttft_local_hit_ms"], figures["ratio_local"]) == (50.0, 60.0)
    assert (figures["hit_tokens"], figures["hit_tokens_expected"]) == (5920, 3 * 1984)
    assert figures["hits_complete"] is False  # one hit loaded a block less
    assert bench.summarize([3.0], [0.2], [1984], phases[:1], prompt_tokens=2000)["hits_complete"] is True
    breakdown = figures["hit_breakdown"]
    assert breakdown["store_load_ms"] == 50.0 and breakdown["store_load_mib"] == 8.0
    assert breakdown["store_load_gb_s"] == pytest.approx(8 * 1.048576 / 50, abs=0.01)
    assert breakdown["client_minus_server_ms"] == 100.0
    assert figures["ttft_cold_ms_all"] == [3000.0, 2000.0, 4000.0]
    with pytest.raises(ValueError, match="one cold, hit"):
        bench.summarize([1.0], [], [], [], prompt_tokens=2000)
    with pytest.raises(ValueError, match="at least one"):
        bench.summarize([], [], [], [], prompt_tokens=2000)


def test_completed_puts_count_ended_puts_not_keys():
    metrics = parse_metrics("\n".join([
        "master_key_count 130", "master_batch_put_start_items_total 130",
        "master_batch_put_end_items_total 124", "master_batch_put_end_failed_items_total 2",
        "master_put_end_requests_total 3", "master_put_end_failures_total 1"]))
    assert bench.completed_puts(metrics) == 124 - 2 + 3 - 1
    assert bench.completed_puts({}) == 0


def test_expected_hit_tokens_leave_the_last_token_to_compute():
    assert bench.expected_hit_tokens(2000) == 1984
    assert bench.expected_hit_tokens(2048) == 2016  # a full last block is still recomputed for its last token
    assert bench.expected_hit_tokens(33) == 32


def test_segment_holds_every_prompt_below_the_eviction_watermark():
    for kv_per_token, pairs in ((512, 5), (4096, 5), (4096, 2), (4096, 20)):
        size = bench.segment_bytes_for(kv_per_token, 2000, pairs)
        stored = (2 * pairs + 3) * 63 * 32 * kv_per_token  # both instances' prompts, partial blocks rounded up
        assert size % (64 << 20) == 0 and size >= 256 << 20
        assert stored <= 0.5 * size  # the master evicts above 90 %


def test_parse_args_defaults_and_limits(capsys):
    args = bench.parse_args([])
    assert (args.models, args.prompt_tokens, args.pairs, args.store_mode) == (
        ["tiny", "large"], 2000, 5, "standalone-store")
    assert bench.parse_args(["--quick"]).pairs == 2
    assert bench.parse_args(["--models", "large", "--prompt-tokens", "4095"]).models == ["large"]
    for argv, message in ((["--prompt-tokens", "2048"], "between 33 and 2047"),  # the tiny model's length
                          (["--models", "large", "--prompt-tokens", "4096"], "between 33 and 4095"),
                          (["--models", "huge"], "--models takes distinct sizes"),
                          (["--models", "tiny,tiny"], "--models takes distinct sizes"),
                          (["--pairs", "-1"], "--pairs must be at least 1")):
        with pytest.raises(SystemExit) as info:
            bench.parse_args(argv)
        assert info.value.code == 2
        assert message in capsys.readouterr().err


def _figures(cold_ms: float, hit_ms: float, loaded: int = 1984) -> dict:
    phases = [{"store_load_ms": 20.0, "store_lookup_ms": 1.0, "server_ttft_ms": hit_ms - 5, "queue_ms": 25.0,
               "prefill_ms": 10.0, "store_save_check_ms": 1.0, "store_load_bytes": 8 << 20}]
    return dict(bench.summarize([cold_ms / 1000], [hit_ms / 1000], [loaded], phases, prompt_tokens=2000,
                                local_s=[0.03]), kv_bytes_per_token=4096)


def test_main_prints_each_model_then_one_json_line(monkeypatch):
    from bench import engine_ingest

    def fake_measure(args, workdir):
        result = {"bench": "engine", "prompt_tokens": args.prompt_tokens, "loadavg_start": [0.5, 0, 0],
                  "loadavg_end": [0.7, 0, 0]}
        for size, (cold, hit) in zip(args.models, ((90.0, 60.0), (3000.0, 150.0)), strict=True):
            result[size] = _figures(cold, hit)
            for line in bench.human_lines(size, result[size], args.prompt_tokens):
                print(line)
        return result

    monkeypatch.setattr(bench, "measure", fake_measure)
    monkeypatch.setattr(engine_ingest, "run", lambda quick: {"tiny": "not replaced", "ingest_blocks_per_s": 7})
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        assert bench.main(["--quick"]) == 0
    lines = out.getvalue().strip().splitlines()
    result = json.loads(lines[-1])
    for size, ratio in (("tiny", 1.5), ("large", 20.0)):
        assert {"ttft_cold_ms", "ttft_hit_ms", "ratio", "hit_tokens"} <= set(result[size])
        assert result[size]["ratio"] == ratio and result[size]["hit_tokens"] == 1984
        assert any(line.startswith(f"{size}: TTFT of a 2000-token prompt") and f"cold/hit {ratio}x" in line
                   for line in lines)
        assert any(line.startswith(f"{size}: a Store hit's time") for line in lines)
    assert result["ingest_blocks_per_s"] == 7  # engine_ingest's keys are merged, never over the bench's own
    assert "TTFT cold/hit, 2000-token prompts: tiny 1.5x (90.0 / 60.0 ms), large 20.0x (3000.0 / 150.0 ms)" \
        in out.getvalue()


def test_main_fails_when_the_hits_did_not_come_from_the_store(monkeypatch, tmp_path):
    from bench import engine_ingest

    workdir = tmp_path / "work"
    workdir.mkdir()
    monkeypatch.setattr(bench.tempfile, "mkdtemp", lambda prefix: str(workdir))
    monkeypatch.setattr(bench, "measure", lambda args, workdir: {
        "loadavg_start": [1.0], "loadavg_end": [1.0], "tiny": _figures(90.0, 60.0),
        "large": _figures(3000.0, 2900.0, loaded=0)})  # e.g. another engine answered the lookups
    monkeypatch.setattr(engine_ingest, "run", lambda quick: {})
    out = io.StringIO()
    with redirect_stdout(out):
        assert bench.main([]) == 1
    assert "error: large: the hit requests loaded fewer tokens from the Store than expected" in out.getvalue()
    assert workdir.is_dir()  # the logs are kept
    assert json.loads(out.getvalue().strip().splitlines()[-1])["large"]["hits_complete"] is False
