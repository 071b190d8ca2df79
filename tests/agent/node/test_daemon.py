"""agent.node.daemon: verify → validate → build → persist → swap; acks, telemetry, outbox."""
from __future__ import annotations

import logging

import pytest

from agent.contract.messages import parse_ingest
from agent.node.daemon import AppliedConfig, Daemon
from tests.support.messages import document, instance


class Broker:
    """Collects published batches; ``down`` makes publishing fail like a stopped Redis."""

    def __init__(self) -> None:
        self.down = False
        self.batches: list[list[dict]] = []

    def publish(self, messages):
        if self.down:
            raise ConnectionRefusedError("broker down")
        self.batches.append(list(messages))

    def messages(self, kind=None):
        return [m for batch in self.batches for m in batch if kind is None or m["kind"] == kind]


@pytest.fixture
def broker():
    return Broker()


@pytest.fixture
def daemon(tmp_path, broker):
    d = Daemon("node-a", "s3cret", tmp_path / "state", publish=broker.publish)
    yield d
    d.stop()


def test_applies_a_valid_document_and_acks(daemon, broker):
    ack = daemon.handle_document(document(version=1))
    assert ack["status"] == "applied" and ack["version"] == 1 and ack["applied_version"] == 1
    assert isinstance(daemon.current, AppliedConfig)
    assert daemon.current.version == 1 and list(daemon.current.bindings) == ["1"]
    daemon.flush()
    [sent] = broker.messages("ack")
    assert parse_ingest(sent).digest == daemon.applied_digest


@pytest.mark.parametrize(
    "mutate, reason",
    [
        (lambda d: d.pop("signature"), "unsigned"),
        (lambda d: d["instances"][0].update(tenant_id="intruder"), "bad_signature"),
    ],
)
def test_rejects_unsigned_and_tampered_with_logged_reason(daemon, caplog, mutate, reason):
    doc = document(version=1)
    mutate(doc)
    with caplog.at_level(logging.WARNING, logger="kvpool.agent.daemon"):
        ack = daemon.handle_document(doc)
    assert ack["status"] == "rejected" and ack["reason"] == reason
    assert daemon.current is None
    assert reason in caplog.text and "rejected config document" in caplog.text


def test_rejects_stale_conflicting_and_foreign_documents(daemon):
    assert daemon.handle_document(document(version=5))["status"] == "applied"
    stale = daemon.handle_document(document(version=4))
    assert (stale["status"], stale["reason"], stale["applied_version"]) == ("rejected", "stale", 5)
    conflict = daemon.handle_document(document(version=5, instances=[instance("2")]))
    assert conflict["reason"] == "version_conflict"
    foreign = daemon.handle_document(document(node="node-b", version=6))
    assert foreign["reason"] == "wrong_node"
    assert daemon.current.version == 5


def test_redelivery_of_applied_version_is_acked_again(daemon):
    first = daemon.handle_document(document(version=3))
    again = daemon.handle_document(document(version=3))
    assert again["status"] == "applied" and again["digest"] == first["digest"]
    assert again["sequence"] == first["sequence"] + 1


def test_invalid_and_unknown_schema_documents(daemon):
    from agent.contract import signing

    doc = document(version=1, secret=None)
    doc["instances"][0]["role"] = "sometimes"
    ack = daemon.handle_document(signing.signed(doc, "s3cret"))
    assert ack["reason"] == "invalid" and "instances.0.role" in ack["error"]
    doc = document(version=1, secret=None)
    doc["schema"] = 99
    assert daemon.handle_document(signing.signed(doc, "s3cret"))["reason"] == "unsupported_schema"
    assert daemon.handle_document(["not", "a", "dict"])["reason"] == "invalid"


def test_applied_version_survives_restart(tmp_path, broker):
    state = tmp_path / "state"
    first = Daemon("node-a", "s3cret", state, publish=broker.publish)
    first.handle_document(document(version=7))
    first.stop()
    second = Daemon("node-a", "s3cret", state, publish=broker.publish)
    try:
        assert second.current.version == 7
        assert second.handle_document(document(version=6))["reason"] == "stale"
        assert second.handle_document(document(version=8))["status"] == "applied"
    finally:
        second.stop()


def test_a_second_agent_cannot_share_the_state_dir(daemon, broker):
    with pytest.raises(RuntimeError, match="in use"):
        Daemon("node-a", "s3cret", daemon.state_dir, publish=broker.publish)


