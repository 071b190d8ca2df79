"""dashboard.telemetry.exposition writes the bytes prometheus_client.generate_latest writes."""
from __future__ import annotations

import math

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

from dashboard.telemetry.exposition import text


class _Fixed:
    def __init__(self, families):
        self.families = families

    def collect(self):
        return iter(self.families)


def families():
    gauge = GaugeMetricFamily("kvpool_test_bytes", 'Help with a \\ backslash,\na newline and "quotes"',
                              labels=["tenant_id", "namespace", "b"])
    for values, value in (
            (["acme", "prod", "x"], 1500), (['quo"te', "back\\slash", "new\nline"], 0.1),
            (["ünïcode ✓", "", "(other)"], 123456789012), (["a", "b", "c"], math.inf), (["a", "b", "d"], -math.inf),
            (["a", "b", "e"], math.nan), (["a", "b", "f"], 1e-9), (["a", "b", "g"], -3)):
        gauge.add_metric(values, value)
    counter = CounterMetricFamily("kvpool_test_blocks", "Blocks", labels=["node"])
    counter.add_metric(["node-a"], 7)
    counter.add_metric(["node-b"], 2**53 + 1)
    plain = GaugeMetricFamily("kvpool_test_up", "no labels")
    plain.add_metric([], 1)
    empty = CounterMetricFamily("kvpool_test_empty", "no samples", labels=["x"])
    return [gauge, counter, plain, empty]


def test_text_is_what_generate_latest_writes():
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Fixed(families()))
    assert text(families()) == generate_latest(registry)


def test_other_kinds_and_names_that_need_escaping_are_refused():
    histogram = HistogramMetricFamily("kvpool_test_seconds", "h", buckets=[("1", 1), ("+Inf", 2)], sum_value=3)
    with pytest.raises(ValueError, match="only gauge and counter"):
        text([histogram])
    odd = GaugeMetricFamily("kvpool_test", "odd label", labels=["bad-name"])
    odd.add_metric(["x"], 1)
    with pytest.raises(ValueError, match="needs escaping"):
        text([odd])
