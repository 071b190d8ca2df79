"""SGLang 0.5.23 launch line and HiCache Mooncake config for one instance assignment."""
from __future__ import annotations

from typing import Any

from tenants.choices import InstanceRole
from tenants.rendering.common import (
    compact_json,
    cuda_env,
    instance_dir,
    instance_id,
    instance_meta,
    pretty_json,
    store_client_config,
)
from tenants.rendering.lora import sglang_lora_args
from tenants.rendering.types import RenderedConfig, RenderTarget

#: Name of the config file written next to each instance (``SGLANG_HICACHE_MOONCAKE_CONFIG_PATH``).
CONFIG_FILE_NAME = "sglang_hicache_mooncake.json"


def sglang_store_config(assignment, endpoints: RenderTarget) -> dict[str, Any]:
    """Mooncake client settings for SGLang's HiCache backend: the store keys plus ``local_hostname``."""
    release = assignment.release
    config = store_client_config(endpoints, release.model.tenant.tenant_id)
    config["local_hostname"] = assignment.node.hostname
    return config


def sglang_extra_config(assignment, endpoints: RenderTarget) -> dict[str, Any]:
    """``--hicache-storage-backend-extra-config``: ``extra_backend_tag`` (the release namespace) and the full
    store config including ``master_server_address`` and ``tenant_id`` (SGLang 0.5.23 uses this dict before
    the config file when it names a master; ``tenant_id`` reaches the client when not ``default``)."""
    return {"extra_backend_tag": assignment.release.namespace, **sglang_store_config(assignment, endpoints)}


def render_sglang(assignment, endpoints: RenderTarget) -> RenderedConfig:
    """Render ``python -m sglang.launch_server ...`` for ``assignment`` (an ``InstanceAssignment``).

    Arguments: ``--model-path``, ``--served-model-name``, ``--revision`` (when the release pins weights),
    ``--port``, ``--tp-size``, ``--pp-size`` (> 1), ``--page-size`` (release block size in tokens),
    ``--kv-cache-dtype`` (unless ``auto``), ``--quantization`` (when set), ``--context-length`` (the release's
    ``max_model_len``, when set), the LoRA flags ``--enable-lora --lora-paths ...`` (when the release has
    adapters with paths, see ``tenants.rendering.lora``),
    ``--enable-hierarchical-cache``,
    ``--hicache-storage-backend mooncake``, ``--hicache-storage-backend-extra-config <JSON>``; for a
    ``prefill``/``decode`` role also ``--disaggregation-mode``, ``--disaggregation-transfer-backend mooncake``
    and ``--disaggregation-bootstrap-port`` (when set). The equivalent store config is rendered as a file
    pointed to by ``SGLANG_HICACHE_MOONCAKE_CONFIG_PATH`` (used when the extra config is dropped), and
    ``MOONCAKE_TENANT_ID`` is set too. Every value comes from the release, never from the instance, so the
    prefill and decode instances of one release carry identical namespace values.
    """
    release = assignment.release
    model = release.model
    argv: list[str] = [
        "python", "-m", "sglang.launch_server",
        "--model-path", model.model_path,
        "--served-model-name", model.served_model_name,
    ]  # fmt: skip
    if release.weights_revision:
        argv += ["--revision", release.weights_revision]
    argv += ["--port", str(assignment.port), "--tp-size", str(assignment.tp_size)]
    if assignment.pp_size > 1:
        argv += ["--pp-size", str(assignment.pp_size)]
    argv += ["--page-size", str(release.block_size)]
    if release.kv_dtype != "auto":
        argv += ["--kv-cache-dtype", release.kv_dtype]
    if release.quantization:
        argv += ["--quantization", release.quantization]
    if release.max_model_len is not None:
        argv += ["--context-length", str(release.max_model_len)]
    argv += sglang_lora_args(release)
    argv += [
        "--enable-hierarchical-cache",
        "--hicache-storage-backend", "mooncake",
        "--hicache-storage-backend-extra-config", compact_json(sglang_extra_config(assignment, endpoints)),
    ]  # fmt: skip
    if assignment.role in (InstanceRole.PREFILL, InstanceRole.DECODE):
        argv += ["--disaggregation-mode", assignment.role, "--disaggregation-transfer-backend", "mooncake"]
        if assignment.bootstrap_port is not None:
            argv += ["--disaggregation-bootstrap-port", str(assignment.bootstrap_port)]
    directory = instance_dir(endpoints, assignment)
    config_path = f"{directory}/{CONFIG_FILE_NAME}"
    env = {
        "SGLANG_HICACHE_MOONCAKE_CONFIG_PATH": config_path,
        "MOONCAKE_TENANT_ID": model.tenant.tenant_id,
        **cuda_env(assignment),
    }
    files = {config_path: pretty_json(sglang_store_config(assignment, endpoints))}
    return RenderedConfig(kind="sglang", argv=argv, env=env, files=files, meta=instance_meta(assignment),
                          instance_id=instance_id(assignment), instance_dir=directory,
                          user=assignment.release.model.tenant.engine_account)
