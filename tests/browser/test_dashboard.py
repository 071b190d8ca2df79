"""The dashboard in real headless Chromium: log in, the occupancy chart with live data, the rolling upgrade
walked end to end (with the purge), copy buttons, form errors; a screenshot of every page."""
from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from dashboard.models import OccupancySample
from tenants.models import AuditEntry, Release
from tests.support.factories import (
    make_assignment,
    make_group,
    make_model,
    make_node,
    make_release,
    make_tenant,
)
from tests.support.rows import apply_config, master_sample

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]
MB = 1 << 20

# Chart.js state of a canvas, read in the page: the series (datasets) apart from the quota/budget lines.
DATASETS_JS = """id => {
  const chart = Chart.getChart(id);
  return {stacked: chart.options.scales.y.stacked, labels: chart.data.labels.length,
          datasets: chart.data.datasets.filter(d => !(d.kvpool && d.kvpool.kind))
                                       .map(d => ({label: d.label, data: d.data, fill: d.fill})),
          lines: chart.data.datasets.filter(d => d.kvpool && d.kvpool.kind).map(d => d.label)};
}"""


def deployment():
    tenant = make_tenant("acme", quota="64GB")
    model = make_model(tenant)
    release = make_release(model, "production-2026-07", state="serving")
    make_group(tenant, "app-a")
    node = make_node("node-a")
    make_assignment(node, release, port=8000, role="prefill", bootstrap_port=8998)
    make_assignment(node, release, port=8001, role="decode")
    return tenant, model, release, node


def report(namespace: str, size: int, *, seconds_ago: float = 0, node: str = "node-a", tenant_id: str = "acme",
           model: str = "qwen3-8b", **fields) -> None:
    OccupancySample.objects.create(
        level=OccupancySample.Level.RAW, ts=timezone.now() - timedelta(seconds=seconds_ago), node_name=node,
        tenant_id=tenant_id, served_model_name=model, namespace=namespace, request_group=fields.pop("group", ""),
        bytes=size, max_bytes=size, **fields)


def wait_chart(page, canvas_id: str) -> dict:
    page.wait_for_function("id => document.getElementById(id).dataset.state === 'ready'", arg=canvas_id)
    return page.evaluate(DATASETS_JS, canvas_id)


def test_occupancy_chart_renders_the_live_series(page, shot):
    deployment()
    for i, seconds_ago in enumerate((600, 420, 240, 60)):
        report("production-2026-07", (10 + i) * MB, seconds_ago=seconds_ago, hit_blocks=10 * i, miss_blocks=i)
        report("production-2026-08", 2 * MB, seconds_ago=seconds_ago, node="node-b")
    report("canary", 5 * MB, seconds_ago=60, tenant_id="beta", model="llama")
    page.goto("/occupancy/?window=15m")
    state = wait_chart(page, "occupancy-chart")
    assert state["stacked"] is True and state["labels"] == 31
    labels = [d["label"] for d in state["datasets"]]
    assert labels == ["acme/qwen3-8b/production-2026-07", "acme/qwen3-8b/production-2026-08", "beta/llama/canary"]
    assert [d["fill"] for d in state["datasets"]] == ["origin", "-1", "-1"]
    first = [v for v in state["datasets"][0]["data"] if v is not None]
    assert first == [10 * MB, 11 * MB, 12 * MB, 13 * MB]
    assert [v for v in state["datasets"][2]["data"] if v is not None] == [5 * MB]
    # The table under the chart carries the same numbers.
    row = page.locator('#occupancy-summary tr[data-namespace="acme/qwen3-8b/production-2026-07"]')
    assert row.locator("[data-bytes]").first.get_attribute("data-bytes") == str(13 * MB)
    assert row.locator("[data-hit-ratio]").get_attribute("data-hit-ratio") == str(30 / 33)
    assert page.evaluate("() => { const c = document.getElementById('occupancy-chart'); "
                         "return c.width > 0 && c.height > 0; }")
    shot(page, "occupancy")
    # Filter by tenant: the chart reloads with one tenant's namespaces only.
    page.fill("#f-tenant", "beta")
    page.click("#occupancy-filters button[type=submit]")
    page.wait_for_url("**/occupancy/?window=15m&tenant_id=beta**")
    state = wait_chart(page, "occupancy-chart")
    assert [d["label"] for d in state["datasets"]] == ["beta/llama/canary"]
    shot(page, "occupancy-filtered")


# Quota/budget lines, y ticks and the hit ratio chart of a canvas, read in the page.
LINES_JS = """id => {
  const chart = Chart.getChart(id), hits = Chart.getChart(id + '-hits');
  const lines = chart.data.datasets.filter(d => d.kvpool && d.kvpool.kind);
  return {lines: lines.map(d => ({label: d.label, bytes: d.kvpool.bytes, y: d.data[0], stack: d.stack})),
          ticks: chart.scales.y.ticks.map(t => ({value: t.value, label: t.label})),
          hits: hits.data.datasets.map(d => ({label: d.label, data: d.data}))};
}"""


