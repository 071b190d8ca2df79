"""vLLM 0.33.0 ``vllm serve`` line, ``--kv-transfer-config`` and ``MOONCAKE_CONFIG_PATH`` file."""
from __future__ import annotations

from typing import Any

from tenants.choices import InstanceRole
from tenants.rendering.common import (
    compact_json,
    cuda_env,
    instance_dir,
    instance_meta,
    pretty_json,
    store_client_config,
)
from tenants.rendering.lora import vllm_lora_args
from tenants.rendering.types import RenderedConfig, StoreEndpoints

#: Name of the config file written next to each instance (``MOONCAKE_CONFIG_PATH``).
CONFIG_FILE_NAME = "vllm_mooncake.json"


def kv_transfer_config(role: str, cache_prefix: str) -> dict[str, Any]:
    """The ``--kv-transfer-config`` document for an instance role, as vLLM's MooncakeStoreConnector guide has it.

    * ``both`` — ``MooncakeStoreConnector`` with ``kv_role`` ``kv_both``.
    * ``prefill`` / ``decode`` (disaggregated) — ``MultiConnector`` with ``kv_role`` ``kv_producer`` /
      ``kv_consumer`` combining ``MooncakeConnector`` (point-to-point transfer, same role) and
      ``MooncakeStoreConnector`` (shared pool: ``kv_both`` on prefill, ``kv_consumer`` on decode).

    The store connector always carries ``kv_connector_extra_config.cache_prefix`` = the release namespace.
    """
    store_extra = {"cache_prefix": cache_prefix}
    if role == InstanceRole.BOTH:
        return {
            "kv_connector": "MooncakeStoreConnector",
            "kv_role": "kv_both",
            "kv_connector_extra_config": store_extra,
        }
    if role == InstanceRole.PREFILL:
        outer, store_role = "kv_producer", "kv_both"
    elif role == InstanceRole.DECODE:
        outer, store_role = "kv_consumer", "kv_consumer"
    else:
        raise ValueError(f"unknown instance role {role!r}")
    return {
        "kv_connector": "MultiConnector",
        "kv_role": outer,
        "kv_connector_extra_config": {
            "connectors": [
                {"kv_connector": "MooncakeConnector", "kv_role": outer},
                {
                    "kv_connector": "MooncakeStoreConnector",
                    "kv_role": store_role,
                    "kv_connector_extra_config": store_extra,
                },
            ]
        },
    }


def render_vllm(assignment, endpoints: StoreEndpoints) -> RenderedConfig:
    """Render ``vllm serve <model_path> ...`` for ``assignment`` (an ``InstanceAssignment``).

    Arguments: the model path (vLLM derives the key's model name from its last component),
    ``--served-model-name``, ``--revision`` (when pinned), ``--port``, ``--tensor-parallel-size``,
    ``--pipeline-parallel-size`` / ``--decode-context-parallel-size`` / ``--prefill-context-parallel-size``
    (each when > 1), ``--block-size``, ``--kv-cache-dtype`` (unless ``auto``), ``--quantization`` (when set),
    the LoRA flags ``--enable-lora --lora-modules ...`` (when the release has adapters with paths, see
    ``tenants.rendering.lora.vllm_lora_args``), ``--prefix-caching-hash-algo`` and ``--kv-transfer-config``
    (see ``kv_transfer_config``). Environment:
    ``MOONCAKE_CONFIG_PATH`` (file with ``metadata_server``, ``master_server_address``, ``protocol``,
    ``device_name``, ``global_segment_size``, ``local_buffer_size`` in bytes, ``tenant_id``), the release's
    ``PYTHONHASHSEED`` (identical for every instance of the release, as xxhash block hashes require),
    ``VLLM_MOONCAKE_BOOTSTRAP_PORT`` for P/D roles with a bootstrap port, ``CUDA_VISIBLE_DEVICES``.
    Adapters stored without a path (before migration 0005) are not rendered; ``meta`` lists them under
    ``adapters_without_path``.
    """
    release = assignment.release
    model = release.model
    argv: list[str] = ["vllm", "serve", model.model_path, "--served-model-name", model.served_model_name]
    if release.weights_revision:
        argv += ["--revision", release.weights_revision]
    argv += ["--port", str(assignment.port), "--tensor-parallel-size", str(assignment.tp_size)]
    for flag, size in (
        ("--pipeline-parallel-size", assignment.pp_size),
        ("--prefill-context-parallel-size", assignment.pcp_size),
        ("--decode-context-parallel-size", assignment.dcp_size),
    ):
        if size > 1:
            argv += [flag, str(size)]
    argv += ["--block-size", str(release.block_size)]
    if release.kv_dtype != "auto":
        argv += ["--kv-cache-dtype", release.kv_dtype]
    if release.quantization:
        argv += ["--quantization", release.quantization]
    argv += vllm_lora_args(release)
    argv += [
        "--prefix-caching-hash-algo", release.hash_algo,
        "--kv-transfer-config", compact_json(kv_transfer_config(assignment.role, release.namespace)),
    ]  # fmt: skip
    config_path = f"{instance_dir(endpoints, assignment)}/{CONFIG_FILE_NAME}"
    env = {"MOONCAKE_CONFIG_PATH": config_path, "PYTHONHASHSEED": release.hash_seed, **cuda_env(assignment)}
    if assignment.role != InstanceRole.BOTH and assignment.bootstrap_port is not None:
        env["VLLM_MOONCAKE_BOOTSTRAP_PORT"] = str(assignment.bootstrap_port)
    files = {config_path: pretty_json(store_client_config(endpoints, model.tenant.tenant_id))}
    return RenderedConfig(kind="vllm", argv=argv, env=env, files=files, meta=instance_meta(assignment))
