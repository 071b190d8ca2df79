"""Master up/down and restart detection (``dashboard.master.health``), on the Checks page and in ``/metrics``."""
from __future__ import annotations

import time
from datetime import timedelta
from types import SimpleNamespace

import pytest
from django.utils import timezone

from agent.sim.master import MasterProcess
from dashboard.checklist import run_checks
from dashboard.master.health import MasterMetricsError, parse_master_metrics, probe_master, restart_reason
from dashboard.telemetry.metrics import render

MIB = 1 << 20
TEXT = """# HELP master_key_count Total number of keys
# TYPE master_key_count gauge
master_key_count 12
master_total_capacity_bytes 33554432
master_allocated_bytes 1024
# TYPE master_exist_key_requests_total counter
master_exist_key_requests_total 40
master_put_start_requests_total 12
master_remount_segment_requests_total 0
mooncake_tenant_quota_requested_bytes{tenant_id="acme"} 1048576
"""


def test_parse_reads_gauges_and_sums_the_request_counters():
    reading = parse_master_metrics(TEXT)
    assert (reading.key_count, reading.capacity_bytes, reading.allocated_bytes) == (12, 32 * MIB, 1024)
    assert reading.counters_total == 52 and reading.remounts_total == 0
    with pytest.raises(MasterMetricsError, match="master_key_count"):
        parse_master_metrics("process_cpu_seconds_total 3\n")


def test_restart_reasons():
    before = SimpleNamespace(counters_total=52.0, remounts_total=0.0, key_count=12)
    same = parse_master_metrics(TEXT)
    assert restart_reason(before, same) == ""
    assert restart_reason(None, same) == ""
    reset = parse_master_metrics(TEXT.replace(" 40\n", " 1\n"))
    assert restart_reason(before, reset) == ("the master restarted (its request counters went back from 52 to 13); "
                                             "keys 12 → 12")
    # remounts grow at a normal start too (the agents mount their segments): no evidence of a restart
    remounted = parse_master_metrics(TEXT.replace("segment_requests_total 0", "segment_requests_total 2"))
    assert restart_reason(before, remounted) == ""


def metric(text: str, name: str) -> float | None:
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    return None


def checks() -> dict:
    return {check.key: check for check in run_checks()}


@pytest.mark.django_db
@pytest.mark.integration
def test_a_killed_and_restarted_master_is_flagged_on_checks_and_metrics(settings):
    from agent.datapath.store import open_store

    with MasterProcess({"acme": 12 * MIB}) as master:
        url = master.metrics_url
        client = open_store(master.endpoints(global_segment_size=16 * MIB, local_buffer_size=4 * MIB), "acme")
        try:
            client.exists([f"probe-{i}" for i in range(5)])  # request counters above zero
            row, restart = probe_master(url)
            assert row.up and not restart and row.restarts == 0 and row.capacity_bytes == 16 * MIB
            assert checks()["master_healthy"].passed
            text = render().decode()
            assert metric(text, "kvpool_master_up") == 1 and metric(text, "kvpool_master_restarts_total") == 0

            master.kill()
            row, restart = probe_master(url)
            assert not row.up and not restart
            check = checks()["master_healthy"]
            assert not check.passed and "the master is down since" in check.details[0]
            assert metric(render().decode(), "kvpool_master_up") == 0

            master.start(keep_ports=True)
            killed = time.monotonic()
            while True:  # the first answer of the new master
                row, restart = probe_master(url)
                if row.up or time.monotonic() - killed > 15:
                    break
                time.sleep(0.5)
            assert restart.startswith("the master restarted (its request counters went back from ")
            assert row.up and row.restarts == 1
            check = checks()["master_healthy"]
            assert not check.passed and "every object in the pool was lost" in check.details[0]
            text = render().decode()
            assert metric(text, "kvpool_master_up") == 1 and metric(text, "kvpool_master_restarts_total") == 1
            time.sleep(1.5)  # the client remounts its segment: no second restart
            row, restart = probe_master(url)
            assert not restart and row.restarts == 1
        finally:
            client.close()
    settings.KVPOOL_MASTER_RESTART_FLAG_SECONDS = 60
    later = timezone.now() + timedelta(seconds=61)
    row.checked_at = later
    row.save()
    assert next(c for c in run_checks(later) if c.key == "master_healthy").passed


@pytest.mark.django_db
def test_a_stale_probe_fails_and_marks_the_master_not_up():
    from dashboard.models import MasterHealth

    MasterHealth.objects.create(pk=1, up=True, checked_at=timezone.now() - timedelta(seconds=60), key_count=3,
                                counters_total=5, remounts_total=0)
    check = checks()["master_healthy"]
    assert not check.passed and "no master probe for 60 s" in check.details[0]
    assert metric(render().decode(), "kvpool_master_up") == 0
