"""The Mooncake object key grammar of both engines, in both directions (the only place keys are built or read).

vLLM 0.33.0 ``MooncakeStoreConnector`` (one object = one block of one KV-cache group on one rank, all layers)::

    [<cache_prefix>@]<model_name>@tp_rank:<tp>@pcp<pcp>@dcp<dcp>@pp_rank:<pp>@group:<g>@<block hash hex>

``model_name`` is ``--model`` with a trailing ``/`` stripped, last path component (:func:`vllm_model_name`);
no ``cache_prefix`` means no prefix and no leading ``@``.

SGLang 0.5.23 HiCache Mooncake backend (one ``_k`` and one ``_v`` object per page)::

    <extra_backend_tag>_<served model name with "/" -> "-">_<page hash hex>_<tp_rank>[_<pp_rank>]_k   (and _v)

with ``<extra_backend_tag>_`` only when a tag is set and ``_<pp_rank>`` only when pipeline parallelism > 1.

The tenant is never in a key: it is the Mooncake client's ``tenant_id``.

:func:`parse` never raises: a key of neither grammar comes back as :class:`UnknownKey`. For every string
``k``, ``format(parse(k)) == k``. Where a grammar is ambiguous the parse is still lossless:

* vLLM: the model name is the ``@``-free segment just before ``@tp_rank:``; everything before it is the
  ``cache_prefix`` (so a prefix may contain ``@``, a model name may not).
* SGLang: the text before the page hash is ``tag_model``; a registry release namespace never contains ``_``,
  so the tag is the text before the first ``_`` -- unless ``known_models`` names the model, which wins.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import ClassVar, Literal

_HEX = re.compile(r"[0-9a-f]+")
_UINT = r"(?:0|[1-9][0-9]*)"

_VLLM_RE = re.compile(
    r"(?:(?P<prefix>.*)@)?(?P<model>[^@]+)"
    rf"@tp_rank:(?P<tp>{_UINT})@pcp(?P<pcp>{_UINT})@dcp(?P<dcp>{_UINT})@pp_rank:(?P<pp>{_UINT})"
    rf"@group:(?P<group>{_UINT})@(?P<hash>[0-9a-f]+)",
    re.DOTALL,
)
_SGLANG_RE = re.compile(
    rf"(?P<prefix>.+)_(?P<hash>[0-9a-f]{{64}})_(?P<tp>{_UINT})(?:_(?P<pp>{_UINT}))?_(?P<kind>[kv])",
    re.DOTALL,
)


def vllm_model_name(model: str) -> str:
    """vLLM 0.33.0's key model name: ``--model`` with trailing ``/`` stripped, last path component.

    ``Qwen/Qwen3-8B`` and ``/models/Qwen3-8B/`` both give ``Qwen3-8B``.

    Raises:
        ValueError: nothing is left (empty or only slashes).
    """
    name = model.rstrip("/").rsplit("/", 1)[-1]
    if not name:
        raise ValueError(f"model {model!r} has no last path component to name vLLM keys")
    return name


_derive_vllm_model_name = vllm_model_name  # for functions whose parameter has that name


def sglang_model_component(served_model_name: str) -> str:
    """SGLang 0.5.23's key model component: the served model name with ``/`` replaced by ``-``."""
    return served_model_name.replace("/", "-")


def key_model(engine: str, served_model_name: str, vllm_model_name: str = "") -> str:
    """The model component of ``engine``'s keys: the vLLM model name (derived from ``served_model_name`` when
    ``vllm_model_name`` is "") or SGLang's ``/`` -> ``-`` component of the served model name.

    Raises:
        ValueError: unknown engine, or no vLLM model name can be derived.
    """
    if engine == "vllm":
        return vllm_model_name or _derive_vllm_model_name(served_model_name)
    if engine == "sglang":
        return sglang_model_component(served_model_name)
    raise ValueError(f"engine must be 'vllm' or 'sglang', got {engine!r}")


@dataclass(frozen=True)
class VllmKey:
    """A parsed vLLM 0.33.0 ``MooncakeStoreConnector`` key.

    ``cache_prefix`` is ``None`` when the key has no prefix; ``block_hash`` is the lowercase hex of the raw
    block hash (64 chars for SHA-256, 32 for XXH3-128).
    """

    engine: ClassVar[str] = "vllm"
    model_name: str
    block_hash: str
    cache_prefix: str | None = None
    tp_rank: int = 0
    pcp_rank: int = 0
    dcp_rank: int = 0
    pp_rank: int = 0
    group: int = 0

    @property
    def namespace(self) -> str:
        """The release namespace (``cache_prefix``; "" when the key has none)."""
        return self.cache_prefix or ""

    @property
    def model(self) -> str:
        """The model component of the key."""
        return self.model_name

    @property
    def digest(self) -> bytes:
        """The raw block hash."""
        return bytes.fromhex(self.block_hash)


