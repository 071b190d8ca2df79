"""Rendered master policy and client config against a real mooncake_master (0.3.13.post1) on loopback."""
from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tenants.models import Tenant
from tenants.rendering import RenderTarget, render_assignment, render_master
from tests.support.factories import (
    make_assignment,
    make_model,
    make_node,
    make_release,
    make_tenant,
)

pytestmark = [pytest.mark.integration, pytest.mark.django_db]

MASTER = Path(sys.executable).parent / "mooncake_master"
# Requested quotas sum below the mounted capacity, so effective quotas equal the requested ones.
TENANTS = {"acme corp/ü": "16MB", "123": "1KB", "yes": "1000B", "a: b": "1MB", "#hash": "8MB"}

CLIENT = """
import json, sys
from mooncake.store import MooncakeDistributedStore
config = json.load(open(sys.argv[1]))
tenant = sys.argv[2] if len(sys.argv) > 2 else config["tenant_id"]
store = MooncakeDistributedStore()
rc = store.setup({"local_hostname": "127.0.0.1", "metadata_server": config["metadata_server"],
                  "global_segment_size": config["global_segment_size"],
                  "local_buffer_size": config["local_buffer_size"],
                  "protocol": config["protocol"], "device_name": config["device_name"],
                  "master_server_addr": config["master_server_address"], "tenant_id": tenant})
put = store.put("registry-integration-key", b"x" * 4096) if rc == 0 else None
exists = store.is_exist("registry-integration-key") if rc == 0 else None
print("RESULT " + json.dumps({"setup": rc, "put": put, "exists": exists}), flush=True)
"""


def _free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    for sock in sockets:
        sock.bind(("127.0.0.1", 0))
    ports = [sock.getsockname()[1] for sock in sockets]
    for sock in sockets:
        sock.close()
    return ports


def _get_json(url: str):
    with urllib.request.urlopen(url, timeout=2) as response:
        return json.loads(response.read())


@pytest.fixture
def rendered_master(tmp_path):
    """A real master started from the rendered command line and policy file; yields the endpoints."""
    for name, quota in TENANTS.items():
        make_tenant(name, quota=quota)
    rpc, metadata, metrics = _free_ports(3)
    endpoints = RenderTarget(
        master_server_address=f"127.0.0.1:{rpc}",
        metadata_server=f"http://127.0.0.1:{metadata}/metadata",
        admin_url=f"http://127.0.0.1:{metrics}",
        global_segment_size=32 << 20,
        local_buffer_size=16 << 20,
        config_dir=str(tmp_path / "etc"),
    )
    config = render_master(Tenant.objects.all(), endpoints)
    for path, content in config.files.items():
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(content)
    log = open(tmp_path / "master.log", "w")  # noqa: SIM115 (the master's stdout until the fixture ends)
    process = subprocess.Popen([str(MASTER), *config.argv[1:]], stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                _get_json(f"{endpoints.admin_url}/api/v1/tenant_quotas")
                break
            except OSError:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError(
                        f"master did not start: {(tmp_path / 'master.log').read_text()[-2000:]}") from None
                time.sleep(0.2)
        yield endpoints
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()


def test_master_loads_rendered_policy(rendered_master):
    snapshot = _get_json(f"{rendered_master.admin_url}/api/v1/tenant_quotas")["data"]
    loaded = {entry["tenant_id"]: entry["requested_quota_bytes"] for entry in snapshot}
    expected = {tenant.tenant_id: tenant.quota_bytes for tenant in Tenant.objects.all()}
    assert loaded == expected


def _run_client(config_path: str, *extra: str) -> dict:
    result = subprocess.run(
        [sys.executable, "-c", CLIENT, config_path, *extra], capture_output=True, text=True, timeout=120
    )
    lines = [line for line in result.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, f"client printed no result: {result.stdout[-1000:]} {result.stderr[-2000:]}"
    return json.loads(lines[-1][len("RESULT "):])


def test_rendered_vllm_client_config_is_admitted_for_its_tenant(rendered_master, tmp_path):
    tenant = Tenant.objects.get(tenant_id="acme corp/ü")
    release = make_release(make_model(tenant))
    config = render_assignment(make_assignment(make_node(hostname="127.0.0.1"), release), rendered_master)
    (path, content), = config.files.items()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(content)
    assert config.env["MOONCAKE_CONFIG_PATH"] == path
    assert _run_client(path) == {"setup": 0, "put": 0, "exists": 1}
    refused = _run_client(path, "not-registered")
    assert refused["setup"] == 0 and refused["put"] == -1701 and refused["exists"] != 1
