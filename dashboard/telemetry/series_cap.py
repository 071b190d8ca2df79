"""The ``/metrics`` series cap (``KVPOOL_METRICS_MAX_SERIES``): which entities keep their own series.

An entity is what one series of a family describes: a cache scope, an engine instance, a node. The collector ranks
each kind of entity once per scrape (``dashboard.telemetry.metrics``: scopes by occupancy bytes, instances and
nodes in trouble first) and every family of that kind keeps the same top ``limit`` entities, so their series line
up. The rest are summed into one row whose entity labels all read ``OTHER`` (no release namespace or node name
can be ``(other)``: ``tenants.validators``), and ``Dropped`` counts, per family, the series folded into it
(``kvpool_metrics_series_dropped{family}``).

Families whose values do not add up (versions, ages, lags) get no ``OTHER`` row; ratios are recomputed from the
folded sums. Counters of the ``OTHER`` row are sums over a set of entities that changes when one enters or leaves
the top ``limit``: ``rate()`` on that row reads such a change as a counter reset or a jump (the entity's own series
starts or goes stale at the same time); ``kvpool_metrics_series_dropped`` changes with it.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from django.conf import settings
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

#: Label value of every entity label of the row that sums the folded entities.
OTHER = "(other)"

K = TypeVar("K")


def limit() -> int:
    """Series kept per family (``KVPOOL_METRICS_MAX_SERIES``, >= 0); 0: no cap."""
    return int(settings.KVPOOL_METRICS_MAX_SERIES)


@dataclass(frozen=True)
class Split(Generic[K]):
    """Entities in rank order: ``kept`` (the first ``limit``) keep their own series, ``folded`` go to ``OTHER``."""

    kept: list[K]
    folded: list[K]


def split(ranked: Sequence[K], cap: int) -> Split[K]:
    """Keep the first ``cap`` entities of ``ranked`` (best first); all of them when ``cap`` is 0 or they fit."""
    if cap <= 0 or len(ranked) <= cap:
        return Split(list(ranked), [])
    return Split(list(ranked[:cap]), list(ranked[cap:]))


def sum_fields(rows: Iterable[Mapping[str, int]], fields: Iterable[str]) -> dict[str, int]:
    """Field-wise sums of ``rows`` (the values of the ``OTHER`` row)."""
    names = tuple(fields)
    totals = dict.fromkeys(names, 0)
    for row in rows:
        for name in names:
            totals[name] += row[name]
    return totals


def exposed_name(family: Metric) -> str:
    """The name Prometheus stores the family's samples under (counters end in ``_total``)."""
    return f"{family.name}_total" if isinstance(family, CounterMetricFamily) else family.name


class Dropped:
    """Series folded into ``OTHER`` rows this scrape, per capped family (0 when none was)."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}

    def add(self, family: Metric, series: int) -> None:
        """Record ``series`` (>= 0) folded series of ``family``; call it for every capped family."""
        name = exposed_name(family)
        self.counts[name] = self.counts.get(name, 0) + series

    def family(self) -> GaugeMetricFamily:
        """``kvpool_metrics_series_dropped{family}``."""
        gauge = GaugeMetricFamily("kvpool_metrics_series_dropped", "Series summed into the (other) row of the "
                                  "family by KVPOOL_METRICS_MAX_SERIES this scrape (0: none)", labels=["family"])
        for name, count in sorted(self.counts.items()):
            gauge.add_metric([name], count)
        return gauge