@dataclass(frozen=True)
class SglangKey:
    """A parsed SGLang 0.5.23 HiCache key (one of a page's ``_k``/``_v`` pair).

    ``extra_backend_tag`` is ``None`` when the key has none; ``model_component`` is the served model name
    with ``/`` replaced by ``-``; ``pp_rank`` is ``None`` when the key carries no PP rank (PP size 1);
    ``exact_split`` says whether the tag/model split was confirmed by a known model name.
    """

    engine: ClassVar[str] = "sglang"
    model_component: str
    page_hash: str
    tp_rank: int = 0
    kind: Literal["k", "v"] = "k"
    extra_backend_tag: str | None = None
    pp_rank: int | None = None
    exact_split: bool = True

    @property
    def namespace(self) -> str:
        """The release namespace (``extra_backend_tag``; "" when the key has none)."""
        return self.extra_backend_tag or ""

    @property
    def model(self) -> str:
        """The model component of the key."""
        return self.model_component

    @property
    def block_hash(self) -> str:
        """Same as :attr:`page_hash` (so both key kinds expose ``block_hash``)."""
        return self.page_hash

    @property
    def digest(self) -> bytes:
        """The raw page hash."""
        return bytes.fromhex(self.page_hash)


@dataclass(frozen=True)
class UnknownKey:
    """A key of neither grammar (kept verbatim; ``format`` returns it unchanged)."""

    engine: ClassVar[str] = "unknown"
    key: str
    reason: str = "matches neither the vLLM nor the SGLang key grammar"


ParsedKey = VllmKey | SglangKey | UnknownKey


def _parse_vllm(key: str) -> VllmKey | None:
    m = _VLLM_RE.fullmatch(key)
    if m is None:
        return None
    prefix = m.group("prefix")
    if prefix == "":
        return None  # "@model@..." -- vLLM never writes an empty prefix with its separator
    return VllmKey(model_name=m.group("model"), block_hash=m.group("hash"), cache_prefix=prefix,
                   tp_rank=int(m.group("tp")), pcp_rank=int(m.group("pcp")), dcp_rank=int(m.group("dcp")),
                   pp_rank=int(m.group("pp")), group=int(m.group("group")))


def _split_sglang_prefix(prefix: str, known: Iterable[str]) -> tuple[str | None, str, bool]:
    best: str | None = None
    for model in known:
        comp = sglang_model_component(model)
        if comp and (prefix == comp or prefix.endswith("_" + comp)) and (best is None or len(comp) > len(best)):
            best = comp
    if best is not None:
        tag = None if prefix == best else prefix[: -len(best) - 1]
        return tag, best, True
    if "_" in prefix:
        tag, model = prefix.split("_", 1)
        if tag and model:
            return tag, model, False
    return None, prefix, "_" not in prefix


def _parse_sglang(key: str, known: Iterable[str]) -> SglangKey | None:
    m = _SGLANG_RE.fullmatch(key)
    if m is None:
        return None
    tag, model, exact = _split_sglang_prefix(m.group("prefix"), known)
    pp = m.group("pp")
    return SglangKey(model_component=model, page_hash=m.group("hash"), tp_rank=int(m.group("tp")),
                     kind="k" if m.group("kind") == "k" else "v", extra_backend_tag=tag,
                     pp_rank=None if pp is None else int(pp), exact_split=exact)


def parse(key: str, *, known_models: Iterable[str] = ()) -> ParsedKey:
    """Parse a Mooncake key of either engine; never raises for a string.

    Args:
        key: the object key.
        known_models: served model names (or their key components) that resolve SGLang's tag/model split.

    Returns:
        :class:`VllmKey`, :class:`SglangKey` or :class:`UnknownKey`; ``format(parse(key)) == key`` always.
    """
    if not isinstance(key, str):
        return UnknownKey(key=repr(key), reason=f"not a string but {type(key).__name__}")
    known = tuple(known_models)
    parsed = _parse_vllm(key)
    if parsed is not None:
        return parsed
    parsed_sg = _parse_sglang(key, known)
    if parsed_sg is not None:
        return parsed_sg
    return UnknownKey(key=key)


