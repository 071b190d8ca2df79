"""The recorded engines' /metrics counters (vLLM 0.32.0 CPU + MooncakeStoreConnector)."""

from __future__ import annotations

import pytest

from agent.engines.vllm.metrics import EngineMetrics, MetricsError, MetricsTracker, parse_metrics
from tests.support.captures import RUNS, meta


def metrics_text(run: str, scale: float = 1.0) -> str:
    lines = meta(run)["engine_metrics"]
    if scale == 1.0:
        return "\n".join(lines) + "\n"
    out = []
    for line in lines:
        name, value = line.rsplit(" ", 1)
        out.append(f"{name} {float(value) * scale}")
    return "\n".join(out) + "\n"


def test_captured_counters_parse() -> None:
    m = parse_metrics(metrics_text("embedded-int"), scraped_at=5.0)
    assert (m.prefix_cache_queries, m.prefix_cache_hits) == (760.0, 96.0)
    assert (m.external_prefix_cache_queries, m.external_prefix_cache_hits) == (664.0, 0.0)
    assert m.store_keys == {"lookup_exists": 22.0, "save_exists": 22.0, "save_put": 19.0}
    assert m.store_bytes["save_put"] == 311296.0 == 19 * 16384
    assert m.store_failed_keys == {"lookup_exists": 0.0, "save_exists": 0.0, "save_put": 0.0}
    assert m.external_hit_rate == 0.0 and m.prefix_hit_rate == pytest.approx(96 / 760)
    assert "vllm:external_prefix_cache_hits_total" in m.found and m.scraped_at == 5.0


@pytest.mark.parametrize("run", RUNS)
def test_store_put_keys_equal_the_store_events(run: str) -> None:
    m = parse_metrics(metrics_text(run))
    assert m.store_keys["save_put"] == len(meta(run)["store_keys"]["keys_present"])


def test_type_lines_and_several_series_are_summed() -> None:
    text = ("# HELP vllm:prefix_cache_queries Prefix cache queries.\n# TYPE vllm:prefix_cache_queries counter\n"
            + metrics_text("embedded-int")
            + 'vllm:prefix_cache_queries_total{engine="1",model_name="var/tiny-llama"} 40.0\n')
    m = parse_metrics(text)
    assert m.prefix_cache_queries == 800.0


def test_deltas_between_scrapes_and_restarts() -> None:
    before = parse_metrics(metrics_text("embedded-int"))
    after = parse_metrics(metrics_text("embedded-int", 2.0))
    d = after.delta(before)
    assert not d.reset and d.prefix_cache_queries == 760.0 and d.store_keys["save_put"] == 19.0
    restarted = parse_metrics(metrics_text("standalone-store"))  # lower counters: a new engine process
    d2 = restarted.delta(after)
    assert d2.reset and d2.prefix_cache_queries == 300.0 and d2.store_keys["save_put"] == 8.0


def test_tracker_sums_deltas_and_counts_failures() -> None:
    texts = iter([metrics_text("embedded-int"), OSError("connection refused"), metrics_text("embedded-int", 2.0),
                  "this is { not prometheus", metrics_text("standalone-store")])

    def fetch(url: str, timeout: float) -> str:
        item = next(texts)
        if isinstance(item, Exception):
            raise item
        return item

    t = MetricsTracker("http://127.0.0.1:1/metrics", fetch=fetch)
    assert t.scrape() is None  # baseline
    assert t.scrape() is None and t.failures == 1 and "refused" in t.last_error
    assert t.scrape().store_keys["save_put"] == 19.0
    assert t.scrape() is None and t.failures == 2
    assert t.scrape().reset and t.resets == 1
    snap = t.snapshot()
    assert snap["totals"]["store_keys"]["save_put"] == 27.0 and snap["scrapes"] == 3
    assert snap["last"]["prefix_cache_queries"] == 300.0


def test_bad_text_raises_a_metrics_error() -> None:
    with pytest.raises(MetricsError):
        parse_metrics("vllm:prefix_cache_queries_total{engine= 1\n")


def test_empty_scrape_is_zero() -> None:
    assert parse_metrics("", scraped_at=1.0) == EngineMetrics(scraped_at=1.0)
