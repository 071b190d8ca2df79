"""Agent messages over the contract's bounds (``agent.contract.messages.MAX_BYTES`` / ``MAX_COUNT`` /
``MAX_SEQUENCE``, ``Text``) are refused as ``invalid`` on both ingest paths (msgspec rows, pydantic), so one signed
node can neither overflow the fleet's SQL sums nor push a batch into being stored one message at a time."""
from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from agent.contract.messages import MAX_BYTES, MAX_COUNT, MAX_SEQUENCE
from dashboard.models import ConfigAck, OccupancySample, Report
from dashboard.telemetry import drain, queries
from dashboard.telemetry.ingest import ingest
from dashboard.telemetry.rollup import rollup
from tests.support.messages import ack, register, report, sent

pytestmark = pytest.mark.django_db


def _report(node: str, sequence: int, at: datetime, **row: Any) -> dict[str, Any]:
    """A signed report of ``node`` whose first row has the ``row`` values (bypassing the model's checks)."""
    wire = report(node, sequence, at=at, secret=None)
    wire["scopes"][0].update(row)
    return sent(wire)


def _ack(node: str, **fields: Any) -> dict[str, Any]:
    """A signed ack of ``node`` with ``fields`` set on the wire (bypassing the model's checks)."""
    wire = ack(node, 1, version=1, secret=None)
    wire.update(fields)
    return sent(wire)


@pytest.mark.parametrize("value", [2 ** 63 - 1, MAX_BYTES + 1, "9223372036854775807", float(2 ** 62)],
                         ids=["int64-max", "bound+1", "numeric-string", "float"])
def test_a_report_over_the_byte_bound_is_refused_and_the_fleet_sums_still_work(value, caplog):
    """An integer is refused by the msgspec rows (``le``) and then by pydantic, which names the field; a numeric
    string or a float goes to pydantic's lax mode directly: both refuse, the honest node's rows are stored."""
    register("node-a", "hostile")
    now = datetime.now(UTC).replace(microsecond=0)
    with caplog.at_level(logging.WARNING, logger="kvpool.dashboard.ingest"):
        result = ingest([report("node-a", 1, at=now - timedelta(seconds=60)),
                         _report("hostile", 1, now - timedelta(seconds=60), bytes=value),
                         _report("hostile", 2, now - timedelta(seconds=30), bytes=value)])
    assert (result.reports, result.invalid, result.rejected) == (1, 2, {"invalid": 2})
    assert "scopes.0.bytes" in caplog.text and "acme" not in caplog.text  # no tenant named in the refusal
    assert not Report.objects.filter(node_name="hostile").exists()
    assert queries.tenant_bytes_now(now=now) == {"acme": 2 * 4096}
    assert queries.occupancy_series("15m").series
    rollup(now=now + timedelta(hours=3))


def test_many_reports_at_the_bounds_still_sum_in_sql():
    """Rows at exactly the bounds are stored, and summed over nodes, rows and reports without overflow."""
    nodes = [f"node-{i:02d}" for i in range(8)]
    register(*nodes)
    now = datetime.now(UTC).replace(microsecond=0)
    counters = {name: MAX_COUNT for name in ("blocks", "puts", "gets", "hit_blocks", "miss_blocks",
                                             "evicted_blocks", "in_flight_requests")}
    result = ingest([_report(node, seq, now - timedelta(seconds=10 * seq), bytes=MAX_BYTES,
                             orphaned_bytes=MAX_BYTES, **counters)
                     for node in nodes for seq in range(1, 5)])
    assert (result.reports, result.invalid) == (32, 0)
    assert OccupancySample.objects.filter(bytes=MAX_BYTES).count() == 32
    assert queries.tenant_bytes_now(now=now)["acme"] == 8 * (MAX_BYTES + 4096)
    assert queries.occupancy_series("15m").series
    rollup(now=now + timedelta(hours=3))


@pytest.mark.parametrize("fields", [
    {"sequence": 2 ** 70}, {"sequence": MAX_SEQUENCE + 1}, {"version": 2 ** 70}, {"version": -(2 ** 70)},
    {"applied_version": 2 ** 63}, {"error": "boom\x00"}, {"error": "a\x1b[31mred"}, {"digest": "d\x00"},
    {"digest": "d" * 65}, {"reason": "r" * 33},
], ids=lambda fields: next(iter(fields)))
def test_a_poison_ack_is_refused_and_its_batch_still_stored_in_one_transaction(fields, caplog, monkeypatch):
    register(*(f"node-{i:02d}" for i in range(20)), "hostile")
    good = [ack(f"node-{i:02d}", 1, version=1) for i in range(20)]
    calls: list[int] = []
    real = drain.ingest
    monkeypatch.setattr(drain, "ingest", lambda messages: calls.append(len(messages)) or real(messages))
    with caplog.at_level(logging.WARNING):
        result = drain.store_batch([*good, _ack("hostile", **fields)], [])
    assert calls == [21]  # one ingest, one transaction: the poison ack did not reach the database
    assert (result.acks, result.invalid, result.rejected) == (20, 1, {"invalid": 1})
    assert ConfigAck.objects.count() == 20 and not ConfigAck.objects.filter(node_name="hostile").exists()
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


def test_an_ack_at_the_bounds_with_tabs_and_newlines_is_stored():
    register("node-a")
    result = ingest([_ack("node-a", sequence=MAX_SEQUENCE, version=MAX_SEQUENCE, status="rejected",
                          reason="invalid", error="line 1\n\tline 2\r\n", applied_version=0, applied_digest="")])
    assert (result.acks, result.invalid) == (1, 0)
    assert ConfigAck.objects.get().error == "line 1\n\tline 2\r\n"