def format_key(parsed: ParsedKey) -> str:
    """Render a parsed key back to its string (the inverse of :func:`parse`).

    Raises:
        TypeError: ``parsed`` is not one of the three key types.
    """
    if isinstance(parsed, VllmKey):
        return vllm_key(parsed.model_name, parsed.block_hash, cache_prefix=parsed.cache_prefix,
                        tp_rank=parsed.tp_rank, pcp_rank=parsed.pcp_rank, dcp_rank=parsed.dcp_rank,
                        pp_rank=parsed.pp_rank, group=parsed.group)
    if isinstance(parsed, SglangKey):
        prefix = sglang_key_prefix(parsed.model_component, parsed.extra_backend_tag, component=True)
        return sglang_key(prefix, parsed.page_hash, parsed.tp_rank, parsed.kind, pp_rank=parsed.pp_rank)
    if isinstance(parsed, UnknownKey):
        return parsed.key
    raise TypeError(f"cannot format {type(parsed).__name__}; expected VllmKey, SglangKey or UnknownKey")


#: ``format(parse(k)) == k``: the issue's name for :func:`format_key` (shadows the builtin in this module).
format = format_key  # noqa: A001


def vllm_key_prefix(model_name: str, *, cache_prefix: str | None = None, tp_rank: int = 0, pcp_rank: int = 0,
                    dcp_rank: int = 0, pp_rank: int = 0, group: int = 0) -> str:
    """Everything of a vLLM 0.33.0 key before the block hash, ending in ``@`` (built once per namespace)."""
    head = f"{cache_prefix}@" if cache_prefix else ""
    return (f"{head}{model_name}@tp_rank:{tp_rank}@pcp{pcp_rank}@dcp{dcp_rank}@pp_rank:{pp_rank}"
            f"@group:{group}@")


def vllm_key(model_name: str, block_hash: bytes | str, *, cache_prefix: str | None = None, tp_rank: int = 0,
             pcp_rank: int = 0, dcp_rank: int = 0, pp_rank: int = 0, group: int = 0) -> str:
    """One vLLM 0.33.0 ``MooncakeStoreConnector`` key (``block_hash`` as raw bytes or lowercase hex)."""
    hexed = block_hash.hex() if isinstance(block_hash, (bytes, bytearray)) else block_hash
    return vllm_key_prefix(model_name, cache_prefix=cache_prefix, tp_rank=tp_rank, pcp_rank=pcp_rank,
                           dcp_rank=dcp_rank, pp_rank=pp_rank, group=group) + hexed


def sglang_key_prefix(served_model_name: str, extra_backend_tag: str | None = None, *,
                      component: bool = False) -> str:
    """SGLang 0.5.23 key prefix ``"_".join([tag (if set), model with "/" -> "-"])``.

    ``component=True`` when ``served_model_name`` is already the key component (no ``/`` replacement).
    """
    model = served_model_name if component else sglang_model_component(served_model_name)
    return f"{extra_backend_tag}_{model}" if extra_backend_tag else model


def _sglang_tail(tp_rank: int, pp_rank: int | None, kind: str) -> str:
    pp = "" if pp_rank is None else f"_{pp_rank}"
    return f"_{tp_rank}{pp}_{kind}"


def sglang_key(prefix: str, page_hash: bytes | str, tp_rank: int, kind: str, *, pp_rank: int | None = None) -> str:
    """One SGLang 0.5.23 key: ``<prefix>_<page hash hex>_<tp_rank>[_<pp_rank>]_<k|v>``."""
    hexed = page_hash.hex() if isinstance(page_hash, (bytes, bytearray)) else page_hash
    return f"{prefix}_{hexed}{_sglang_tail(tp_rank, pp_rank, kind)}"


def sglang_key_parts(served_model_name: str, extra_backend_tag: str | None = None, *, tp_rank: int = 0,
                     pp_rank: int | None = None) -> tuple[str, tuple[str, str]]:
    """What every SGLang 0.5.23 key of one rank shares: ``(head, (k_tail, v_tail))`` with
    ``head + page hash hex + k_tail`` the page's ``_k`` key (built once per key space, then only concatenated).
    """
    head = sglang_key_prefix(served_model_name, extra_backend_tag) + "_"
    return head, (_sglang_tail(tp_rank, pp_rank, "k"), _sglang_tail(tp_rank, pp_rank, "v"))


