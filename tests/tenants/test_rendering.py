"""Rendered engine and master configuration: exact arguments, valid JSON/YAML, shell round trips."""
from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys

import pytest
import yaml

from tenants.rendering import (
    ENGINE_PYTHON,
    LaunchSpec,
    RenderedConfig,
    RenderTarget,
    StoreEndpoints,
    kv_transfer_config,
    render_assignment,
    render_master,
    render_release,
    render_store_client,
)
from tests.support.factories import (
    make_assignment,
    make_model,
    make_node,
    make_release,
    make_tenant,
)

pytestmark = pytest.mark.django_db

AWKWARD_TENANT = "acme corp/ü 'q' \"x\" $HOME;rm -rf /`id`"
AWKWARD_MODEL = "org/Model's-\"v2\"$(id)"
AWKWARD_PATH = "/models/it's here/$HOME/Qwen3-8B"

FAKE_ENGINE = """#!{python}
import json, os, sys
keys = json.loads(os.environ["WATCH_ENV"])
print(json.dumps({{"argv": sys.argv[1:], "env": {{k: os.environ.get(k) for k in keys}}}}))
"""


@pytest.fixture
def awkward(db):
    tenant = make_tenant(AWKWARD_TENANT, quota="1TB")
    model = make_model(tenant, AWKWARD_MODEL, model_path=AWKWARD_PATH)
    return model


def _release(model, engine: str, **kwargs):
    return make_release(
        model,
        f"production-2026-07-{engine}",
        engine=engine,
        weights_revision="rev'\"$x",
        kv_dtype="fp8",
        quantization="awq",
        **kwargs,
    )


def _flag(argv, flag):
    return argv[argv.index(flag) + 1]


