"""Pages showing the real engines' facts: the node page's instance rows (attribution counters, Store hit ratio) and
the engine checks on the Checks page."""
from __future__ import annotations

import pytest
from django.utils import timezone

from agent.contract.messages import InstanceStats as Stats
from agent.contract.messages import Report
from dashboard.rollout.push import ensure_version
from dashboard.telemetry.ingest import ingest
from tests.support.factories import make_assignment, make_model, make_node, make_release, make_tenant
from tests.support.messages import secret_of, sent

pytestmark = pytest.mark.django_db


def _report(node, instance_id: str, **counters) -> dict:
    """A report of ``node``'s agent running the node's document as the registry renders it now."""
    now = timezone.now()
    applied = ensure_version(node).version.version
    stats = Stats(instance_id=instance_id, tenant_id="acme", served_model_name="tiny", namespace="tiny-2026-12",
                  observed_since=now, last_event_at=now, **counters)
    return sent(Report(node=node.name, sequence=1, sent_at=now, started_at=now, applied_version=applied,
                       instances=[stats]).to_wire())


def test_node_and_release_pages_show_each_instances_engine_facts(ui):
    node = make_node("gpu-a", signing_secret=secret_of("gpu-a"))
    model = make_model(make_tenant("acme"), "tiny")
    observed = make_assignment(node, make_release(model, "tiny-2026-12"), port=8000)
    quiet = make_assignment(node, observed.release, port=8001)
    ingest([_report(node, str(observed.pk), blocks_seen=21, attributed=18, unknown_salt=2, hash_mismatch=1,
                    seq_gaps=3, external_prefix_cache_queries=640, external_prefix_cache_hits=160)])
    page = ui.get(f"/nodes/{node.pk}/").content.decode()
    row = page.split(f'data-instance="{observed.pk}"')[1].split("</tr>")[0]
    assert "18 / 21" in row and ">2<" in row and ">1<" in row and ">3<" in row
    assert "25% <span class=\"muted\">(160/640 tokens)" in row
    assert "not observed" in page.split(f'data-instance="{quiet.pk}"')[1].split("</tr>")[0]
    release_page = ui.get(f"/releases/{observed.release.pk}/").content.decode()
    section = release_page.split(f'id="instance-{observed.pk}"')[1].split("</section>")[0]
    assert "engine: 18 of 21 Store block(s) attributed" in section and "2 of no registered group" in section
    assert "1 hash mismatch(es)" in section and "Store hit ratio 25%" in section
    assert "engine:" not in release_page.split(f'id="instance-{quiet.pk}"')[1].split("</section>")[0]


def test_the_node_page_names_a_namespace_its_engine_writes_under_with_keys_and_bytes(ui):
    node = make_node("gpu-a", signing_secret=secret_of("gpu-a"))
    observed = make_assignment(node, make_release(make_model(make_tenant("acme"), "tiny"), "tiny-2026-12"), port=8000)
    ingest([_report(node, str(observed.pk), blocks_seen=168, attributed=168, confirmed=0, unconfirmed=3,
                    unknown_namespace_keys={"tiny-2026-1@tiny-llama": 165},
                    unknown_namespace_bytes={"tiny-2026-1@tiny-llama": 165 << 14})])
    page = ui.get(f"/nodes/{node.pk}/").content.decode()
    row = page.split(f'data-instance="{observed.pk}"')[1].split("</tr>")[0]
    assert '0 / <span class="flag bad">3</span>' in row  # confirmed / not in the Store
    cell = row.split('class="unknown-namespaces">')[1].split("</td>")[0]
    assert '<span class="flag bad">tiny-2026-1@tiny-llama</span> 165 keys' in cell and 'data-bytes="2703360"' in cell


def test_checks_page_lists_the_engine_checks(ui):
    page = ui.get("/checks/").content.decode()
    for key in ("engines_hash_registered", "blocks_registered", "engine_events_flow", "engine_writes_in_store"):
        assert f'data-check="{key}" data-status="pass"' in page
    data = ui.get("/checks/data.json").json()["checks"]
    assert {"Engines hash as registered", "Every stored block belongs to a registered request group",
            "Engines' events reach their agent"} <= {check["title"] for check in data}


def test_a_refused_kv_event_socket_is_flagged_on_the_node_page_and_fails_the_check(ui):
    node = make_node("gpu-a", signing_secret=secret_of("gpu-a"))
    observed = make_assignment(node, make_release(make_model(make_tenant("acme"), "tiny"), "tiny-2026-12"),
                               port=8000)
    problem = "socket /srv/kvpool/instances/7/kv-events.sock belongs to uid 1234, not to the instance's account"
    ingest([_report(node, str(observed.pk), events_endpoint="ipc://kv-events.sock", events_status="refused",
                    events_problem=problem, events_refusals=12)])
    page = ui.get(f"/nodes/{node.pk}/").content.decode()
    row = page.split(f'data-instance="{observed.pk}"')[1].split("</tr>")[0]
    assert '<span class="flag bad">refused</span>' in row and "belongs to uid 1234" in row and "12 refusal(s)" in row
