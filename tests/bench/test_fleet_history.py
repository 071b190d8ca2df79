"""bench/fleet_history.py's occupancy summed over nodes against the rollup's own: the 1-minute rows it loads have the
keys and samples ``dashboard.telemetry.series`` writes from the same samples, and the bytes too where the samples
are 1-minute rows (PostgreSQL only: the loader is set-based PostgreSQL)."""
from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection

from bench.fleet_history import fleet_scopes, load_history
from dashboard.models import ScopeSeries
from dashboard.telemetry import series

pytestmark = pytest.mark.django_db
NOW = datetime(2026, 11, 30, 12, 0, 7, tzinfo=UTC)


def _minute_rows() -> dict:
    return {(row.ts, row.tenant_id, row.served_model_name, row.namespace, row.request_group):
            (row.bytes, row.samples) for row in ScopeSeries.objects.filter(width=60)}


@pytest.mark.skipif(connection.vendor != "postgresql", reason="the loader is PostgreSQL's (COPY, generate_series)")
def test_loaded_minute_series_is_what_the_rollup_writes_from_the_loaded_samples(settings):
    settings.KVPOOL_ROLLUP_RAW_AFTER_SECONDS = 600
    settings.KVPOOL_ROLLUP_MINUTE_AFTER_SECONDS = 3600
    counts = load_history(1, ["node-a", "node-b"], fleet_scopes(10, tenants=2), per_node=4, now=NOW)
    assert counts["series_60"] > 0 and counts["series_21600"] > 0
    # from the 1-minute horizon on the loaded samples are 1-minute and raw rows, as when the rollup summed them
    # (before it, 1-hour rows: the loader's series there is what the rollup wrote while they were raw)
    first = datetime(2026, 11, 30, 11, tzinfo=UTC)
    loaded = {key: value for key, value in _minute_rows().items() if key[0] >= first}
    assert min(key[0] for key in _minute_rows()) < first
    last = max(key[0] for key in loaded) + timedelta(minutes=1)
    ScopeSeries.objects.filter(width=60).delete()
    series._write(ScopeSeries.Width.MINUTE, first, last)
    written = _minute_rows()
    assert loaded.keys() == written.keys()
    assert {key: value[1] for key, value in loaded.items()} == {key: value[1] for key, value in written.items()}
    raw_from = NOW - timedelta(seconds=600)  # before it the samples are 1-minute rows valued at the minute's start
    assert {key: value for key, value in loaded.items() if key[0] < raw_from - timedelta(minutes=1)} == {
        key: value for key, value in written.items() if key[0] < raw_from - timedelta(minutes=1)}