def _run_in_shell(config: RenderedConfig, tmp_path) -> dict:
    """Run ``config.shell_line`` in a real POSIX shell with fake ``vllm``/``python`` printing what they got."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name in ("vllm", "python"):
        fake = bin_dir / name
        fake.write_text(FAKE_ENGINE.format(python=sys.executable))
        fake.chmod(0o755)
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "HOME": "/nonexistent", "WATCH_ENV": json.dumps(list(config.env))}
    result = subprocess.run(["sh", "-c", config.shell_line], env=env, capture_output=True, text=True, check=True)
    return json.loads(result.stdout)


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
@pytest.mark.parametrize("role", ["both", "prefill", "decode"])
def test_command_line_round_trips(awkward, endpoints, engine, role, tmp_path):
    release = _release(awkward, engine)
    assignment = make_assignment(make_node(), release, role=role, bootstrap_port=8998, gpu_ids="0,1", tp_size=2)
    config = render_assignment(assignment, endpoints)
    assert shlex.split(config.command_line) == list(config.argv)
    assert shlex.split(config.shell_line) == [f"{k}={v}" for k, v in sorted(config.env.items())] + list(config.argv)
    seen = _run_in_shell(config, tmp_path)
    assert seen["argv"] == list(config.argv[1:])
    assert seen["env"] == dict(config.env)
    for path, content in config.files.items():
        assert path.startswith(f"/etc/kvpool/{assignment.pk}/")
        assert json.loads(content)["tenant_id"] == AWKWARD_TENANT
    assert json.loads(json.dumps(config.to_dict()))["argv"] == list(config.argv)


def test_vllm_serve_line(awkward, endpoints):
    release = _release(awkward, "vllm", hash_algo="xxhash_cbor", hash_seed="1234")
    assignment = make_assignment(make_node(), release, tp_size=2, pp_size=2, dcp_size=2)
    config = render_assignment(assignment, endpoints)
    argv = list(config.argv)
    assert argv[:5] == ["python", "-m", "vllm.entrypoints.openai.api_server", "--model", AWKWARD_PATH]
    assert _flag(argv, "--served-model-name") == AWKWARD_MODEL
    assert _flag(argv, "--host") == "10.0.0.1"
    assert _flag(argv, "--port") == "8000"
    assert "--enable-prefix-caching" in argv and "--enforce-eager" not in argv
    assert _flag(argv, "--revision") == "rev'\"$x"
    assert _flag(argv, "--tensor-parallel-size") == "2"
    assert _flag(argv, "--pipeline-parallel-size") == "2"
    assert _flag(argv, "--decode-context-parallel-size") == "2"
    assert "--prefill-context-parallel-size" not in argv
    assert _flag(argv, "--block-size") == "16"
    assert _flag(argv, "--kv-cache-dtype") == "fp8"
    assert _flag(argv, "--quantization") == "awq"
    assert _flag(argv, "--prefix-caching-hash-algo") == "xxhash_cbor"
    assert json.loads(_flag(argv, "--kv-transfer-config")) == {
        "kv_connector": "MooncakeStoreConnector",
        "kv_role": "kv_both",
        "kv_connector_extra_config": {"cache_prefix": "production-2026-07-vllm"},
    }
    assert json.loads(_flag(argv, "--kv-events-config")) == {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        "endpoint": "ipc://kv-events.sock",  # the engine binds it in its instance directory (its cwd)
        "replay_endpoint": "ipc://kv-events-replay.sock",  # its buffered messages, for the agent to catch up
        "topic": str(assignment.pk),
    }
    assert config.user == f"kvpool-t{assignment.release.model.tenant.pk}"  # the tenant's default engine account
    assert config.launch_spec().user == config.user
    path = f"/etc/kvpool/{assignment.pk}/mooncake.json"
    assert dict(config.env) == {
        "MOONCAKE_CONFIG_PATH": path,
        "PYTHONHASHSEED": "1234",
        "VLLM_HOST_IP": "10.0.0.1",
        "MOONCAKE_REQUESTER_LOCAL_HOSTNAME": "10.0.0.1",
        "HF_HUB_OFFLINE": "1",
    }
    assert json.loads(config.files[path]) == {
        "metadata_server": "http://10.0.0.9:8080/metadata",
        "master_server_address": "10.0.0.9:50051",
        "protocol": "tcp",
        "device_name": "",
        "global_segment_size": 1 << 30,
        "local_buffer_size": 64 << 20,
        "tenant_id": AWKWARD_TENANT,
        "mode": "embedded",
    }
    assert config.meta["vllm_model_name"] == "Qwen3-8B"
    assert config.instance_id == config.meta["instance_id"] == str(assignment.pk)


def test_vllm_disaggregated_roles_use_multiconnector(release, endpoints):
    prefill = kv_transfer_config("prefill", "production-2026-07")
    decode = kv_transfer_config("decode", "production-2026-07")
    assert prefill == {
        "kv_connector": "MultiConnector",
        "kv_role": "kv_producer",
        "kv_connector_extra_config": {
            "connectors": [
                {"kv_connector": "MooncakeConnector", "kv_role": "kv_producer"},
                {
                    "kv_connector": "MooncakeStoreConnector",
                    "kv_role": "kv_both",
                    "kv_connector_extra_config": {"cache_prefix": "production-2026-07"},
                },
            ]
        },
    }
    assert decode["kv_role"] == "kv_consumer"
    assert decode["kv_connector_extra_config"]["connectors"] == [
        {"kv_connector": "MooncakeConnector", "kv_role": "kv_consumer"},
        {
            "kv_connector": "MooncakeStoreConnector",
            "kv_role": "kv_consumer",
            "kv_connector_extra_config": {"cache_prefix": "production-2026-07"},
        },
    ]
    with pytest.raises(ValueError):
        kv_transfer_config("observer", "x")


def _store_connector(argv) -> dict:
    document = json.loads(_flag(list(argv), "--kv-transfer-config"))
    if document["kv_connector"] == "MultiConnector":
        document = document["kv_connector_extra_config"]["connectors"][1]
    return document


def test_prefill_and_decode_get_identical_namespace_values(release, endpoints):
    prefill = make_assignment(make_node("node-a"), release, role="prefill", bootstrap_port=8998)
    decode = make_assignment(make_node("node-b", hostname="10.0.0.2"), release, role="decode")
    configs = render_release(release, endpoints)
    assert [c.meta["assignment"] for c in configs] == [prefill.pk, decode.pk]
    p, d = configs
    extra = "kv_connector_extra_config"
    assert _store_connector(p.argv)[extra] == _store_connector(d.argv)[extra]
    assert p.env["PYTHONHASHSEED"] == d.env["PYTHONHASHSEED"] == release.hash_seed
    assert _flag(list(p.argv), "--model") == _flag(list(d.argv), "--model")
    assert _flag(list(p.argv), "--served-model-name") == _flag(list(d.argv), "--served-model-name")
    assert p.env["VLLM_MOONCAKE_BOOTSTRAP_PORT"] == "8998" and "VLLM_MOONCAKE_BOOTSTRAP_PORT" not in d.env
    assert list(p.files.values()) == list(d.files.values())


def test_sglang_launch_line(awkward, endpoints):
    release = _release(awkward, "sglang")
    node = make_node(hostname="node-a.example")
    assignment = make_assignment(node, release, role="prefill", bootstrap_port=8998, pp_size=2)
    config = render_assignment(assignment, endpoints)
    argv = list(config.argv)
    assert argv[:3] == ["python", "-m", "sglang.launch_server"]
    assert _flag(argv, "--model-path") == AWKWARD_PATH
    assert _flag(argv, "--served-model-name") == AWKWARD_MODEL
    assert _flag(argv, "--page-size") == "16"
    assert _flag(argv, "--pp-size") == "2"
    assert "--enable-hierarchical-cache" in argv
    assert _flag(argv, "--hicache-storage-backend") == "mooncake"
    assert _flag(argv, "--disaggregation-mode") == "prefill"
    assert _flag(argv, "--disaggregation-transfer-backend") == "mooncake"
    assert _flag(argv, "--disaggregation-bootstrap-port") == "8998"
    extra = json.loads(_flag(argv, "--hicache-storage-backend-extra-config"))
    assert extra["extra_backend_tag"] == "production-2026-07-sglang"
    assert extra["master_server_address"] == "10.0.0.9:50051"
    assert extra["tenant_id"] == AWKWARD_TENANT
    assert extra["local_hostname"] == "node-a.example"
    path = f"/etc/kvpool/{assignment.pk}/sglang_hicache_mooncake.json"
    assert dict(config.env) == {"SGLANG_HICACHE_MOONCAKE_CONFIG_PATH": path, "MOONCAKE_TENANT_ID": AWKWARD_TENANT}
    file_config = json.loads(config.files[path])
    assert file_config == {k: v for k, v in extra.items() if k != "extra_backend_tag"}


def test_sglang_aggregated_has_no_disaggregation_flags(served_model, endpoints):
    release = make_release(served_model, engine="sglang", engine_version="0.5.23")
    config = render_assignment(make_assignment(make_node(), release), endpoints)
    assert "--disaggregation-mode" not in config.argv and "--kv-cache-dtype" not in config.argv
    assert "--revision" not in config.argv and "--quantization" not in config.argv


AWKWARD_TENANTS = ["123", "yes", "null", "a: b", "#hash", "ü-tenant", "x'y\"z", "~", "- dash", "a b"]


def test_master_line_and_quota_yaml(db, endpoints):
    for index, name in enumerate(AWKWARD_TENANTS):
        make_tenant(name, quota=(index + 1) << 20)
    make_tenant("odd-size", quota=1000)
    from tenants.models import Tenant

    config = render_master(Tenant.objects.all(), endpoints)
    assert list(config.argv) == [
        "mooncake_master",
        "--rpc_address=10.0.0.9",
        "--rpc_port=50051",
        "--enable_http_metadata_server=true",
        "--http_metadata_server_host=10.0.0.9",
        "--http_metadata_server_port=8080",
        "--metrics_port=9003",
        "--enable_multi_tenants=true",
        "--tenant_quota_connector_type=file",
        "--tenant_quota_connector_uri=/etc/kvpool/tenant_quotas.yaml",
        "--eviction_high_watermark_ratio=0.9",
        "--eviction_ratio=0.05",
    ]
    assert shlex.split(config.command_line) == list(config.argv)
    document = yaml.safe_load(config.files["/etc/kvpool/tenant_quotas.yaml"])
    expected = sorted(
        [{"name": name, "quota": f"{i + 1}MB"} for i, name in enumerate(AWKWARD_TENANTS)]
        + [{"name": "odd-size", "quota": "1000B"}],
        key=lambda entry: entry["name"],
    )
    assert document == {"version": 1, "tenants": expected}


def test_master_eviction_flags_come_from_the_settings(db, endpoints, settings):
    """The registry knows the watermark it budgets against: the flags it renders are the settings' values."""
    settings.KVPOOL_MASTER_EVICTION_HIGH_WATERMARK_RATIO, settings.KVPOOL_MASTER_EVICTION_RATIO = 0.75, 0.2
    argv = render_master([], endpoints).argv
    assert argv[-2:] == ("--eviction_high_watermark_ratio=0.75", "--eviction_ratio=0.2")
    from tenants.room import MasterEviction

    assert render_master([], endpoints, eviction=MasterEviction(0.5, 1)).argv[-2:] == (
        "--eviction_high_watermark_ratio=0.5", "--eviction_ratio=1.0")