def test_swap_leaves_a_held_config_untouched(daemon):
    """A batch that took ``daemon.current`` keeps its bindings while a newer document is applied."""
    daemon.handle_document(document(version=1, instances=[instance("1", namespace="old-ns")]))
    in_batch = daemon.current
    daemon.handle_document(document(version=2, instances=[instance("1", namespace="new-ns")]))
    old, new = in_batch.bindings["1"][(0, "app-a")], daemon.current.bindings["1"][(0, "app-a")]
    assert (old.namespace, new.namespace) == ("old-ns", "new-ns")
    assert old.cache_salt == "salt-a" and old.keys_for(b"\x01" * 32)[0].startswith("old-ns@Qwen3-8B@")
    with pytest.raises(TypeError):
        in_batch.bindings["1"] = None  # read-only mapping
    with pytest.raises(AttributeError):
        old.namespace = "changed"  # frozen key space


def test_sglang_instance_binds_with_the_sglang_page_hash(daemon):
    spec = instance("3").model_copy(update={"engine": "sglang", "hash_algo": "sha256"})
    assert daemon.handle_document(document(version=1, instances=[spec]))["status"] == "applied"
    bound = daemon.current.bindings["3"][(0, "default")]
    # the registry's "sha256" reaches the agent unchanged; with engine "sglang" it is SGLang's page hash
    assert bound.hash_algo == "sha256" and bound.hasher.engine == "sglang"
    assert bound.keys_for(b"\x02" * 32)[0].endswith("_0_k")


def test_failed_binder_keeps_the_old_config(tmp_path, broker):
    def binder(spec):
        if spec.namespace == "broken":
            raise RuntimeError("cannot bind")
        return spec.namespace

    d = Daemon("node-a", "s3cret", tmp_path / "s", publish=broker.publish, binder=binder)
    try:
        d.handle_document(document(version=1))
        ack = d.handle_document(document(version=2, instances=[instance("1", namespace="broken")]))
        assert ack["reason"] == "apply_failed" and "cannot bind" in ack["error"]
        assert d.current.version == 1 and d.current.bindings["1"] == "prod-2026-07"
    finally:
        d.stop()


def test_reports_cover_bound_namespaces_and_ledger_rows(tmp_path, broker):
    ledger = [{"tenant_id": "acme", "served_model_name": "qwen3-8b", "namespace": "prod-2026-07",
               "request_group": "app-a", "blocks": 4, "bytes": 4096, "hit_blocks": 3, "miss_blocks": 1}]
    d = Daemon("node-a", "s3cret", tmp_path / "s", publish=broker.publish, snapshot=lambda: ledger)
    try:
        d.handle_document(document(version=1))
        d.report_now()
        d.flush()
        [rep] = broker.messages("report")
        by_group = {row["request_group"]: row for row in rep["scopes"]}
        assert set(by_group) == {"default", "app-a"}
        assert by_group["app-a"]["bytes"] == 4096 and by_group["default"]["bytes"] == 0
        assert rep["applied_version"] == 1
    finally:
        d.stop()


def test_reports_carry_only_the_scopes_of_the_applied_document(tmp_path, broker):
    """The ledger still counts a release that left the document (retired, not yet purged) or a scope restored
    from an older document; the dashboard refuses rows its document does not carry, so they are not sent."""
    def row(namespace, group):
        return {"tenant_id": "acme", "served_model_name": "qwen3-8b", "namespace": namespace,
                "request_group": group, "blocks": 1, "bytes": 1024}

    ledger = [row("prod-2026-07", "app-a"), row("prod-2026-07", ""), row("prod-2026-07", "gone"),
              row("retired-2026-06", "app-a")]
    d = Daemon("node-a", "s3cret", tmp_path / "s", publish=broker.publish, snapshot=lambda: ledger)
    try:
        d.report_now()  # no document yet: nothing to speak for
        d.handle_document(document(version=1))
        d.report_now()
        d.flush()
        before, after = broker.messages("report")
        assert before["scopes"] == []
        rows = {(r["namespace"], r["request_group"]): r["bytes"] for r in after["scopes"]}
        assert rows == {("prod-2026-07", "app-a"): 1024, ("prod-2026-07", ""): 1024, ("prod-2026-07", "default"): 0}
    finally:
        d.stop()


