"""Helpers shared by the engine renderers."""
from __future__ import annotations

import json
from typing import Any

from tenants.rendering.types import RenderTarget


def compact_json(value: Any) -> str:
    """JSON with no spaces and non-ASCII kept (one shell argument; ``json.loads`` gives ``value`` back)."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def pretty_json(value: Any) -> str:
    """Indented JSON for config files, newline-terminated."""
    return json.dumps(value, indent=2, ensure_ascii=False) + "\n"


def store_client_config(endpoints: RenderTarget, tenant_id: str) -> dict[str, Any]:
    """Keys of the Mooncake client config that vLLM 0.33.0 reads from ``MOONCAKE_CONFIG_PATH`` (sizes in bytes)."""
    return endpoints.mooncake_config(tenant_id)


def instance_id(assignment) -> str:
    """The instance's id in config documents (``InstanceSpec.instance_id``), directory names and KV-event
    topics: the assignment's primary key as a decimal string."""
    return str(assignment.pk)


def instance_dir(endpoints: RenderTarget, assignment) -> str:
    """Per-instance directory for rendered files: ``<config_dir>/<instance_id>``."""
    return f"{endpoints.config_dir.rstrip('/') or ''}/{instance_id(assignment)}"


def instance_meta(assignment) -> dict[str, Any]:
    """What a rendered instance was made from, for API consumers and the config push.

    ``adapters_without_path`` (only when not empty) names the release's LoRA adapters stored without a path
    (before migration 0005): the launch line leaves them out, since no engine can load a name alone.
    """
    release = assignment.release
    model = release.model
    meta = {
        "assignment": assignment.pk,
        "instance_id": instance_id(assignment),
        "node": assignment.node.name,
        "engine": release.engine,
        "role": assignment.role,
        "release": release.pk,
        "namespace": release.namespace,
        "fingerprint": release.fingerprint,
        "tenant_id": model.tenant.tenant_id,
        "served_model_name": model.served_model_name,
        "vllm_model_name": model.vllm_model_name,
    }
    unlaunched = release.adapters_without_path
    if unlaunched:
        meta["adapters_without_path"] = unlaunched
    return meta


def cuda_env(assignment) -> dict[str, str]:
    """``CUDA_VISIBLE_DEVICES`` when the assignment pins devices."""
    return {"CUDA_VISIBLE_DEVICES": assignment.gpu_ids} if assignment.gpu_ids else {}