def test_eviction_ratio_settings_are_parsed_strictly(monkeypatch):
    from dashboard.env import ImproperlyConfiguredValue, env_ratio

    assert env_ratio("KVPOOL_TEST_RATIO", 0.9) == 0.9
    monkeypatch.setenv("KVPOOL_TEST_RATIO", " 0.8 ")
    assert env_ratio("KVPOOL_TEST_RATIO", 0.9) == 0.8
    for bad in ("0", "1.5", "-0.1", "nan", "ninety"):
        monkeypatch.setenv("KVPOOL_TEST_RATIO", bad)
        with pytest.raises(ImproperlyConfiguredValue, match="KVPOOL_TEST_RATIO"):
            env_ratio("KVPOOL_TEST_RATIO", 0.9)


def test_master_without_http_metadata(db):
    endpoints = RenderTarget(master_server_address="[::1]:50051", metadata_server="P2PHANDSHAKE",
                             admin_url="http://h:9100/")
    config = render_master([], endpoints)
    assert "--enable_http_metadata_server=true" not in config.argv
    assert "--rpc_address=::1" in config.argv and "--metrics_port=9100" in config.argv
    assert yaml.safe_load(next(iter(config.files.values()))) == {"version": 1, "tenants": []}
    with pytest.raises(ValueError, match="must be 'host:port'"):
        render_master([], RenderTarget(master_server_address="nohost", metadata_server="x"))


