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
* LoRA adapters — name + path (absolute directory or hub id ``owner/name``): vLLM 0.33.0 hashes
  ``("lora", name, path)`` into every block of an adapter request, SGLang 0.5.23 seeds the adapter's page
  chains with an id derived from both, so the path is part of the cache identity (see ``LoraAdapter``).
  ``,`` is refused in names and paths, ``=`` in names, and ``;`` in the names and paths of adapters added or
  changed from now on, so that the engines' lists and the dashboard's ``name=path;rank=N`` field read back
  exactly what was stored.
* launch arguments — a value the engines receive as its own ``argv`` element (served model name, model path,
  weights revision) must not start with ``-``: argparse would read it as an option (``--served-model-name
  --trust-remote-code``). Node model roots and model paths are absolute directories in normal form or hub ids
  (``validate_model_location``), so ``tenants.placement`` can tell whether a path lies under a root.
"""
from __future__ import annotations

import posixpath
import re
import unicodedata
from dataclasses import dataclass

from django.core.exceptions import ValidationError

from agent.contract.keys import vllm_model_name
from agent.contract.names import DNS_LABEL_RE

# Unicode categories refused in every name: control, format (invisible), surrogate, private use, unassigned,
# line and paragraph separators.
_INVISIBLE_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"})
_DNS_LABEL_RE = DNS_LABEL_RE  # the agent checks its --node against the same rule (agent.contract.names)
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


#: Why an ``engine_user`` naming an account of ``settings.KVPOOL_RESERVED_ACCOUNTS`` (or root) is refused.
ENGINE_USER_RESERVED_ACCOUNT = ("engine_user '{name}' is not available: it is an account of the control plane or "
                                "of the system (KVPOOL_RESERVED_ACCOUNTS).")


def validate_engine_user(value: str) -> None:
    """A tenant's ``engine_user``: a portable POSIX user name (``agent.contract.messages.ENGINE_USER_RE``), not of
    the default form ``kvpool-t<number>`` (those belong to tenants without an own name), not ``root`` and not an
    account of ``settings.KVPOOL_RESERVED_ACCOUNTS`` (the control plane's accounts, well-known service accounts).

    Raises ``ValidationError`` (code ``invalid`` or ``reserved``); that a name is held or was held by another tenant
    is ``Tenant.clean``'s to say (``ReservedEngineUser``). The node agent refuses system accounts by uid as well.
    """
    from django.conf import settings

    from agent.contract.messages import ENGINE_USER_RE

    if not value:
        return
    if not ENGINE_USER_RE.fullmatch(value):
        raise ValidationError("engine_user must be a POSIX user name: a lower-case letter or '_', then up to 31 "
                              "lower-case letters, digits, '_' or '-'.", code="invalid")
    if value == "root" or value in getattr(settings, "KVPOOL_RESERVED_ACCOUNTS", ()):
        raise ValidationError(ENGINE_USER_RESERVED_ACCOUNT.format(name=value), code="reserved")
    if re.fullmatch(r"kvpool-t[0-9]+", value):
        raise ValidationError(f"engine_user '{value}' is not available.", code="reserved")


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
    refuse_option_like(value, "served_model_name")


def refuse_option_like(value: str, what: str) -> None:
    """Refuse a value that becomes its own engine ``argv`` element and starts with ``-`` (argparse would read it as
    an option, e.g. ``--served-model-name --trust-remote-code``)."""
    if value.startswith("-"):
        raise ValidationError(
            f"{what} must not start with '-': the engines get it as a command-line argument, where it would read "
            "as an option.",
            code="option_like",
        )


def validate_model_path(value: str) -> None:
    """Model path / hub id passed to both engines; its vLLM identifier must be a valid key component, and it must
    not start with ``-`` (it is the argument of ``--model`` / ``--model-path``).

    This is the rule every stored path keeps passing; ``validate_model_location`` adds the form a path set or
    changed now must have."""
    if value.strip() == "":
        raise ValidationError("model_path must not be empty.", code="empty")
    _refuse_invisible(value, "model_path")
    refuse_option_like(value, "model_path")
    try:
        name = vllm_model_name(value)
    except ValueError:
        raise ValidationError(
            f"model_path '{value}' has no last path component, so vLLM derives an empty model name.",
            code="empty_vllm_name",
        ) from None
    if "@" in name or any(char.isspace() for char in name):
        raise ValidationError(
            f"model_path '{value}' gives the vLLM model name '{name}', which must not contain '@' or "
            "whitespace ('@' separates the fields of vLLM store keys).",
            code="invalid_vllm_name",
        )


#: Longest absolute path the registry takes for a model, adapter or model root.
MAX_PATH_LENGTH = 1024
_MODEL_LOCATION_HINT = "give an absolute directory such as '/models/Qwen3-8B' or a hub id such as 'Qwen/Qwen3-8B'"


def validate_absolute_directory(value: object, what: str) -> None:
    """An absolute directory in normal form: starts with one ``/``, below ``/``, no ``.``/``..`` parts, ``//`` or
    trailing ``/`` (``posixpath.normpath`` leaves it unchanged), no control or invisible characters, at most
    ``MAX_PATH_LENGTH`` characters. Normal form is what lets a string comparison tell whether a path lies under a
    root (``/models/../etc`` is refused, not resolved); symbolic links are not followed (the registry does not
    see the node's file system), so a root must not hold links that lead out of it."""
    if not isinstance(value, str) or not value.startswith("/"):
        raise ValidationError(f"{what} must be an absolute directory such as '/models'.", code="invalid_value")
    _refuse_invisible(value, what)
    if len(value) > MAX_PATH_LENGTH:
        raise ValidationError(f"{what} must be at most {MAX_PATH_LENGTH} characters.", code="max_length")
    normal = posixpath.normpath(value)
    if normal == "/" or value.startswith("//"):
        raise ValidationError(f"{what} '{value}' must name a directory below '/'.", code="invalid_value")
    if normal != value:
        raise ValidationError(
            f"{what} '{value}' must be written in normal form, '{normal}' (no '.', '..', '//' or trailing '/').",
            code="invalid_value",
        )


def validate_model_location(value: str) -> None:
    """The form of a model path set or changed now: an absolute directory in normal form
    (``validate_absolute_directory``) or a hub id, ``owner/name`` or a bare ``name`` (letters, digits, ``.``,
    ``_``, ``-``, each part starting and ending with a letter or digit, at most 96 characters).

    Relative paths, ``~`` and ``..`` are refused: they resolve against the engine's working or home directory, so
    the registry could not tell whether they lie under the node's model roots (``Node.model_roots``).
    """
    if value.startswith("/"):
        validate_absolute_directory(value, "model_path")
        return
    if not (_HUB_ID_RE.fullmatch(value) or _HUB_ID_PART_RE.fullmatch(value)) or len(value) > _MAX_HUB_ID or (
            "--" in value or ".." in value):
        raise ValidationError(
            f"model_path '{value}' is neither an absolute directory in normal form nor a hub id; "
            f"{_MODEL_LOCATION_HINT}.",
            code="invalid_value",
        )


#: Most model roots one node declares.
MAX_MODEL_ROOTS = 32


def validate_model_roots(value: object) -> None:
    """``Node.model_roots``: a list of at most ``MAX_MODEL_ROOTS`` distinct absolute directories in normal form
    (``validate_absolute_directory``); empty means the node loads hub ids only."""
    if not isinstance(value, list):
        raise ValidationError("model_roots must be a list of absolute directories, e.g. [\"/models\"].",
                              code="invalid_value")
    if len(value) > MAX_MODEL_ROOTS:
        raise ValidationError(f"model_roots holds at most {MAX_MODEL_ROOTS} directories.", code="max_length")
    for root in value:
        validate_absolute_directory(root, "each model root")
    if len(set(value)) != len(value):
        raise ValidationError("model_roots lists a directory twice.", code="duplicate")


def validate_weights_revision(value: str) -> None:
    """``--revision`` of both engines: printable, no whitespace, not starting with ``-``."""
    validate_no_whitespace(value)
    refuse_option_like(value, "weights_revision")


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
    if len({int(part) for part in parts}) != len(parts):
        raise ValidationError(f"gpu_ids '{value}' lists a device twice.", code="duplicate")


#: vLLM 0.33.0 ``--max-lora-rank`` choices (``vllm.config.lora.MaxLoRARanks``); vLLM refuses to load an adapter
#: whose rank exceeds the value it runs with (default 16).
VLLM_MAX_LORA_RANKS: tuple[int, ...] = (1, 8, 16, 32, 64, 128, 256, 320, 512)
MAX_LORA_RANK = VLLM_MAX_LORA_RANKS[-1]
#: Most LoRA adapters one release loads: each is an engine argument and part of every instance's entry in its node's
#: config document (which the node's other tenants share). vLLM 0.33.0 keeps ``--max-loras`` (here: the count) in GPU
#: memory at once; SGLang 0.5.23 batches ``--max-loras-per-batch``.
MAX_ADAPTERS = 64
_ADAPTER_FIELDS = ("name", "path", "rank")
# A Hugging Face hub repository id as both engines download it: owner/name, letters, digits, '.', '_', '-',
# each part starting and ending with a letter or digit (the hub also refuses '--' and '..'), at most 96 chars.
_HUB_ID_PART = r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?"
_HUB_ID_RE = re.compile(f"{_HUB_ID_PART}/{_HUB_ID_PART}")
_HUB_ID_PART_RE = re.compile(_HUB_ID_PART)
_MAX_HUB_ID = 96
_ADAPTER_SHAPE = '{"name": ..., "path": ...} (and optionally "rank")'


@dataclass(frozen=True)
class LoraAdapter:
    """One LoRA adapter of a release, as vLLM 0.33.0 and SGLang 0.5.23 load it at launch.

    * ``name`` — what requests ask for (the request's model name); vLLM ``--lora-modules`` ``name``, SGLang
      ``--lora-paths`` ``lora_name``.
    * ``path`` — where the engine loads the weights from: an absolute directory on the node or a hub id
      ``owner/name``. vLLM puts ``("lora", name, path)`` into every block hash of an adapter request and SGLang
      derives the adapter's ``lora_id`` (its page-hash namespace) from ``name`` and ``path``, so the exact
      string is part of the cache identity: changed weights must come under a new path (neither engine pins a
      hub revision, and vLLM does not invalidate cached blocks when an adapter is reloaded in place from the same
      path). ``None`` for an adapter recorded before paths were required
      (migration 0005): kept as it was, but it cannot be launched until the release is copied with a path.
    * ``rank`` — the adapter's LoRA rank when declared (1-512); vLLM's ``--max-lora-rank`` must be at least it.
    """

    name: str
    path: str | None = None
    rank: int | None = None

    def to_json(self) -> dict[str, object]:
        """The stored form: ``{"name", "path"}`` plus ``"rank"`` when declared."""
        document: dict[str, object] = {"name": self.name, "path": self.path}
        if self.rank is not None:
            document["rank"] = self.rank
        return document


def lora_adapters(value: object) -> list[LoraAdapter]:
    """Stored ``Release.adapters`` -> ``LoraAdapter`` list, in stored order (no rule is checked here).

    Entries are objects ``{"name", "path"[, "rank"]}``; a bare string (the name-only form stored before
    migration 0005) reads as a name without a path. ``None`` reads as no adapters.

    Raises:
        TypeError: ``value`` is not a list, or an entry is neither a string nor an object with a ``name``.
    """
    if value is None:
        return []
    if not isinstance(value, list):
        raise TypeError("adapters must be a list")
    adapters = []
    for entry in value:
        if isinstance(entry, str):
            adapters.append(LoraAdapter(entry))
        elif isinstance(entry, dict) and "name" in entry:
            adapters.append(LoraAdapter(entry["name"], entry.get("path"), entry.get("rank")))
        else:
            raise TypeError(f"adapter entries must be objects with a name, got {entry!r}")
    return adapters


def validate_adapter_name(name: object) -> None:
    """A LoRA adapter name: a non-empty string without whitespace, control characters, ``,`` or ``=``.

    ``=`` and ``,`` would make the engines' ``name=path`` shorthand (vLLM ``--lora-modules``, SGLang
    ``--lora-paths``) and the page form's comma-separated list ambiguous.
    """
    if not isinstance(name, str) or name == "":
        raise ValidationError("each adapter needs a non-empty 'name' (the LoRA name requests ask for).",
                              code="invalid_value")
    _refuse_invisible(name, f"adapter '{name}'")
    _refuse_whitespace(name, f"adapter '{name}'")
    for char in ",=":
        if char in name:
            raise ValidationError(
                f"adapter name '{name}' must not contain '{char}' (it separates the engines' name=path lists).",
                code="invalid_value",
            )


def validate_adapter_path(path: object, name: str) -> None:
    """Where adapter ``name`` is loaded from: an absolute directory in normal form, or a hub id ``owner/name``.

    Both engines also accept relative paths and ``~``, but those resolve against the engine's working or home
    directory, so one string could name different weights on different nodes; they are refused. An absolute
    path must be written in normal form (no ``//``, ``.``/``..`` parts or trailing ``/``): the string is a
    block-hash input, so two spellings of one directory would never share cache entries. A hub id is downloaded
    by the engine (vLLM 0.33.0 ``get_adapter_absolute_path``, SGLang 0.5.23 ``LoRAConfig``) unless a directory
    of that relative name exists in its working directory, which both then load instead.
    """
    hint = "give an absolute directory such as '/adapters/sql-v1' or a hub id such as 'org/sql-lora'"
    if not isinstance(path, str) or path == "":
        raise ValidationError(f"adapter '{name}' path must be a non-empty string: {hint}.", code="invalid_value")
    _refuse_invisible(path, f"adapter '{name}' path")
    _refuse_whitespace(path, f"adapter '{name}' path")
    if "," in path:
        raise ValidationError(
            f"adapter '{name}' path '{path}' must not contain ',' (it separates the engines' name=path lists).",
            code="invalid_value",
        )
    if path.startswith("/"):
        normal = posixpath.normpath(path)
        if normal == "/" or path.startswith("//"):
            raise ValidationError(f"adapter '{name}' path '{path}' must name a directory below '/'.",
                                  code="invalid_value")
        if normal != path:
            raise ValidationError(
                f"adapter '{name}' path '{path}' must be written as '{normal}': the path is part of every block "
                "hash of the adapter's requests, so one directory must have one spelling.",
                code="invalid_value",
            )
        return
    if path.startswith(("~", ".")):
        raise ValidationError(
            f"adapter '{name}' path '{path}' is relative to the engine's home or working directory; {hint}.",
            code="invalid_value",
        )
    if not _HUB_ID_RE.fullmatch(path) or len(path) > _MAX_HUB_ID or "--" in path or ".." in path:
        raise ValidationError(
            f"adapter '{name}' path '{path}' is neither an absolute path nor a hub id 'owner/name' (at most "
            f"{_MAX_HUB_ID} characters); {hint}.",
            code="invalid_value",
        )


#: Separators of the dashboard's adapters field (``name=path;rank=N``, items joined with ``,``) that the engines'
#: own lists do not use; ``validate_new_adapter`` refuses them in adapters added or changed from now on.
ADAPTER_FORM_SEPARATOR = ";"


def validate_new_adapter(adapter: LoraAdapter) -> None:
    """Rules for an adapter being added or changed (its name or path differs from every stored adapter's).

    Neither name nor path may contain ``;``: the page form writes an adapter as ``name=path;rank=N``, so a
    ``;`` inside either would be read back as a rank (``/adapters/x;rank=5``) or as garbage, and saving the form
    would change the stored path, and with it the release's fingerprint. Adapters stored before this rule keep
    their value (``Release.clean`` applies it only to new name/path pairs), as adapters without a path do.

    Raises:
        ValidationError: naming the adapter and whether its name or its path holds the ``;``.
    """
    refuse_option_like(adapter.name, f"adapter name '{adapter.name}'")
    why = "it separates an adapter's path from its rank in the dashboard's adapters field, name=path;rank=N"
    if ADAPTER_FORM_SEPARATOR in adapter.name:
        raise ValidationError(f"adapter name '{adapter.name}' must not contain '{ADAPTER_FORM_SEPARATOR}' ({why}).",
                              code="invalid_value")
    if adapter.path is not None and ADAPTER_FORM_SEPARATOR in adapter.path:
        raise ValidationError(
            f"adapter '{adapter.name}' path '{adapter.path}' must not contain '{ADAPTER_FORM_SEPARATOR}' ({why}).",
            code="invalid_value",
        )


def validate_adapters(value: object) -> None:
    """LoRA adapters: a list of objects ``{"name", "path"[, "rank"]}`` with distinct names.

    ``name`` follows ``validate_adapter_name``, ``path`` ``validate_adapter_path`` (``null`` is accepted here
    for adapters recorded before paths were required; ``Release.clean`` refuses it for any new adapter),
    ``rank`` is an integer from 1 to 512 or absent/``null``. Unknown fields are refused. This is the rule every
    stored value keeps passing; ``validate_new_adapter`` adds the rules for adapters added or changed now.
    """
    if not isinstance(value, list):
        raise ValidationError(f"adapters must be a list of LoRA adapters, each {_ADAPTER_SHAPE}.",
                              code="invalid_value")
    seen: set[str] = set()
    for entry in value:
        if isinstance(entry, str):
            raise ValidationError(
                f"adapter '{entry}' must be an object {_ADAPTER_SHAPE}: the engines load a LoRA adapter from a "
                "path (an absolute directory or a hub id 'owner/name'), so a name alone cannot be launched.",
                code="invalid_value",
            )
        if not isinstance(entry, dict):
            raise ValidationError(f"each adapter must be an object {_ADAPTER_SHAPE}.", code="invalid_value")
        name = entry.get("name")
        validate_adapter_name(name)
        unknown = sorted(set(entry) - set(_ADAPTER_FIELDS))
        if unknown:
            raise ValidationError(
                f"adapter '{name}' has unknown field(s) {', '.join(repr(key) for key in unknown)}; "
                f"allowed: {', '.join(_ADAPTER_FIELDS)}.",
                code="invalid_value",
            )
        if entry.get("path") is not None:
            validate_adapter_path(entry["path"], name)
        rank = entry.get("rank")
        if rank is not None and (not isinstance(rank, int) or isinstance(rank, bool) or not 1 <= rank <= MAX_LORA_RANK):
            raise ValidationError(
                f"adapter '{name}' rank must be an integer from 1 to {MAX_LORA_RANK} (the LoRA rank r), "
                f"not {rank!r}.",
                code="invalid_value",
            )
        if name in seen:
            raise ValidationError(f"adapter '{name}' is listed twice.", code="duplicate")
        seen.add(name)


#: JSON Schema ``pattern`` of each name rule, for the API schema (``dashboard.api.schema``): ECMA 262 syntax that
#: Python's ``re`` reads the same way. Exact where the rule is a regular expression (namespaces, node and request
#: group names, versions, tokens, host names); elsewhere the part of the rule a pattern can say, which the rule
#: then narrows (``hash_seed`` at most 4294967295, no invisible Unicode characters, distinct GPU ids).
SCHEMA_PATTERNS = {
    validate_tenant_id: r"^[^_\u0000-\u001f\u007f-\u009f][^\u0000-\u001f\u007f-\u009f]*$",
    validate_release_namespace: f"^{_DNS_LABEL_RE.pattern}$",
    validate_dns_label: f"^{_DNS_LABEL_RE.pattern}$",
    validate_served_model_name: r"^[^\s@\u0000-\u001f\u007f-\u009f-][^\s@\u0000-\u001f\u007f-\u009f]*$",
    validate_hash_seed: f"^(?:{_HASH_SEED_RE.pattern})$",
    validate_version: f"^{_VERSION_RE.pattern}$",
    validate_token: f"^{_TOKEN_RE.pattern}$",
    validate_no_whitespace: r"^[^\s\u0000-\u001f\u007f-\u009f]*$",
    validate_weights_revision: r"^(?:[^\s\u0000-\u001f\u007f-\u009f-][^\s\u0000-\u001f\u007f-\u009f]*)?$",
    validate_hostname: f"^(?:{_HOSTNAME_RE.pattern})$",
    validate_gpu_ids: r"^(?:[0-9]+(?:,[0-9]+)*)?$",
}


#: Longest free text (the ``description`` of every registry object), in characters: ``RegistryModel.clean_fields``
#: refuses longer text, so the API, the admin and the page forms all do; the API schema says ``maxLength: 4000``.
MAX_TEXT_LENGTH = 4000


def validate_text_length(value: object) -> None:
    """Free text (a ``description``): at most ``MAX_TEXT_LENGTH`` characters."""
    if isinstance(value, str) and len(value) > MAX_TEXT_LENGTH:
        raise ValidationError(
            f"Ensure this field has no more than {MAX_TEXT_LENGTH} characters (it has {len(value)}).",
            code="max_length",
        )


#: Largest primary key the registry's tables hold (a signed 64-bit ``BigAutoField``).
MAX_OBJECT_ID = 2**63 - 1


def parse_object_id(text: object) -> int | None:
    """An object id written as ASCII digits (``"12"``) -> ``12``; ``None`` for anything else.

    Stricter than ``str.isdigit()``, which also accepts superscripts and other Unicode digits (``"²"``) that
    ``int()`` then refuses; ids above ``MAX_OBJECT_ID`` (which no row can have, and which overflow SQLite's
    integers) are ``None`` as well, and so are digit strings longer than any id (``int()`` raises ``ValueError``
    past 4,300 digits and takes quadratic time below that). Raises nothing.
    """
    if not isinstance(text, str) or not text or not text.isascii() or not text.isdigit():
        return None
    if len(text.lstrip("0")) > len(str(MAX_OBJECT_ID)):
        return None
    value = int(text)
    return value if 0 < value <= MAX_OBJECT_ID else None