def test_reports_carry_the_scopes_the_engines_were_launched_under_by_hand(tmp_path, broker):
    """An engine launched with a mistyped namespace (the simulator's launch overrides): its rows are sent for the
    dashboard to show; the retired release's rows still are not."""
    from agent.contract.scope import CacheScope

    def row(namespace, group):
        return {"tenant_id": "acme", "served_model_name": "qwen3-8b", "namespace": namespace,
                "request_group": group, "blocks": 1, "bytes": 1024}

    typo = CacheScope("acme", "qwen3-8b", "prod-2026-7", "app-a")
    ledger = [row("prod-2026-07", "app-a"), row("prod-2026-7", "app-a"), row("retired-2026-06", "app-a")]
    d = Daemon("node-a", "s3cret", tmp_path / "s", publish=broker.publish, snapshot=lambda: ledger,
               launched_scopes=lambda: {typo, typo._replace(request_group="")})
    try:
        d.handle_document(document(version=1))
        d.report_now()
        d.flush()
        (sent_report,) = broker.messages("report")
        rows = {(r["namespace"], r["request_group"]): r["bytes"] for r in sent_report["scopes"]}
        assert rows == {("prod-2026-07", "app-a"): 1024, ("prod-2026-7", "app-a"): 1024,
                        ("prod-2026-07", "default"): 0}
    finally:
        d.stop()


def test_reports_buffer_while_broker_is_down_and_survive_restart(tmp_path, broker):
    state = tmp_path / "s"
    d = Daemon("node-a", "s3cret", state, publish=broker.publish)
    broker.down = True
    sequences = [d.report_now() for _ in range(3)]
    assert d.flush() == 0 and not d.heartbeat_now()
    d.stop()
    d = Daemon("node-a", "s3cret", state, publish=broker.publish)
    try:
        sequences.append(d.report_now())
        broker.down = False
        assert d.flush() == 4
        first = sequences[0]
        assert [m["sequence"] for m in broker.messages("report")] == sequences == [first + i for i in range(4)]
    finally:
        d.stop()


def test_on_apply_hook_sees_each_new_config_and_cannot_break_the_apply(tmp_path, broker):
    seen = []

    def hook(applied):
        seen.append(applied.version)
        if applied.version == 2:
            raise RuntimeError("connector busy")

    d = Daemon("node-a", "s3cret", tmp_path / "s", publish=broker.publish, on_apply=hook)
    try:
        d.handle_document(document(version=1))
        assert d.handle_document(document(version=2))["status"] == "applied"
        d.handle_document(document(version=2))  # re-delivery: no swap, no hook
        assert seen == [1, 2] and d.applied_version == 2
    finally:
        d.stop()


def test_ledger_snapshot_feeds_reports(tmp_path, broker):
    from agent.datapath.ledger import Ledger

    ledger = Ledger()
    d = Daemon("node-a", "s3cret", tmp_path / "s", publish=broker.publish, ledger=ledger)
    try:
        d.handle_document(document(version=1))
        keyspace = d.current.bindings["1"][(0, "app-a")]
        ledger.record_lookup(keyspace, keyspace.trace_hashes([1, 2]), [False, False])
        d.report_now()
        d.flush()
        [rep] = broker.messages("report")
        row = next(row for row in rep["scopes"] if row["request_group"] == "app-a")
        assert row["miss_blocks"] == 2 and d.ledger is ledger
    finally:
        d.stop()


def test_corrupt_applied_state_refuses_to_start(tmp_path, broker):
    state = tmp_path / "s"
    state.mkdir()
    (state / "applied.json").write_text('{"version": "x"')
    with pytest.raises(RuntimeError, match="cannot resume"):
        Daemon("node-a", "s3cret", state, publish=broker.publish)


def test_everything_sent_is_signed_when_sent_and_the_outbox_keeps_it_unsigned(tmp_path, broker, monkeypatch):
    from datetime import datetime, timedelta

    from agent.contract import signing
    from agent.node import daemon as daemon_module

    d = Daemon("node-a", "s3cret", tmp_path / "s", publish=broker.publish)
    try:
        broker.down = True
        d.handle_document(document(version=1))
        d.report_now()
        assert d.flush() == 0
        stored = d.outbox.peek(10)
        assert [m["signature"] for m in stored] == ["", ""] and all(m["signed_at"] is None for m in stored)
        later = daemon_module.utcnow() + timedelta(hours=5)  # the broker comes back hours later
        monkeypatch.setattr(daemon_module, "utcnow", lambda: later)
        broker.down = False
        assert d.flush() == 2 and d.heartbeat_now()
        sent = broker.messages()
        assert [m["kind"] for m in sent] == ["ack", "report", "heartbeat"]
        for message in sent:
            signing.verify(message, "s3cret")  # the node's secret, over the message as sent
            with pytest.raises(signing.SignatureError):
                signing.verify(message, "another node's secret")
            assert datetime.fromisoformat(message["signed_at"]) == later  # stamped at delivery
            assert parse_ingest(message).signed_at == later
        assert [m["sent_at"] for m in sent[:2]] == [m["sent_at"] for m in stored]  # content as queued
    finally:
        d.stop()


