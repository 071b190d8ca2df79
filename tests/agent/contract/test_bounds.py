"""The upper bounds of agent → dashboard messages (``MAX_BYTES``, ``MAX_COUNT``, ``MAX_SEQUENCE``, ``Text``): every
integer field bounded, so fleet-wide SQL sums fit in 64 bits; ``clamped``/``printable``, what the agent sends."""
from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from pydantic import BaseModel

from agent.contract.messages import (
    MAX_BYTES,
    MAX_COUNT,
    MAX_SEQUENCE,
    Ack,
    Heartbeat,
    InstanceStats,
    MessageError,
    PurgeResult,
    Report,
    ScopeOccupancy,
    clamped,
    parse_ingest,
    printable,
)
from tests.support.messages import ack, heartbeat, report

AGENT_MODELS: list[type[BaseModel]] = [Ack, Report, ScopeOccupancy, InstanceStats, Heartbeat, PurgeResult]


def _int_bounds(model: type[BaseModel]) -> dict[str, Any]:
    """Field name -> the ``maximum`` of the field (or of its ``dict`` values) in ``model``'s JSON schema."""
    out = {}
    for name, prop in model.model_json_schema()["properties"].items():
        for option in prop.get("anyOf", [prop]):
            option = option.get("additionalProperties", option) if option.get("type") == "object" else option
            if option.get("type") == "integer":
                out[name] = option.get("maximum")
    return out


@pytest.mark.parametrize("model", AGENT_MODELS, ids=lambda m: m.__name__)
def test_every_integer_an_agent_sends_has_an_upper_bound_that_a_fleet_can_sum(model):
    bounds = _int_bounds(model)
    assert bounds, model
    for name, maximum in bounds.items():
        if name == "schema":
            continue
        assert maximum is not None, f"{model.__name__}.{name} has no upper bound"
        assert maximum <= MAX_SEQUENCE
    assert (2 ** 15 - 1) * max(MAX_BYTES, MAX_COUNT) <= 2 ** 63 - 1  # what the docstring promises


@pytest.mark.parametrize("message, field, value", [
    (ack, "sequence", MAX_SEQUENCE + 1), (ack, "version", MAX_SEQUENCE + 1), (ack, "version", -MAX_SEQUENCE - 1),
    (ack, "applied_version", 2 ** 63), (ack, "error", "x\x00"), (ack, "error", "\x1b[2J"), (ack, "reason", "a\x07"),
    (ack, "digest", "d" * 65), (report, "sequence", 2 ** 70), (report, "unknown_topic_blocks", MAX_COUNT + 1),
    (report, "applied_version", MAX_SEQUENCE + 1), (heartbeat, "outbox_pending", 2 ** 63),
    (heartbeat, "hostname", "gpu\x00"), (heartbeat, "applied_digest", "a\x7f"),
])
def test_parse_ingest_refuses_values_over_the_bounds_naming_the_field(message, field, value):
    raw = {**message(secret=None), field: value}
    with pytest.raises(MessageError) as info:
        parse_ingest(raw)
    assert field in str(info.value) and "\x00" not in str(info.value)


def test_values_at_the_bounds_and_tabs_newlines_are_accepted():
    parsed = parse_ingest({**ack(secret=None), "sequence": MAX_SEQUENCE, "version": -MAX_SEQUENCE,
                           "error": "a\n\tb\r\n", "applied_version": MAX_SEQUENCE})
    assert isinstance(parsed, Ack) and parsed.sequence == MAX_SEQUENCE and parsed.error == "a\n\tb\r\n"
    stats = {"instance_id": "1", "observed_since": datetime(2026, 1, 1, tzinfo=UTC), "messages": MAX_COUNT,
             "unknown_namespace_bytes": {"p@m": MAX_BYTES}, "attributed_by_group": {"g": MAX_COUNT}}
    InstanceStats.model_validate(stats)
    for name, value in (("messages", MAX_COUNT + 1), ("unknown_namespace_bytes", {"p@m": MAX_BYTES + 1}),
                        ("attributed_by_group", {"g": MAX_COUNT + 1}), ("last_error", "\x00")):
        with pytest.raises(ValueError):
            InstanceStats.model_validate({**stats, name: value})


def test_clamped_lowers_integers_over_their_bound_and_keeps_the_rest():
    values = {"tenant_id": "acme", "bytes": 2 ** 60, "blocks": 7, "hit_blocks": 2 ** 63, "extra": 2 ** 70}
    assert clamped(ScopeOccupancy, values) == {"tenant_id": "acme", "bytes": MAX_BYTES, "blocks": 7,
                                               "hit_blocks": MAX_COUNT, "extra": 2 ** 70}
    stats = clamped(InstanceStats, {"events": 2 ** 50, "attributed_by_group": {"g": 2 ** 64, "h": 1},
                                    "unknown_namespace_bytes": {"p@m": 2 ** 64}, "last_error": "e"})
    assert stats == {"events": MAX_COUNT, "attributed_by_group": {"g": MAX_COUNT, "h": 1},
                     "unknown_namespace_bytes": {"p@m": MAX_BYTES}, "last_error": "e"}


def test_printable_replaces_control_characters_and_cuts():
    assert printable("a\x00b\x1b[0m\tc\nd\x7f") == "a\ufffdb\ufffd[0m\tc\nd\ufffd"
    assert printable("x" * 5000) == "x" * 2000 and printable("abc", 2) == "ab"
    Ack(node="n", sequence=1, sent_at=datetime(2026, 1, 1, tzinfo=UTC), status="rejected",
        error=printable("".join(map(chr, range(128)))))
