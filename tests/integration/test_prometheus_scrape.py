"""Debian's Prometheus scraping a real kvpool dashboard: every Grafana panel's and every alert's expression returns
series, and killing the master turns the master-down alert on.

Real here: the ``prometheus`` binary with the shipped ``deploy/prometheus/prometheus.yml`` (targets and token file
filled in) and its rules file, the dashboard's ``/metrics`` served by pytest-django's ``live_server`` behind a bearer
token, a ``mooncake_master`` (scraped directly too) with a mounted Store segment, its quota sync, quota sampling and
health probe (called in this process instead of Celery beat). The agents' messages are signed and go through the
dashboard's real ``ingest`` (what its worker runs), but they are built here (``tests.support.messages``): the engine
families need reports of real vLLM instances, which take minutes to start. They carry one faulty instance so the
engine alerts have something to say.

An alert's expression is empty while what it watches is healthy (``kvpool_master_up == 0`` before the kill): then its
comparisons are dropped (``kvpool_master_up``) and that must return series, and so must every family it names, so
a renamed or missing family fails here. ``kvpool_master_standbys`` exists in HA mode only and is checked to be
absent. The master-down alert's real ``for:`` is 1 minute: this test proves the rule's expression turns on after
the kill (the alert goes pending, or firing); ``deploy/prometheus/tests`` proves it fires once ``for:`` elapsed.
"""
from __future__ import annotations

import re
from datetime import timedelta
from urllib.parse import urlsplit

import pytest
from django.utils import timezone

from agent.contract.messages import InstanceStats, Report, ScopeOccupancy
from dashboard.telemetry.ingest import ingest
from tests.support.messages import ack, heartbeat, register, sent
from tests.support.prometheus import (
    PrometheusServer,
    alert_rules,
    expand_grafana,
    grafana_annotations,
    grafana_queries,
    grafana_variables,
    scrape_config,
)
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

TOKEN = "scrape-token-of-the-test"
#: Families that exist only in HA mode (the master here runs alone).
HA_ONLY = {"kvpool_master_standbys"}
#: Alerts on the (other) rows of KVPOOL_METRICS_MAX_SERIES only: their series exist while the cap folds something.
FOLDED_ONLY = {"KvpoolTroubleBeyondSeriesCap"}
_COMPARISON = re.compile(r"\s*(==|!=|>=|<=|>|<)\s*[0-9.e+]+")


def underlying(expr: str) -> str:
    """``expr`` without its comparisons against numbers: the series an alert compares."""
    return _COMPARISON.sub("", expr)


def families(expr: str) -> set[str]:
    """The metric names ``expr`` selects."""
    return {name for name in re.findall(r"\b(kvpool_[a-z_]+|up)\b(?!\s*\()", expr)}


def _registry(master):
    from dashboard.master.quota_sync import sync_quotas
    from tests.support.factories import make_group, make_model, make_release, make_tenant

    tenant = make_tenant("acme", quota="48MB")
    model = make_model(tenant, "qwen3-8b", "/models/Qwen3-8B")
    make_release(model, "prod-2026-07", budget_bytes=32 << 20)
    make_group(tenant, "g0", cache_salt="salt-0")
    register("node-a")  # the node, its secret and the applied document carrying instance 1 and groups g0..
    sync_quotas()


def _agent_messages(sequence: int) -> list[dict]:
    """What node-a's agent sends: an ack of version 1, a heartbeat, a report with two scopes and one faulty vLLM
    instance, and one unsigned message (refused: ``kvpool_agent_messages_rejected_total``)."""
    from dashboard.models import ConfigVersion, NodeState

    now = timezone.now()
    digest = ConfigVersion.objects.get(node_name="node-a", version=1).digest
    NodeState.objects.get_or_create(node_name="node-a", defaults={"desired_version": 1, "desired_digest": digest})
    scopes = [ScopeOccupancy(tenant_id="acme", served_model_name="qwen3-8b", namespace="prod-2026-07",
                             request_group=f"g{i}", blocks=4 + i, bytes=(4 + i) << 20, puts=10 * sequence,
                             gets=20 * sequence, hit_blocks=3 * sequence, miss_blocks=sequence,
                             evicted_blocks=sequence, in_flight_requests=1) for i in range(2)]
    engine = InstanceStats(
        instance_id="1", tenant_id="acme", served_model_name="qwen3-8b", namespace="prod-2026-07",
        observed_since=now - timedelta(minutes=5), last_event_at=now, messages=50 * sequence, events=60 * sequence,
        blocks_seen=16 * sequence, attributed=10 * sequence, unknown_salt=sequence, unknown_adapter=sequence,
        hash_mismatch=sequence, unresolved_parent=sequence, unverifiable=sequence, seq_gaps=1, decode_errors=1,
        confirmed=8 * sequence, unconfirmed=1, pending=2, unknown_namespace_keys={"acme/qwen3-8b/prod-typo": 2},
        unknown_namespace_bytes={"acme/qwen3-8b/prod-typo": 2 << 20}, prefix_cache_queries=400 * sequence,
        prefix_cache_hits=100 * sequence, external_prefix_cache_queries=300 * sequence,
        external_prefix_cache_hits=120 * sequence, metrics_scrapes=sequence, metrics_errors=1,
        events_endpoint="ipc://kv-events.sock", events_status="connected", topic_mismatch=1)
    report = sent(Report(node="node-a", sequence=2 * sequence + 1, sent_at=now - timedelta(seconds=2),
                         started_at=now - timedelta(minutes=5), applied_version=1, scopes=scopes, instances=[engine],
                         unknown_topic_messages=1, unknown_topic_blocks=3).to_wire())
    return [ack(node="node-a", sequence=2 * sequence, version=1, digest=digest, at=now), report,
            heartbeat(node="node-a", at=now, applied_version=1, applied_digest=digest),
            {"kind": "heartbeat", "node": "node-a"}]