def test_a_lost_state_directory_does_not_restart_sequences(tmp_path, broker):
    """A reinstalled node (new state dir) numbers above its old agent, so the dashboard keeps its messages."""
    old = Daemon("node-a", "s3cret", tmp_path / "old", publish=broker.publish)
    try:
        old_sequences = [old.report_now() for _ in range(3)]
    finally:
        old.stop()
    assert old_sequences[0] > 10**15  # microseconds since the epoch, not 1
    new = Daemon("node-a", "s3cret", tmp_path / "new", publish=broker.publish)
    try:
        assert new.report_now() > max(old_sequences)
    finally:
        new.stop()


def test_heartbeat_of_a_healthy_agent_reports_an_empty_outbox(tmp_path, broker):
    """The telemetry thread delivers the report it just queued before it counts the outbox for the heartbeat."""
    import time

    d = Daemon("node-a", "s3cret", tmp_path / "s", publish=broker.publish, report_interval=60,
               heartbeat_interval=60)
    d.start()
    try:
        deadline = time.monotonic() + 10
        while not broker.messages("heartbeat") and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        d.stop()
    assert broker.messages("report") and broker.messages("heartbeat")[0]["outbox_pending"] == 0


def test_a_document_of_the_previous_dashboard_applies_with_its_budget_shares_and_resumes(tmp_path, broker):
    """Dashboards before the rename wrote each node's budget share as ``budget_bytes``; during a rolling upgrade
    such a document (or the agent's stored state) still applies, read as ``node_budget_bytes``."""
    from agent.contract import signing

    doc = document(version=1, secret=None)
    spec = doc["instances"][0]
    spec["budget_bytes"] = spec.pop("node_budget_bytes")
    group = spec["request_groups"][1]
    del group["node_budget_bytes"]
    group["budget_bytes"] = 1 << 20
    old = signing.signed(doc, "s3cret")
    state = tmp_path / "state"
    first = Daemon("node-a", "s3cret", state, publish=broker.publish)
    try:
        ack = first.handle_document(old)
        assert ack["status"] == "applied" and ack["digest"] == signing.document_digest(old)
    finally:
        first.stop()
    second = Daemon("node-a", "s3cret", state, publish=broker.publish)
    try:
        [applied] = second.current.document.instances
        assert applied.node_budget_bytes == 1 << 28
        assert [g.node_budget_bytes for g in applied.request_groups] == [None, 1 << 20]
        assert second.applied_digest == signing.document_digest(old)  # the digest of what was received
    finally:
        second.stop()


def test_a_document_naming_a_budget_share_twice_is_refused(daemon):
    from agent.contract import signing

    doc = document(version=1, secret=None)
    doc["instances"][0]["budget_bytes"] = 1 << 20
    ack = daemon.handle_document(signing.signed(doc, "s3cret"))
    assert ack["reason"] == "invalid" and "budget_bytes" in ack["error"]


@pytest.mark.parametrize("single_user", [False, True])
def test_heartbeats_say_whether_the_agent_runs_single_user(tmp_path, broker, single_user):
    """Security review F6: a single-user agent (every instance as its own account) says so in each heartbeat."""
    d = Daemon("node-a", "s3cret", tmp_path / "s", publish=broker.publish, single_user=single_user)
    try:
        d.handle_document(document(version=1))  # a dashboard of this release: it reads single_user
        assert d.heartbeat_now()
        (beat,) = [m for m in broker.messages() if m["kind"] == "heartbeat"]
        assert beat["single_user"] is single_user and parse_ingest(beat).single_user is single_user
    finally:
        d.stop()


