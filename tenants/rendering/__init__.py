"""Pure rendering of engine and master configuration from registry objects (no HTTP, no Celery).

Public API::

    StoreEndpoints                              # agent.contract.messages: the Store endpoints, Mooncake's names
    RenderTarget(master_server_address, metadata_server, protocol="tcp", device_name="",
                 global_segment_size=4 GiB, local_buffer_size=512 MiB,
                 admin_url="http://127.0.0.1:9003", config_dir="/etc/kvpool")  # a StoreEndpoints with the
    RenderTarget.from_settings(**overrides)     # master admin URL and the node's config directory
    RenderedConfig(kind, argv, env, files, meta, instance_id, instance_dir)
        # .command_line, .shell_line, .to_dict(), .launch_spec() -> LaunchSpec (engine instances)
    LaunchSpec(instance_id, argv, env, file_env, files)  # files by name in the instance directory
    ENGINE_PYTHON = "python"                    # argv[0] of engine launches: the engine's interpreter
    render_assignment(assignment, endpoints) -> RenderedConfig      # dispatches on the release engine
    render_release(release, endpoints) -> list[RenderedConfig]      # one per assignment
    render_sglang(assignment, endpoints) / render_vllm(assignment, endpoints)
    kv_transfer_config(role, cache_prefix) -> dict
    kv_events_config(node, topic) -> dict                            # vLLM --kv-events-config
    vllm_mooncake_config(assignment, endpoints) -> dict              # vLLM MOONCAKE_CONFIG_PATH document
    render_store_client(node, endpoints) -> RenderedConfig | None   # standalone-store mooncake_client
    vllm_lora_args(release) / sglang_lora_args(release) -> list[str]  # LoRA adapter flags (may be empty)
    render_master(tenants, endpoints) -> RenderedConfig            # argv + tenant_quotas.yaml
    render_masters(tenants, endpoints[, topology]) -> list[RenderedConfig]  # each master (HA: the etcd set)
    render_tenant_quotas_yaml(tenants) -> str
"""
from agent.contract.messages import StoreEndpoints
from tenants.rendering.lora import sglang_lora_args, vllm_lora_args
from tenants.rendering.master import render_master, render_masters, render_tenant_quotas_yaml
from tenants.rendering.node import render_store_client
from tenants.rendering.release import render_assignment, render_release
from tenants.rendering.sglang import render_sglang, sglang_extra_config
from tenants.rendering.types import ENGINE_PYTHON, LaunchSpec, RenderedConfig, RenderTarget
from tenants.rendering.vllm import kv_events_config, kv_transfer_config, render_vllm, vllm_mooncake_config

__all__ = [
    "ENGINE_PYTHON",
    "LaunchSpec",
    "RenderTarget",
    "RenderedConfig",
    "StoreEndpoints",
    "kv_events_config",
    "kv_transfer_config",
    "render_assignment",
    "render_master",
    "render_masters",
    "render_release",
    "render_sglang",
    "render_store_client",
    "render_tenant_quotas_yaml",
    "render_vllm",
    "sglang_extra_config",
    "sglang_lora_args",
    "vllm_lora_args",
    "vllm_mooncake_config",
]
