"""Overview, registry, detail and audit pages render what the registry and the telemetry hold."""
from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from dashboard.models import MasterQuotaSync, NodeState
from dashboard.views.overview import parse_store_metrics
from tests.support.factories import (
    make_assignment,
    make_group,
    make_model,
    make_node,
    make_release,
    make_tenant,
)
from tests.support.paths import ROOT
from tests.support.rows import apply_config, master_sample, node_alive, sample

pytestmark = pytest.mark.django_db


@pytest.fixture
def deployment():
    tenant = make_tenant("acme", quota="64GB")
    model = make_model(tenant)
    release = make_release(model, "production-2026-07", state="serving", budget_bytes=8 << 30)
    group = make_group(tenant, "app-a")
    node = make_node("node-a")
    prefill = make_assignment(node, release, port=8000, role="prefill")
    decode = make_assignment(node, release, port=8001, role="decode")
    return {"tenant": tenant, "model": model, "release": release, "group": group, "node": node,
            "prefill": prefill, "decode": decode}


def test_overview_shows_quota_gauges_nodes_and_warnings(ui, deployment):
    master_sample("acme", effective=32 << 30, charged=8 << 30, requested=64 << 30)
    sample(size=3 << 30)
    node_alive("node-a")
    NodeState.objects.create(node_name="node-old", heartbeat_at=timezone.now() - timedelta(hours=1))
    MasterQuotaSync.objects.create(tenant_id="acme", last_error="master refused", last_error_at=timezone.now())
    response = ui.get(reverse("ui:overview"))
    assert response.status_code == 200
    html = response.content.decode()
    assert "64 GiB" in html and "32 GiB" in html and "8 GiB" in html  # requested, effective, charged
    assert 'title="25%"' in html  # charged / effective gauge
    assert "3 GiB" in html  # reported by agents
    assert "node-old" in html and "not registered" in html
    assert "node node-old is silent" in html
    assert "quota sync of tenant acme: master refused" in html
    assert "master metrics at" in html and "unavailable" in html  # no master in this test


def test_byte_figures_are_binary_with_iec_suffixes(ui, deployment):
    """Mooncake counts in binary units: a 256 MiB quota reads "256 MiB" (Django's filesizeformat wrote "256.0 MB")."""
    master_sample("acme", effective=256 << 20, charged=1536 << 10, requested=64 << 30)
    sample(size=(1 << 30) + (1 << 29))
    html = ui.get(reverse("ui:overview")).content.decode()
    assert "256 MiB" in html and "1.5 MiB" in html and "1.5 GiB" in html and "64 GiB" in html
    assert not re.search(r"[0-9]\s*(KB|MB|GB|TB)\b", html)


def test_no_template_formats_bytes_with_filesizeformat():
    offenders = [str(path.relative_to(ROOT)) for path in (ROOT / "templates").rglob("*.html")
                 if "filesizeformat" in path.read_text()]
    assert offenders == [], "use {{ value|humanize_bytes }} (binary units, IEC suffixes)"


def test_overview_flags_over_quota_and_closed_admission(ui, deployment):
    master_sample("acme", effective=1 << 30, charged=2 << 30, over_quota=True, admission_closed=True)
    html = ui.get(reverse("ui:overview")).content.decode()
    assert "over quota" in html and "admission closed" in html
    assert "tenant acme is over its quota" in html


def test_parse_store_metrics_reads_the_master_gauges():
    text = ("# TYPE master_total_capacity_bytes gauge\nmaster_total_capacity_bytes 1073741824\n"
            "# TYPE master_allocated_bytes gauge\nmaster_allocated_bytes 268435456\n"
            "# TYPE master_key_count gauge\nmaster_key_count 12\n"
            "# TYPE other gauge\nother 5\n")
    capacity = parse_store_metrics(text)
    assert (capacity.total_capacity_bytes, capacity.allocated_bytes, capacity.key_count) == (1 << 30, 1 << 28, 12)
    assert capacity.used_ratio == 0.25 and capacity.error == ""


def test_registry_index_lists_everything(ui, deployment):
    html = ui.get(reverse("ui:registry")).content.decode()
    for text in ("acme", "qwen3-8b", "production-2026-07", "app-a", "node-a", "agent.node-a"):
        assert text in html


def test_tenant_page(ui, deployment):
    sample(size=5 << 20, group="app-a")
    html = ui.get(reverse("ui:tenant", args=[deployment["tenant"].pk])).content.decode()
    assert "no read-back from the Mooncake master yet" in html
    assert deployment["group"].cache_salt in html
    assert "acme/qwen3-8b/production-2026-07" in html and 'data-bytes="5242880"' in html


def test_model_page_lists_releases_with_occupancy(ui, deployment):
    sample(size=7 << 20)
    html = ui.get(reverse("ui:model", args=[deployment["model"].pk])).content.decode()
    assert "production-2026-07" in html and 'data-bytes="7340032"' in html
    assert deployment["release"].fingerprint[:12] in html
    assert "Rolling upgrade (idle)" in html


def test_release_page_shows_config_fingerprint_nodes_and_occupancy(ui, deployment):
    release = deployment["release"]
    sample(size=11 << 20, node="node-a", group="app-a", in_flight_requests=2)
    response = ui.get(reverse("ui:release", args=[release.pk]))
    assert response.status_code == 200
    html = response.content.decode()
    assert f'<pre id="fingerprint">{release.fingerprint}</pre>' in html
    assert 'data-copy="fingerprint"' in html
    for assignment in (deployment["prefill"], deployment["decode"]):
        assert f'id="cmd-{assignment.pk}"' in html and f'data-copy="cmd-{assignment.pk}"' in html
        assert reverse("ui:instance-config", args=[release.pk, assignment.pk]) in html
    assert "vllm.entrypoints.openai.api_server" in html and "cache_prefix" in html and "production-2026-07" in html
    assert "not confirmed by the agent" in html
    assert 'data-bytes="11534336"' in html and "2 requests in flight" in html