def test_endpoints_from_settings(settings):
    settings.KVPOOL_MASTER_ADDRESS = "m:1"
    settings.KVPOOL_METADATA_SERVER = "http://m:2/metadata"
    settings.KVPOOL_STORE_PROTOCOL = "rdma"
    settings.KVPOOL_MASTER_ADMIN_URL = "http://m:3"
    endpoints = RenderTarget.from_settings(config_dir="/tmp/x")
    assert (endpoints.master_server_address, endpoints.protocol, endpoints.config_dir) == ("m:1", "rdma", "/tmp/x")
    # the config document carries the Store endpoints alone, the one type with Mooncake's field names
    assert endpoints.store_endpoints() == StoreEndpoints(
        master_server_address="m:1", metadata_server="http://m:2/metadata", protocol="rdma",
        global_segment_size=endpoints.global_segment_size, local_buffer_size=endpoints.local_buffer_size)
    assert set(endpoints.mooncake_config("t")) == {*StoreEndpoints.model_fields, "tenant_id"}


def test_rendered_config_refuses_bad_env_names():
    with pytest.raises(ValueError):
        RenderedConfig(kind="x", argv=["a"], env={"BAD NAME": "1"})


def test_vllm_cpu_standalone_store_node(served_model, endpoints):
    """A CPU node in standalone-store mode: CPU flags and env, engines mount no segment, events to the node."""
    release = make_release(served_model, hash_seed="42", block_size=32)
    node = make_node(hostname="127.0.0.1", device="cpu", store_mode="standalone-store",
                     store_segment_bytes=256 << 20, kv_events_port=6001)
    assignment = make_assignment(node, release, port=8100)
    config = render_assignment(assignment, endpoints)
    argv = list(config.argv)
    assert "--enforce-eager" in argv and _flag(argv, "--block-size") == "32" and _flag(argv, "--host") == "127.0.0.1"
    events = json.loads(_flag(argv, "--kv-events-config"))
    assert events["endpoint"] == "ipc://kv-events.sock" and events["topic"] == str(assignment.pk)
    assert config.env["VLLM_CPU_KVCACHE_SPACE"] == "1" and config.env["PYTHONHASHSEED"] == "42"
    assert "HF_HUB_OFFLINE" not in config.env  # a hub id may need downloading
    mooncake = json.loads(config.files[config.env["MOONCAKE_CONFIG_PATH"]])
    assert mooncake["mode"] == "standalone-store" and mooncake["global_segment_size"] == 0


