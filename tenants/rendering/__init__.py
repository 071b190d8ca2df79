"""Pure rendering of engine and master configuration from registry objects (no HTTP, no Celery).

Public API::

    StoreEndpoints(master_address, metadata_server, protocol="tcp", device_name="",
                   global_segment_size=4 GiB, local_buffer_size=512 MiB,
                   admin_url="http://127.0.0.1:9003", config_dir="/etc/kvpool")
    StoreEndpoints.from_settings(**overrides)
    RenderedConfig(kind, argv, env, files, meta)  # .command_line, .shell_line, .to_dict()
    render_assignment(assignment, endpoints) -> RenderedConfig      # dispatches on the release engine
    render_release(release, endpoints) -> list[RenderedConfig]      # one per assignment
    render_sglang(assignment, endpoints) / render_vllm(assignment, endpoints)
    kv_transfer_config(role, cache_prefix) -> dict
    vllm_lora_args(release) / sglang_lora_args(release) -> list[str]  # LoRA adapter flags (may be empty)
    render_master(tenants, endpoints) -> RenderedConfig            # argv + tenant_quotas.yaml
    render_tenant_quotas_yaml(tenants) -> str
"""
from tenants.rendering.lora import sglang_lora_args, vllm_lora_args
from tenants.rendering.master import render_master, render_tenant_quotas_yaml
from tenants.rendering.release import render_assignment, render_release
from tenants.rendering.sglang import render_sglang, sglang_extra_config
from tenants.rendering.types import RenderedConfig, StoreEndpoints
from tenants.rendering.vllm import kv_transfer_config, render_vllm

__all__ = [
    "RenderedConfig",
    "StoreEndpoints",
    "kv_transfer_config",
    "render_assignment",
    "render_master",
    "render_release",
    "render_sglang",
    "render_tenant_quotas_yaml",
    "render_vllm",
    "sglang_extra_config",
    "sglang_lora_args",
    "vllm_lora_args",
]