def test_one_release_shows_its_quota_and_budget_lines_binary_ticks_and_hit_ratio(page, shot):
    tenant, model, release, _node = deployment()
    Release.objects.filter(pk=release.pk).update(budget_bytes=24 * MB)
    master_sample("acme", effective=48 * MB, charged=13 * MB, requested=64 << 30)
    for i, seconds_ago in enumerate((840, 600, 420, 240, 60)):
        report("production-2026-07", (7 + 3 * i) * MB, seconds_ago=seconds_ago, hit_blocks=40 * i,
               miss_blocks=10 * i * i)
    page.goto("/occupancy/?window=15m&tenant_id=acme&served_model_name=qwen3-8b&namespace=production-2026-07")
    wait_chart(page, "occupancy-chart")
    state = page.evaluate(LINES_JS, "occupancy-chart")
    assert [(line["label"], line["y"]) for line in state["lines"]] == [
        ("quota (registry) 64 GiB", 64 << 30), ("effective quota (master) 48 MiB", 48 * MB),
        ("budget of production-2026-07 24 MiB", 24 * MB)]
    assert len({line["stack"] for line in state["lines"]}) == 3  # each line on its own: none adds to another
    # Ticks at multiples of a power of two, labelled in IEC units; the axis reaches the budget and the effective quota
    # (within 4 times the lowest line), not the 64 GiB quota, which would flatten the data.
    values = [tick["value"] for tick in state["ticks"]]
    step = values[1] - values[0]
    assert values[0] == 0 and step & (step - 1) == 0 and all(v % step == 0 for v in values)
    assert 48 * MB <= values[-1] < 64 * MB and len(values) <= 9
    assert all(tick["label"].endswith(("MiB", " B")) for tick in state["ticks"])
    assert "8 MiB" in [tick["label"] for tick in state["ticks"]]
    # Hit ratio per bucket: +40 hits / +10 misses, then +40 / +30, ... (the first report only starts the counters).
    ratios = [v for v in state["hits"][0]["data"] if v is not None]
    assert ratios == [40 / 50, 40 / 70, 40 / 90, 40 / 110]
    assert page.locator("#quota-lines li").count() == 3
    shot(page, "occupancy-one-release")


def test_the_evictions_chart_stacks_the_blocks_evicted_per_bucket_by_cause(page, shot):
    deployment()
    for i, seconds_ago in enumerate((600, 420, 240)):
        report("production-2026-07", 10 * MB, seconds_ago=seconds_ago, store_evicted_blocks=10 * i,
               budget_evicted_blocks=3 * i, orphan_removed_blocks=i, evicted_blocks=14 * i)
    page.goto("/occupancy/?window=15m")
    page.wait_for_function("() => document.getElementById('occupancy-chart-evictions').dataset.state === 'ready'")
    state = page.evaluate("""() => { const c = Chart.getChart('occupancy-chart-evictions');
        return {type: c.config.type, stacked: c.options.scales.y.stacked,
                datasets: c.data.datasets.map(d => ({cause: d.kvpool.cause, data: d.data}))}; }""")
    assert state["type"] == "bar" and state["stacked"] is True
    sums = {d["cause"]: sum(v for v in d["data"] if v) for d in state["datasets"]}
    assert sums == {"store": 20, "budget": 6, "orphan": 2}  # the increases after the first report
    shot(page, "occupancy-evictions")