def test_ipv6_hostname_is_bare_in_host_flags(served_model, endpoints):
    config = render_assignment(make_assignment(make_node(hostname="[fd00::1]"), make_release(served_model)), endpoints)
    assert _flag(list(config.argv), "--host") == "fd00::1" and config.env["VLLM_HOST_IP"] == "fd00::1"


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_launch_spec_is_relative_to_the_instance_directory(awkward, endpoints, engine):
    assignment = make_assignment(make_node(), _release(awkward, engine))
    config = render_assignment(assignment, endpoints)
    spec = config.launch_spec()
    assert spec.instance_id == str(assignment.pk) and spec.argv == config.argv and spec.argv[0] == ENGINE_PYTHON
    name = {"vllm": "mooncake.json", "sglang": "sglang_hicache_mooncake.json"}[engine]
    var = {"vllm": "MOONCAKE_CONFIG_PATH", "sglang": "SGLANG_HICACHE_MOONCAKE_CONFIG_PATH"}[engine]
    assert dict(spec.file_env) == {var: name}
    assert spec.files[name] == config.files[f"/etc/kvpool/{assignment.pk}/{name}"]
    assert var not in spec.env and {**spec.env, var: f"/etc/kvpool/{assignment.pk}/{name}"} == dict(config.env)
    assert LaunchSpec.from_dict(json.loads(json.dumps(spec.to_dict()))) == spec


def test_launch_spec_refusals():
    with pytest.raises(ValueError, match="not an engine instance"):
        RenderedConfig(kind="mooncake_master", argv=["m"]).launch_spec()
    with pytest.raises(ValueError, match="not directly inside"):
        RenderedConfig(kind="vllm", argv=["python"], files={"/elsewhere/x.json": "{}"}, instance_id="1",
                       instance_dir="/etc/kvpool/1").launch_spec()
    for bad in ("", "a/b", ".."):
        with pytest.raises(ValueError, match="invalid instance id"):
            LaunchSpec(instance_id=bad, argv=["python"])
    with pytest.raises(ValueError, match="invalid instance file name"):
        LaunchSpec(instance_id="1", argv=["python"], files={"../x": ""})
    with pytest.raises(ValueError, match="not one of the instance's files"):
        LaunchSpec(instance_id="1", argv=["python"], file_env={"X": "missing.json"})


def test_store_client_rendered_for_standalone_nodes_only(db, endpoints):
    assert render_store_client(make_node("emb"), endpoints) is None
    node = make_node("alone", hostname="10.0.0.7", store_mode="standalone-store", store_segment_bytes=64 << 30,
                     store_client_port=50100)
    config = render_store_client(node, endpoints)
    assert list(config.argv) == [
        "mooncake_client",
        "--host=10.0.0.7",
        "--port=50100",
        "--master_server_address=10.0.0.9:50051",
        "--metadata_server=http://10.0.0.9:8080/metadata",
        "--protocol=tcp",
        f"--global_segment_size={64 << 30}",
    ]
    rdma = RenderTarget(master_server_address="m:1", metadata_server="http://m:2/metadata", device_name="mlx5_0")
    assert render_store_client(node, rdma).argv[-1] == "--device_names=mlx5_0"
