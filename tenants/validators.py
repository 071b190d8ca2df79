"""Name rules of the registry, one function per rule, each raising Django's ``ValidationError``.

Model fields attach these validators, so the REST API (DRF copies model validators), the admin and the
page forms all refuse the same input with the same message. Rules and the upstream behaviour they protect:

* tenant_id — Mooncake 0.3.13.post1 master: non-empty, must not start with ``_`` (reserved), no NUL or other
  control characters. We also refuse invisible Unicode format characters (zero-width space etc.), which the
  master accepts but an operator cannot see.
* release namespace — becomes SGLang 0.5.23 ``extra_backend_tag`` (joined to the model with ``_``) and vLLM
  0.33.0 ``cache_prefix`` (joined with ``@``), and the agent purges a release with ``remove_by_regex`` on it:
  lower-case letters, digits and inner hyphens only (no ``_``, ``@``, ``.``, whitespace), 1-63 characters, so
  it is a literal in any regex dialect and both key grammars stay parseable.
* served model name / vLLM model name — no whitespace, control characters or ``@`` (vLLM's key separator).
"""
from __future__ import annotations

import re
import unicodedata

from django.core.exceptions import ValidationError

# Unicode categories refused in every name: control, format (invisible), surrogate, private use, unassigned,
# line and paragraph separators.
_INVISIBLE_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"})
_DNS_LABEL_RE = re.compile(r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?")
_HASH_SEED_RE = re.compile(r"0|[1-9][0-9]{0,9}")
_VERSION_RE = re.compile(r"[0-9A-Za-z][0-9A-Za-z.+_-]*")
_TOKEN_RE = re.compile(r"[a-z0-9][a-z0-9_.-]*")
_HOSTNAME_RE = re.compile(r"[A-Za-z0-9]([A-Za-z0-9.:-]*[A-Za-z0-9])?|\[[0-9A-Fa-f:.]+\]")

#: Largest ``PYTHONHASHSEED`` CPython accepts (it refuses to start otherwise).
MAX_HASH_SEED = 4294967295


def _first_invisible(value: str) -> str | None:
    for char in value:
        if unicodedata.category(char) in _INVISIBLE_CATEGORIES:
            return char
    return None


def _refuse_invisible(value: str, what: str) -> None:
    char = _first_invisible(value)
    if char is not None:
        raise ValidationError(
            f"{what} must not contain control or invisible characters (found U+{ord(char):04X}).",
            code="invisible_character",
        )


def _refuse_whitespace(value: str, what: str) -> None:
    if any(char.isspace() for char in value):
        raise ValidationError(f"{what} must not contain whitespace.", code="whitespace")


def validate_tenant_id(value: str) -> None:
    """Mooncake tenant id rules: non-empty, no leading ``_``, no NUL/control/invisible characters."""
    if value == "":
        raise ValidationError("tenant_id must not be empty.", code="empty")
    if value.startswith("_"):
        raise ValidationError(
            "tenant_id must not start with '_' (Mooncake reserves those names).", code="reserved_prefix"
        )
    if "\x00" in value:
        raise ValidationError("tenant_id must not contain NUL characters.", code="nul")
    _refuse_invisible(value, "tenant_id")


def validate_release_namespace(value: str) -> None:
    """Release namespace (= ``extra_backend_tag`` = ``cache_prefix``): ``[a-z0-9]`` and inner ``-``, 1-63 chars."""
    if _DNS_LABEL_RE.fullmatch(value):
        return
    if value == "":
        reason = "must not be empty"
    elif "_" in value:
        reason = "must not contain '_' (SGLang joins extra_backend_tag and model name with '_')"
    elif "@" in value:
        reason = "must not contain '@' (vLLM separates cache_prefix from the key with '@')"
    elif any(char.isspace() for char in value):
        reason = "must not contain whitespace"
    elif len(value) > 63:
        reason = f"must be at most 63 characters (has {len(value)})"
    elif value != value.lower():
        reason = "must be lower case"
    elif value.startswith("-") or value.endswith("-"):
        reason = "must start and end with a letter or digit"
    else:
        reason = "may contain only lower-case letters a-z, digits and '-' (no '.', so it is a literal in a regex)"
    raise ValidationError(
        f"Release namespace '{value}' {reason}; it becomes SGLang extra_backend_tag and vLLM cache_prefix, "
        "e.g. 'production-2026-07'.",
        code="invalid_namespace",
    )


def validate_dns_label(value: str) -> None:
    """Names used in queue names and file paths (nodes, request groups): ``[a-z0-9]`` and inner ``-``, ≤63."""
    if not _DNS_LABEL_RE.fullmatch(value):
        raise ValidationError(
            f"'{value}' must be 1-63 lower-case letters, digits or inner '-' (e.g. 'node-a').",
            code="invalid_name",
        )


def validate_served_model_name(value: str) -> None:
    """SGLang ``--served-model-name``: non-empty, no whitespace, control characters or ``@``."""
    if value == "":
        raise ValidationError("served_model_name must not be empty.", code="empty")
    _refuse_invisible(value, "served_model_name")
    _refuse_whitespace(value, "served_model_name")
    if "@" in value:
        raise ValidationError(
            "served_model_name must not contain '@' (the separator of vLLM store keys).", code="at_sign"
        )


def derive_vllm_model_name(model_path: str) -> str:
    """vLLM 0.33.0 MooncakeStoreConnector model identifier: trailing ``/`` stripped, last path component.

    ``Qwen/Qwen3-8B`` and ``/models/Qwen3-8B/`` both give ``Qwen3-8B``; ``/`` gives ``""``.
    """
    return model_path.rstrip("/").split("/")[-1]


def validate_model_path(value: str) -> None:
    """Model path / hub id passed to both engines; its vLLM identifier must be a valid key component."""
    if value.strip() == "":
        raise ValidationError("model_path must not be empty.", code="empty")
    _refuse_invisible(value, "model_path")
    name = derive_vllm_model_name(value)
    if name == "":
        raise ValidationError(
            f"model_path '{value}' has no last path component, so vLLM derives an empty model name.",
            code="empty_vllm_name",
        )
    if "@" in name or any(char.isspace() for char in name):
        raise ValidationError(
            f"model_path '{value}' gives the vLLM model name '{name}', which must not contain '@' or "
            "whitespace ('@' separates the fields of vLLM store keys).",
            code="invalid_vllm_name",
        )


def validate_hash_seed(value: str) -> None:
    """``PYTHONHASHSEED`` as CPython accepts it: a decimal integer in [0, 4294967295], no leading zeros.

    vLLM 0.33.0 hashes the seed *string* into its root block hash, so ``"07"`` and ``"7"`` would differ; the
    canonical spelling is required.
    """
    if not _HASH_SEED_RE.fullmatch(value) or int(value) > MAX_HASH_SEED:
        raise ValidationError(
            f"hash_seed '{value}' must be a decimal integer from 0 to {MAX_HASH_SEED} without leading zeros "
            "(it is the PYTHONHASHSEED every instance of the release runs with).",
            code="invalid_hash_seed",
        )


def validate_version(value: str) -> None:
    """Engine versions and similar identifiers: ``[0-9A-Za-z]`` then ``[0-9A-Za-z.+_-]*``."""
    if not _VERSION_RE.fullmatch(value):
        raise ValidationError(
            f"'{value}' must start with a letter or digit and contain only letters, digits, '.', '+', '_', '-'.",
            code="invalid_version",
        )


def validate_token(value: str) -> None:
    """Engine option values such as a KV dtype or quantization method: ``[a-z0-9][a-z0-9_.-]*``."""
    if not _TOKEN_RE.fullmatch(value):
        raise ValidationError(
            f"'{value}' must be lower case and contain only letters, digits, '_', '.', '-'.", code="invalid_token"
        )


def validate_no_whitespace(value: str) -> None:
    """Free identifiers (weights revision, cache salt): printable, no whitespace."""
    _refuse_invisible(value, "This value")
    _refuse_whitespace(value, "This value")


def validate_hostname(value: str) -> None:
    """A host name, IPv4 address or bracketed IPv6 address."""
    if not _HOSTNAME_RE.fullmatch(value):
        raise ValidationError(f"'{value}' is not a host name or IP address.", code="invalid_hostname")


def validate_gpu_ids(value: str) -> None:
    """``CUDA_VISIBLE_DEVICES`` list: comma-separated distinct device ordinals, e.g. ``0,1``; blank = unset."""
    if value == "":
        return
    parts = value.split(",")
    if not all(part.isdigit() and part.isascii() for part in parts):
        raise ValidationError(
            f"gpu_ids '{value}' must be comma-separated device ordinals like '0,1'.", code="invalid_value"
        )
    if len(set(int(part) for part in parts)) != len(parts):
        raise ValidationError(f"gpu_ids '{value}' lists a device twice.", code="duplicate")


def validate_adapters(value: object) -> None:
    """LoRA adapter names: a list of distinct non-empty strings without whitespace or control characters."""
    if not isinstance(value, list):
        raise ValidationError("adapters must be a list of LoRA adapter names.", code="invalid_value")
    seen: set[str] = set()
    for name in value:
        if not isinstance(name, str) or name == "":
            raise ValidationError("each adapter must be a non-empty string (a LoRA name).", code="invalid_value")
        _refuse_invisible(name, f"adapter '{name}'")
        _refuse_whitespace(name, f"adapter '{name}'")
        if name in seen:
            raise ValidationError(f"adapter '{name}' is listed twice.", code="duplicate")
        seen.add(name)


#: Largest primary key the registry's tables hold (a signed 64-bit ``BigAutoField``).
MAX_OBJECT_ID = 2**63 - 1


def parse_object_id(text: object) -> int | None:
    """An object id written as ASCII digits (``"12"``) -> ``12``; ``None`` for anything else.

    Stricter than ``str.isdigit()``, which also accepts superscripts and other Unicode digits (``"²"``) that
    ``int()`` then refuses; ids above ``MAX_OBJECT_ID`` (which no row can have, and which overflow SQLite's
    integers) are ``None`` as well. Raises nothing.
    """
    if not isinstance(text, str) or not text or not text.isascii() or not text.isdigit():
        return None
    value = int(text)
    return value if 0 < value <= MAX_OBJECT_ID else None
