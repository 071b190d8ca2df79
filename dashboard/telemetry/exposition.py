"""Prometheus text exposition (format 0.0.4) of gauge and counter families, faster than ``generate_latest``.

``prometheus_client.generate_latest`` validates and escapes every label name of every sample (about 80 µs a sample
under load): at 80,000 series that alone passes the one-second scrape budget. ``/metrics`` builds its families
with ``prometheus_client`` (``GaugeMetricFamily``, ``CounterMetricFamily``, label names its own constants) and
writes them here: the same bytes ``generate_latest`` writes for such families (labels sorted by name, values
escaped, ``floatToGoString``; ``tests/dashboard/telemetry/test_exposition.py`` compares them), the label names
checked and sorted once per family (its samples share them) into a line template.
"""
from __future__ import annotations

import re
from collections.abc import Iterable

from prometheus_client.core import Metric
from prometheus_client.utils import floatToGoString

#: Names Prometheus accepts without quoting (metric names may hold ':' too).
_LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
_METRIC_NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
_TYPES = {"gauge": "gauge", "counter": "counter"}


def _escape(value: str) -> str:
    if "\\" in value or "\n" in value or '"' in value:
        return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")
    return value


def _family_lines(metric: Metric) -> Iterable[str]:
    kind = _TYPES.get(metric.type)
    if kind is None:
        raise ValueError(f"{metric.name}: only gauge and counter families are written here, not {metric.type}")
    name = f"{metric.name}_total" if kind == "counter" else metric.name
    if not _METRIC_NAME.match(name):
        raise ValueError(f"metric name {name!r} needs escaping")
    documentation = metric.documentation.replace("\\", r"\\").replace("\n", r"\n")
    yield f"# HELP {name} {documentation}\n# TYPE {name} {kind}\n"
    template, order, names = "", (), None
    for sample in metric.samples:
        if sample.name != name or sample.timestamp is not None:
            raise ValueError(f"{metric.name}: sample {sample.name} is not a plain {kind} sample")
        labels = sample.labels
        if labels.keys() != names:
            names = frozenset(labels)
            order = tuple(sorted(names))  # the family's label names, sorted as generate_latest sorts them
            for label in order:
                if not _LABEL_NAME.match(label):
                    raise ValueError(f"{metric.name}: label name {label!r} needs escaping")
            labelled = "{{" + ",".join(f'{key}="{{}}"' for key in order) + "}}" if order else ""
            template = f"{name}{labelled} {{}}\n"
        yield template.format(*[_escape(labels[key]) for key in order], floatToGoString(sample.value))


def text(families: Iterable[Metric]) -> bytes:
    """The exposition of ``families`` (gauges and counters without timestamps; ``ValueError`` for anything else or
    a name that would need escaping), UTF-8."""
    return "".join(line for metric in families for line in _family_lines(metric)).encode("utf-8")
