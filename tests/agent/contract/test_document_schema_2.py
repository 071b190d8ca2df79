"""Config documents of schema 2 (launch specs, node settings), schema-1 documents still applied, and the launch spec
as the one definition the registry renders and the agent writes."""

from __future__ import annotations

import pytest

from agent.contract.messages import (
    DOCUMENT_SCHEMA_VERSION,
    DOCUMENT_SCHEMAS,
    ConfigDocument,
    InstanceStats,
    LaunchSpec,
    MessageError,
    NodeSettings,
    Report,
    parse_document,
    parse_ingest,
)
from tests.support.messages import T0, document, instance

LAUNCH = {"instance_id": "1", "argv": ["python", "-m", "vllm.entrypoints.openai.api_server"],
          "env": {"VLLM_HOST_IP": "127.0.0.1"}, "file_env": {"MOONCAKE_CONFIG_PATH": "mooncake.json"},
          "files": {"mooncake.json": "{}\n"}, "user": "kvpool-t1"}
SETTINGS = {"kv_events_port": 5557, "store_mode": "standalone-store",
            "store_client_argv": ["mooncake_client", "--port=50052", "--global_segment_size=67108864"]}


def _doc(**changes) -> dict:
    doc = document(secret=None)
    doc["instances"][0]["launch"] = dict(LAUNCH)
    doc["node_settings"] = dict(SETTINGS)
    doc.update(changes)
    return doc


def test_the_dashboard_writes_schema_2_and_agents_read_1_and_2():
    assert DOCUMENT_SCHEMA_VERSION == 2 and DOCUMENT_SCHEMAS == (1, 2)
    parsed = parse_document(_doc())
    assert parsed.schema_ == 2 and parsed.instances[0].launch == LaunchSpec.from_dict(LAUNCH)
    assert parsed.node_settings == NodeSettings(**SETTINGS)
    old = document(secret=None) | {"schema": 1}
    assert parse_document(old).node_settings is None and parse_document(old).instances[0].launch is None
    with pytest.raises(MessageError, match="unsupported schema 3"):
        parse_document(_doc(schema=3))


@pytest.mark.parametrize(("change", "fragment"), [
    ({"schema": 1}, "needs document schema 2"),
    ({"node_settings": {**SETTINGS, "store_client_argv": None}}, "store_client_argv: required"),
    ({"node_settings": {**SETTINGS, "store_mode": "embedded"}}, "only a standalone-store node"),
    ({"node_settings": {**SETTINGS, "kv_events_port": 0}}, "node_settings.kv_events_port"),
    ({"node_settings": {**SETTINGS, "store_mode": "shared"}}, "node_settings.store_mode"),
])
def test_node_settings_are_checked(change, fragment):
    with pytest.raises(MessageError, match=fragment):
        parse_document(_doc(**change))


@pytest.mark.parametrize(("launch", "fragment"), [
    ({"instance_id": "2"}, "is not the instance's id"),
    ({"argv": []}, "argv"),
    ({"env": {"BAD NAME": "x"}}, "invalid environment variable name"),
    ({"files": {"launch.sh": "x"}}, "invalid instance file name"),
    ({"files": {"../x": "x"}}, "invalid instance file name"),
    ({"file_env": {"MOONCAKE_CONFIG_PATH": "missing.json"}}, "not one of the instance's files"),
    ({"extra": 1}, "extra"),
])
def test_launch_specs_are_checked_before_anything_is_written(launch, fragment):
    doc = _doc()
    doc["instances"][0]["launch"] = {**LAUNCH, **launch}
    with pytest.raises(MessageError, match=fragment):
        parse_document(doc)


def test_a_schema_1_document_reads_back_unchanged_but_for_the_new_defaults():
    old = document(secret=None) | {"schema": 1}
    old["instances"][0].pop("launch")
    old.pop("node_settings")
    wire = ConfigDocument.model_validate(old).to_wire()
    assert wire["schema"] == 1 and wire["node_settings"] is None and wire["instances"][0]["launch"] is None
    assert {k: v for k, v in wire.items() if k not in ("signature", "node_settings", "instances")} == \
        {k: v for k, v in old.items() if k != "instances"}


def test_reports_carry_instance_stats():
    stats = InstanceStats(instance_id="7", tenant_id="acme", served_model_name="m", namespace="ns",
                          observed_since=T0, blocks_seen=5, attributed=4, unknown_salt=1,
                          attributed_by_group={"default": 4}, store_keys={"save_put": 5})
    wire = Report(node="node-a", sequence=1, sent_at=T0, started_at=T0, instances=[stats],
                  unknown_topic_messages=2, unknown_topic_blocks=3).to_wire()
    parsed = parse_ingest(wire)
    assert parsed.instances == [stats] and parsed.unknown_topic_blocks == 3
    with pytest.raises(MessageError, match="instances.0.hash_mismatch"):
        parse_ingest({**wire, "instances": [{**wire["instances"][0], "hash_mismatch": -1}]})
    assert InstanceStats.OUTCOMES[0] == "attributed" and len(InstanceStats.OUTCOMES) == 6


def test_the_registry_launch_spec_is_the_contract_one():
    from tenants.rendering import LaunchSpec as Rendered

    assert Rendered is LaunchSpec
    spec = LaunchSpec(**{**LAUNCH, "argv": tuple(LAUNCH["argv"])})
    assert spec.argv == tuple(LAUNCH["argv"]) and spec.to_dict() == LAUNCH
    assert instance().launch is None


def test_budget_shares_are_written_as_node_budget_bytes_only():
    """The per-node share of a budget is ``node_budget_bytes`` on the wire (``budget_bytes`` is the registry's
    total); the old name is read, never written."""
    written = document(secret=None)
    [spec] = written["instances"]
    assert spec["node_budget_bytes"] == 1 << 28 and "budget_bytes" not in spec
    assert all("node_budget_bytes" in g and "budget_bytes" not in g for g in spec["request_groups"])
    spec["budget_bytes"] = spec.pop("node_budget_bytes")
    spec["request_groups"][0] = {"name": "default", "cache_salt": "", "budget_bytes": 5}
    parsed = parse_document(written)
    assert parsed.instances[0].node_budget_bytes == 1 << 28
    assert parsed.instances[0].request_groups[0].node_budget_bytes == 5
    again = parsed.to_wire()["instances"][0]
    assert again["node_budget_bytes"] == 1 << 28 and "budget_bytes" not in again
    assert again["request_groups"][0]["node_budget_bytes"] == 5 and "budget_bytes" not in again["request_groups"][0]