def test_rolling_upgrade_walkthrough_with_purge(page, shot, monkeypatch):
    from dashboard.rollout import purge

    sent = []
    monkeypatch.setattr(purge.app, "send_task", lambda name, **kw: sent.append((name, kw)))
    tenant, model, old, node = deployment()
    report("production-2026-07", 3 << 30, seconds_ago=30)
    master_sample("acme", effective=32 << 30, charged=3 << 30)
    page.goto(f"/models/{model.pk}/upgrade/")
    assert page.get_attribute("#upgrade-phase", "data-phase") == "idle"
    assert page.get_attribute("#projection", "data-fits") == "true"
    assert "effective quota read back from the Mooncake master" in page.inner_text("#projection")
    shot(page, "upgrade-1-plan")

    page.fill("#id_namespace", "production-2026-08")
    page.fill("#id_weights_revision", "v2")
    page.fill("#id_port_offset", "100")
    page.click("#start-button")
    page.wait_for_selector('#upgrade-phase[data-phase="warming"]')
    new = Release.objects.get(namespace="production-2026-08")
    assert new.state == "warming" and new.weights_revision == "v2" and new.assignments.count() == 2
    report("production-2026-08", 1 << 30, seconds_ago=5, node="node-a")
    page.reload()
    assert page.locator('[data-side="old"]').count() == 1 and page.locator('[data-side="new"]').count() == 1
    state = wait_chart(page, "upgrade-chart")
    assert [d["label"] for d in state["datasets"]] == ["acme/qwen3-8b/production-2026-07",
                                                       "acme/qwen3-8b/production-2026-08"]
    assert state["lines"] == ["quota (registry) 64 GiB", "effective quota (master) 32 GiB"]  # one tenant shown
    shot(page, "upgrade-2-warming")

    page.click("#shift-button")
    page.wait_for_selector('#upgrade-phase[data-phase="draining"]')
    assert page.is_disabled("#retire-button")
    assert "no report since draining began" in page.inner_text("#retire-reason")
    shot(page, "upgrade-3-draining")

    report("production-2026-07", 3 << 30, seconds_ago=-1, in_flight_requests=0)  # the agent's next report
    page.reload()
    assert page.get_attribute("#retire-reason", "data-ready") == "true"
    page.click("#retire-button")
    page.wait_for_selector('#upgrade-phase[data-phase="idle"]')
    old.refresh_from_db()
    assert old.state == "retired" and not old.assignments.exists()
    shot(page, "upgrade-4-retired")

    page.click(f'a[href="/releases/{old.pk}/purge/"]')
    page.fill("#id_confirm", "production-2026-07")
    shot(page, "purge-confirm")
    page.click("#purge-button")
    page.wait_for_selector("ul.messages li.success")
    assert [kw["queue"] for _, kw in sent] == ["agent.node-a"]
    request = AuditEntry.objects.get(object_type=purge.REQUEST_TYPE)
    assert request.actor_repr == "operator"
    purge.record_purge_result({"schema": 1, "kind": "purge_result", "purge_id": request.request_id,
                               "node": "node-a", "removed": 42, "error": "", "sent_at": timezone.now().isoformat()})
    page.reload()
    assert page.get_attribute(".purges [data-total-removed]", "data-total-removed") == "42"
    shot(page, "purge-done")
    actors = set(AuditEntry.objects.filter(object_type="tenants.release", actor_repr="operator")
                 .values_list("action", flat=True))
    assert actors == {"create", "update"}


def test_pages_render_with_copy_buttons_and_screenshots(page, shot):
    tenant, model, release, node = deployment()
    apply_config(node)
    report("production-2026-07", 7 * MB, seconds_ago=20, group="app-a")
    master_sample("acme", effective=32 << 30, charged=1 << 30)
    pages = {
        "overview": "/", "registry": "/registry/", "tenant": f"/tenants/{tenant.pk}/", "model": f"/models/{model.pk}/",
        "release": f"/releases/{release.pk}/", "node": f"/nodes/{node.pk}/", "checks": "/checks/", "audit": "/audit/",
        "new-tenant-form": "/tenants/new/",
    }
    for name, url in pages.items():
        response = page.goto(url)
        assert response.status == 200, url
        assert page.locator("h1").count() == 1
        shot(page, name)
    page.goto("/checks/")
    assert page.locator('#checks [data-status="fail"]').count() == 0  # a healthy deployment passes every check
    assert page.locator('#checks [data-status="pass"]').count() >= 6  # the seed's five and quota_capacity
    page.goto(f"/releases/{release.pk}/")
    assignment = release.assignments.order_by("port").first()
    page.click(f'button[data-copy="cmd-{assignment.pk}"]')
    page.wait_for_selector(f'button[data-copy="cmd-{assignment.pk}"][data-copied="true"]')
    copied = page.evaluate("() => navigator.clipboard.readText()")
    assert copied == page.inner_text(f"#cmd-{assignment.pk}") and "vllm.entrypoints.openai.api_server" in copied
    with page.expect_download() as download:
        page.click(f'a[href="/releases/{release.pk}/config/{assignment.pk}.json"]')
    assert download.value.suggested_filename == "production-2026-07-node-a-8000.json"


def test_form_errors_show_the_rule_and_nothing_is_saved(page, shot):
    page.goto("/tenants/new/")
    page.fill("#id_tenant_id", "_reserved")
    page.fill("#id_quota_bytes", "8MB")
    page.click("main button[type=submit]")
    page.wait_for_selector(".errorlist")
    assert "must not start with '_'" in page.inner_text(".errorlist")
    shot(page, "form-error")
    page.fill("#id_tenant_id", "acme")
    page.click("main button[type=submit]")  # no master answers: the capacity is unknown, a new quota needs confirming
    page.wait_for_selector("#id_confirm_overcommit_error")
    assert "mounted capacity is unknown" in page.inner_text("#id_confirm_overcommit_error")
    assert "capacity unknown" in page.inner_text("#quota-plan")
    shot(page, "form-overcommit")
    page.check("#id_confirm_overcommit")
    page.click("main button[type=submit]")
    page.wait_for_url("**/tenants/*/")
    assert AuditEntry.objects.get(object_type="tenants.tenant").actor_repr == "operator"


def test_login_page_screenshot(browser, live_server, shot):
    context = browser.new_context(base_url=live_server.url)
    page = context.new_page()
    page.goto("/occupancy/")
    assert "/accounts/login/?next=/occupancy/" in page.url
    shot(page, "login")
    context.close()