def sglang_page_group(key: str) -> str:
    """The object group of an SGLang key: the key without its ``_k``/``_v`` suffix, the same for both objects
    of a page (``ReplicateConfig.group_ids``, so memory eviction takes the pair together).

    Raises:
        ValueError: ``key`` does not end in ``_k`` or ``_v``.
    """
    if not key.endswith(("_k", "_v")):
        raise ValueError(f"{key!r} is not an SGLang object key (no _k/_v suffix)")
    return key[:-2]


def sglang_keys(served_model_name: str, page_hash: bytes | str, *, extra_backend_tag: str | None = None,
                tp_rank: int = 0, pp_rank: int | None = None) -> tuple[str, str]:
    """The ``(_k, _v)`` key pair of one SGLang page."""
    prefix = sglang_key_prefix(served_model_name, extra_backend_tag)
    return (sglang_key(prefix, page_hash, tp_rank, "k", pp_rank=pp_rank),
            sglang_key(prefix, page_hash, tp_rank, "v", pp_rank=pp_rank))


# --- regexes for remove_by_regex --------------------------------------------------------------------------

_REGEX_META = frozenset("\\^$.|?*+()[]{}")


def regex_escape(text: str) -> str:
    """Escape ``text`` for a regex that both Python ``re`` and ECMAScript (``std::regex``) read literally.

    Only regex metacharacters are escaped (Python's ``re.escape`` also escapes characters such as ``@``, ``:``,
    space and ``_``, which ECMAScript's identity escapes do not all accept).
    """
    return "".join("\\" + ch if ch in _REGEX_META else ch for ch in text)


def vllm_release_regex(cache_prefix: str, model_name: str | None = None) -> str:
    """Regex matching every vLLM 0.33.0 key of a release namespace (all ranks, groups, blocks).

    ``cache_prefix`` "" selects keys without a prefix; ``model_name`` None matches any model of the prefix.
    """
    head = f"{regex_escape(cache_prefix)}@" if cache_prefix else ""
    model = regex_escape(model_name) if model_name is not None else "[^@]+"
    return (f"^{head}{model}@tp_rank:[0-9]+@pcp[0-9]+@dcp[0-9]+@pp_rank:[0-9]+@group:[0-9]+@[0-9a-f]+$")


def sglang_release_regex(extra_backend_tag: str, served_model_name: str | None = None) -> str:
    """Regex matching every SGLang 0.5.23 key of a release namespace (all ranks, ``_k`` and ``_v``).

    ``extra_backend_tag`` "" selects keys without a tag (then ``served_model_name`` is required, since an
    untagged prefix is just the model); ``served_model_name`` None matches any model under the tag.

    Raises:
        ValueError: neither a tag nor a model is given (the regex would match every SGLang key).
    """
    if not extra_backend_tag and served_model_name is None:
        raise ValueError("an untagged SGLang release needs served_model_name to scope its regex")
    head = f"{regex_escape(extra_backend_tag)}_" if extra_backend_tag else ""
    model = regex_escape(sglang_model_component(served_model_name)) if served_model_name is not None else ".+"
    return f"^{head}{model}_[0-9a-f]{{64}}_[0-9]+(_[0-9]+)?_[kv]$"


def release_regex(engine: str, namespace: str, model: str | None = None) -> str:
    """Regex for "all keys of a release namespace" of ``engine`` (``vllm``/``sglang``), for ``remove_by_regex``.

    ``model`` is the vLLM model name / SGLang served model name, or None for every model of the namespace.

    Raises:
        ValueError: unknown engine, or an SGLang release without tag and model.
    """
    if engine == "vllm":
        return vllm_release_regex(namespace, model)
    if engine == "sglang":
        return sglang_release_regex(namespace, model)
    raise ValueError(f"engine must be 'vllm' or 'sglang', got {engine!r}")


def release_keys_regex(engine: str, namespace: str, model: str) -> str:
    """The regex of every key of ``model`` under release ``namespace`` (:func:`release_regex`), as a purge uses it:
    both must be given (the dashboard shows it before a purge, the agent runs it).

    Raises:
        ValueError: empty namespace or model, or an unknown engine.
    """
    if not namespace:
        raise ValueError("namespace: a purge needs a release namespace (an empty one matches other releases)")
    if not model:
        raise ValueError("model: a purge is scoped to one model of the namespace")
    return release_regex(engine, namespace, model)