def test_release_page_says_when_the_agent_applied_the_prescribed_values(ui, deployment):
    apply_config(deployment["node"])
    html = ui.get(reverse("ui:release", args=[deployment["release"].pk])).content.decode()
    assert html.count("agent applied these values") == 2


def test_config_downloads_equal_the_api(ui, api, deployment):
    release, prefill = deployment["release"], deployment["prefill"]
    one = ui.get(reverse("ui:instance-config", args=[release.pk, prefill.pk]))
    assert one.status_code == 200 and one["Content-Type"] == "application/json"
    assert one["Content-Disposition"] == 'attachment; filename="production-2026-07-node-a-8000.json"'
    api_one = api.get(f"/api/v1/releases/{release.pk}/config/", {"assignment": prefill.pk}).json()
    assert json.loads(one.content) == api_one
    everything = ui.get(reverse("ui:release-config", args=[release.pk]))
    assert json.loads(everything.content) == api.get(f"/api/v1/releases/{release.pk}/config/").json()


def test_instance_download_of_another_release_is_404(ui, deployment):
    other = make_release(deployment["model"], "canary-1")
    assert ui.get(reverse("ui:instance-config", args=[other.pk, deployment["prefill"].pk])).status_code == 404


def test_node_page(ui, deployment):
    apply_config(deployment["node"])
    sample(size=2 << 20, node="node-a")
    html = ui.get(reverse("ui:node", args=[deployment["node"].pk])).content.decode()
    assert "in sync" in html and "agent.node-a" in html and 'data-bytes="2097152"' in html


def test_node_page_shows_the_last_report(ui, deployment):
    from dashboard.models import Report

    apply_config(deployment["node"])
    url = reverse("ui:node", args=[deployment["node"].pk])
    assert "<th>last report</th><td>never</td>" in ui.get(url).content.decode()
    sent = datetime(2026, 11, 30, 12, 34, 56, tzinfo=UTC)
    for sequence, at in ((1, sent - timedelta(minutes=5)), (2, sent)):
        Report.objects.create(node_name="node-a", sequence=sequence, sent_at=at, started_at=at, received_at=at)
    Report.objects.create(node_name="node-other", sequence=3, sent_at=sent + timedelta(hours=1), started_at=sent,
                          received_at=sent)
    html = ui.get(url).content.decode()
    assert "<th>last report</th><td>2026-11-30 12:34:56</td>" in html


def test_request_group_page(ui, deployment):
    html = ui.get(reverse("ui:request-group", args=[deployment["group"].pk])).content.decode()
    assert f'<pre id="salt">{deployment["group"].cache_salt}</pre>' in html


def test_audit_page_filters(ui, deployment):
    html = ui.get(reverse("ui:audit")).content.decode()
    assert "tenants.release" in html and "tenants.tenant" in html
    filtered = ui.get(reverse("ui:audit"), {"type": "tenants.node"}).content.decode()
    assert "node-a" in filtered and "production-2026-07" not in filtered.split('id="audit-log"')[1]


@pytest.mark.parametrize("name", ["ui:tenant", "ui:model", "ui:release", "ui:node", "ui:request-group", "ui:upgrade",
                                  "ui:purge"])
def test_unknown_objects_are_404(ui, name):
    assert ui.get(reverse(name, args=[999999])).status_code == 404


def test_templates_load_nothing_from_other_hosts():

    root = ROOT / "templates"
    for path in root.rglob("*.html"):
        text = path.read_text()
        assert "src=\"http" not in text and "href=\"http" not in text and "//cdn" not in text, path


def test_vendored_chart_js_is_served(client):
    from django.contrib.staticfiles import finders

    path = finders.find("vendor/chartjs/chart.umd.min.js")
    assert path is not None
    with open(path, encoding="utf-8") as handle:
        head = handle.read(200)
    assert "Chart.js v4.6.1" in head and "MIT" in head
    assert finders.find("vendor/chartjs/LICENSE.md") is not None


def test_release_page_lists_adapters_as_the_form_writes_them(ui):
    release = make_release(make_model(make_tenant("acme")), "lora-2026-07",
                           adapters=[{"name": "sql", "path": "/models/sql-lora", "rank": 16},
                                     {"name": "chat", "path": "org/chat-lora"}])
    html = ui.get(reverse("ui:release", args=[release.pk])).content.decode()
    assert "sql=/models/sql-lora;rank=16, chat=org/chat-lora" in html
    assert "{&#x27;name&#x27;" not in html and "{'name'" not in html
    assert ">none<" in ui.get(reverse("ui:release", args=[make_release(
        release.model, "plain-2026-07").pk])).content.decode()


def test_overview_warns_about_a_node_whose_messages_are_refused(ui, deployment):
    from dashboard.telemetry.agent_auth import count_refused

    count_refused("bad_signature", "HMAC mismatch", node="node-a", n=3)
    count_refused("bad_signature", "HMAC mismatch", node="forged-name")  # unregistered: no node warning
    count_refused("duplicate", "already stored", node="node-a")  # not a node-side problem
    html = ui.get(reverse("ui:overview")).content.decode()
    assert "node node-a: 3 agent message(s) refused as bad_signature" in html
    assert "restart it after a rotation" in html
    assert "forged-name" not in html and "refused as duplicate" not in html