@pytest.mark.timeout(600)  # hang guard: every wait below has its own generous limit
def test_prometheus_sees_every_panel_and_alert_and_the_master_down_alert(
        dashboard_broker, master, live_server, settings, tmp_path):
    from agent.datapath.store import open_store
    from dashboard.master.health import probe_master
    from dashboard.tasks import sample_master_quotas

    settings.KVPOOL_METRICS_TOKEN = TOKEN
    settings.KVPOOL_MASTER_ADMIN_URL = master.admin_url
    _registry(master)
    segment = open_store(master.endpoints(), "acme")  # mounts a segment: capacity, watermark, watermark shares
    token = tmp_path / "token"
    token.write_text(TOKEN + "\n")
    config = scrape_config(token, dashboard=urlsplit(live_server.url).netloc,
                           master=urlsplit(master.admin_url).netloc, interval="1s")
    prometheus = PrometheusServer(tmp_path, config).start()
    try:
        sequence = 0

        def fresh_telemetry():
            """Probe the master, sample its quotas and send node-a's messages, as beat and the agent keep doing."""
            nonlocal sequence
            sequence += 1
            probe_master(master.metrics_url)
            sample_master_quotas()
            result = ingest(_agent_messages(sequence))
            assert result.reports == 1 and result.rejected.get("unsigned") == 1, result.as_dict()

        def answers(expr: str) -> bool:
            fresh_telemetry()
            return bool(prometheus.query(expr))

        wait_for(lambda: answers('up{job="kvpool-dashboard"} == 1') and answers('up{job="mooncake-master"} == 1'),
                 90, f"both targets scraped (log: {prometheus.log_path})", interval=1)
        # Counters need two samples for rate(): wait for the scope counters to have moved.
        wait_for(lambda: answers("increase(kvpool_cache_scope_puts_total[1m]) > 0"), 90, "a second report scraped",
                 interval=1)

        empty_panels = [(title, expr) for title, expr in grafana_queries()
                        if not prometheus.query(expand_grafana(expr)) and not families(expr) <= HA_ONLY]
        assert not empty_panels
        for name, selector, label in grafana_variables():
            rows = prometheus.query(expand_grafana(selector))
            assert rows and all(label in row["metric"] for row in rows), name
        for name, expr in grafana_annotations():
            assert prometheus.query(expand_grafana(underlying(expr))), name

        silent = []
        for rule in alert_rules():
            expr = rule["expr"]
            if families(expr) <= HA_ONLY:
                continue  # checked absent below
            if rule["alert"] not in FOLDED_ONLY and not prometheus.query(expr) and not prometheus.query(
                    underlying(expr)):
                silent.append((rule["alert"], expr))
            for family in families(expr) - HA_ONLY:
                if not prometheus.query(family):
                    silent.append((rule["alert"], family))
        assert not silent
        assert all(not prometheus.query(family) for family in HA_ONLY)
        for alert in ("KvpoolEngineHashMismatch", "KvpoolUnregisteredBlocks", "KvpoolUnknownTopicWrites"):
            assert prometheus.query(f'ALERTS{{alertname="{alert}",alertstate="firing"}}'), alert  # no for:
        assert not prometheus.query('ALERTS{alertname="KvpoolMasterDown"}')

        segment.close()  # before the master goes: a client without its master takes 10 s or more to close
        master.kill()
        wait_for(lambda: answers('up{job="mooncake-master"} == 0') and answers("kvpool_master_up == 0"), 90,
                 "Prometheus to see the master down", interval=1)
        alert = wait_for(lambda: answers('ALERTS{alertname="KvpoolMasterDown"}')
                         and prometheus.query('ALERTS{alertname="KvpoolMasterDown"}'), 60,
                         "the master-down alert to turn on", interval=1)
        assert alert[0]["metric"]["severity"] == "critical"
        assert alert[0]["metric"]["alertstate"] in {"pending", "firing"}
    finally:
        prometheus.stop()
