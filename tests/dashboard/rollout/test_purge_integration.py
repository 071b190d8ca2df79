"""On a real mooncake_master (0.3.13.post1): the agent's purge removes exactly one release namespace's keys with
``remove_by_regex`` from a separate client of the tenant, and the overview reads the master's capacity."""
from __future__ import annotations

import ctypes
from datetime import UTC, datetime
from types import SimpleNamespace

import pytest
from django.urls import reverse

from agent.contract import keys, signing
from agent.node.purge import PurgeRequest, daemon_store_opener, handle_purge, signed_request

pytestmark = pytest.mark.integration
BLOCK = 4096


def put(client, names: list[str]) -> None:
    buffer = ctypes.create_string_buffer(BLOCK)
    client.register(ctypes.addressof(buffer), BLOCK)
    codes = client.put_from(names, [ctypes.addressof(buffer)] * len(names), [BLOCK] * len(names))
    assert codes == [0] * len(names)
    put.buffers.append(buffer)  # keep the registered memory alive for the session's client


put.buffers = []


def test_agent_purge_removes_one_release_namespace(mooncake_master, store_client_factory, unique_name):
    client = store_client_factory(mooncake_master, "alpha", "ui-purge")
    old, new = unique_name("old"), unique_name("new")
    old_keys = [keys.vllm_key("Qwen3-8B", f"{i:064x}", cache_prefix=old, tp_rank=tp) for i in range(4) for tp in (0, 1)]
    new_keys = [keys.vllm_key("Qwen3-8B", f"{i:064x}", cache_prefix=new) for i in range(3)]
    other_model = [keys.vllm_key("Other", f"{i:064x}", cache_prefix=old) for i in range(2)]
    put(client, old_keys + new_keys + other_model)
    document = SimpleNamespace(store=mooncake_master.endpoints())
    daemon = SimpleNamespace(current=SimpleNamespace(document=document))
    request = PurgeRequest(purge_id="it-1", node="node-a", tenant_id="alpha", engine="vllm", namespace=old,
                           model="Qwen3-8B", served_model_name="qwen3-8b",
                           issued_at=signing.timestamp(datetime.now(UTC)))
    result = handle_purge(signed_request(request, "secret"), node="node-a", secret="secret",
                          open_store=daemon_store_opener(daemon))
    assert result["error"] == "" and result["removed"] == len(old_keys)
    assert client.exists(old_keys) == [0] * len(old_keys)
    assert client.exists(new_keys + other_model) == [1] * (len(new_keys) + len(other_model))
    again = handle_purge(signed_request(request, "secret"), node="node-a", secret="secret",
                         open_store=daemon_store_opener(daemon))
    assert again["removed"] == 0 and again["error"] == ""


@pytest.mark.django_db
def test_overview_reads_the_masters_capacity(ui, settings, mooncake_master, store_client_factory):
    store_client_factory(mooncake_master, "alpha", "ui-capacity")  # mounts a segment
    settings.KVPOOL_MASTER_ADMIN_URL = mooncake_master.admin_url
    metrics = mooncake_master.metrics()
    html = ui.get(reverse("ui:overview")).content.decode()
    section = html.split('id="store-capacity"')[1].split("</section>")[0]
    assert "unknown" not in section
    assert metrics["master_total_capacity_bytes"] > 0
    from tenants.quota import humanize_bytes

    assert humanize_bytes(int(metrics["master_total_capacity_bytes"])) in section