def test_fields_the_dashboard_does_not_read_are_not_sent(tmp_path, broker):
    """Upgrade order, agents first: a document of the previous dashboard release lists no ``dashboard_reads``, and
    that dashboard refuses unknown fields, so the agent leaves this release's fields (eviction causes per row,
    single_user) out of what it sends until a document of this release arrives."""
    from agent.contract import signing
    from agent.contract.messages import NEWER_AGENT_FIELDS

    ledger = [{"tenant_id": "acme", "served_model_name": "qwen3-8b", "namespace": "prod-2026-07",
               "request_group": "default", "blocks": 1, "bytes": 1024, "evicted_blocks": 3,
               "store_evicted_blocks": 2, "budget_evicted_blocks": 1}]
    d = Daemon("node-a", "s3cret", tmp_path / "s", publish=broker.publish, snapshot=lambda: ledger,
               single_user=True)
    try:
        old = document(version=1)
        old.pop("dashboard_reads")
        d.handle_document(signing.signed({k: v for k, v in old.items() if k != "signature"}, "s3cret"))
        d.report_now()
        d.heartbeat_now()
        d.handle_document(document(version=2))
        d.report_now()
        d.heartbeat_now()
        d.flush()
        before, after = broker.messages("report")
        beat_before, beat_after = [m for m in broker.messages() if m["kind"] == "heartbeat"]
        row_fields = set(NEWER_AGENT_FIELDS["report_row"])
        assert all(not row_fields & set(row) for row in before["scopes"]) and "single_user" not in beat_before
        (row,) = [r for r in after["scopes"] if r["request_group"] == "default"]
        assert (row["evicted_blocks"], row["store_evicted_blocks"], row["budget_evicted_blocks"]) == (3, 2, 1)
        assert beat_after["single_user"] is True
        assert parse_ingest(before).scopes[0].evicted_blocks == 3  # the sum still travels
    finally:
        d.stop()


def test_node_engines_single_user_is_the_agent_not_being_privileged(tmp_path):
    from agent.datapath.ledger import Ledger
    from agent.node.engines import NodeEngines

    for privileged in (False, True):
        engines = NodeEngines("node-a", Ledger(), tmp_path / str(privileged), observe=False,
                              is_privileged=privileged)
        try:
            assert engines.single_user is not privileged
        finally:
            engines.close()


def test_reports_clamp_counters_past_the_contract_bounds(tmp_path, broker):
    """A ledger counter that grew past ``MAX_COUNT`` (or a byte gauge past ``MAX_BYTES``) is sent at the bound, so
    the dashboard never refuses the node's report for it."""
    from agent.contract.messages import MAX_BYTES, MAX_COUNT

    ledger = [{"tenant_id": "acme", "served_model_name": "qwen3-8b", "namespace": "prod-2026-07",
               "request_group": "app-a", "blocks": 4, "bytes": 2 ** 63 - 1, "hit_blocks": MAX_COUNT + 5}]
    d = Daemon("node-a", "s3cret", tmp_path / "s", publish=broker.publish, snapshot=lambda: ledger)
    try:
        d.handle_document(document(version=1))
        d.report_now()
        d.flush()
        [rep] = broker.messages("report")
        parse_ingest(rep)
        row = next(row for row in rep["scopes"] if row["request_group"] == "app-a")
        assert (row["bytes"], row["hit_blocks"], row["blocks"]) == (MAX_BYTES, MAX_COUNT, 4)
    finally:
        d.stop()


@pytest.mark.parametrize("version", [2 ** 70, -(2 ** 70)])
def test_an_absurd_document_version_is_not_echoed(daemon, broker, version):
    from agent.contract import signing

    doc = document(version=1, secret=None)
    doc["version"] = version
    ack = daemon.handle_document(signing.signed(doc, "s3cret"))
    assert ack["reason"] == "invalid" and ack["version"] is None
    daemon.flush()
    [sent] = broker.messages("ack")
    assert parse_ingest(sent).version is None  # what the dashboard accepts


def test_an_error_with_control_characters_is_acked_printable(daemon, broker, monkeypatch):
    """An error text built from what the agent met (an exception's message) may hold any character."""
    from agent.node.daemon import Rejected

    def failing(raw):
        raise Rejected("apply_failed", "OSError: bad\x00path\x1b[2J")

    monkeypatch.setattr(daemon, "_validate", failing)
    ack = daemon.handle_document(document(version=1))
    assert ack["reason"] == "apply_failed" and ack["error"] == "OSError: bad\ufffdpath\ufffd[2J"
    daemon.flush()
    [sent] = broker.messages("ack")
    assert parse_ingest(sent).error == ack["error"]
