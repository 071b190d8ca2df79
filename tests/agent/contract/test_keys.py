"""Key grammar of vLLM 0.33.0 and SGLang 0.5.23 in both directions, with property-style random checks."""

from __future__ import annotations

import random
import re
import string

import pytest

from agent.contract import keys
from agent.contract.keys import SglangKey, UnknownKey, VllmKey

H64 = "0123456789abcdef" * 4
H32 = "fedcba9876543210" * 2
AWKWARD = string.ascii_letters + string.digits + "@_-/.:+*?()[]{}^$|\\ \t\n\u00e9\u4e2d\U0001f600%=,#'\"~"


def test_vllm_examples() -> None:
    k = f"prod-2026-07@Qwen3-8B@tp_rank:1@pcp0@dcp2@pp_rank:3@group:4@{H64}"
    p = keys.parse(k)
    assert p == VllmKey(model_name="Qwen3-8B", block_hash=H64, cache_prefix="prod-2026-07", tp_rank=1, pcp_rank=0,
                        dcp_rank=2, pp_rank=3, group=4)
    assert p.namespace == "prod-2026-07" and p.digest == bytes.fromhex(H64)
    assert keys.format(p) == k
    bare = f"Qwen3-8B@tp_rank:0@pcp0@dcp0@pp_rank:0@group:0@{H32}"
    assert keys.parse(bare) == VllmKey(model_name="Qwen3-8B", block_hash=H32)
    assert keys.vllm_key("Qwen3-8B", bytes.fromhex(H32)) == bare


def test_sglang_examples() -> None:
    k = f"production-2026-07_Qwen-Qwen3-8B_{H64}_3_k"
    p = keys.parse(k)
    assert p == SglangKey(model_component="Qwen-Qwen3-8B", page_hash=H64, tp_rank=3, kind="k",
                          extra_backend_tag="production-2026-07", pp_rank=None, exact_split=False)
    assert keys.format(p) == k and p.namespace == "production-2026-07"
    assert keys.sglang_keys("Qwen/Qwen3-8B", H64, extra_backend_tag="production-2026-07", tp_rank=3) == (
        k, k[:-1] + "v")
    pp = keys.parse(f"qwen3-8b_{H64}_0_2_v")
    assert isinstance(pp, SglangKey) and pp.pp_rank == 2 and pp.extra_backend_tag is None and pp.kind == "v"


def test_sglang_known_models_resolve_underscores() -> None:
    k = f"rel_my_model_{H64}_0_k"
    guessed = keys.parse(k)
    assert guessed.extra_backend_tag == "rel" and guessed.model_component == "my_model"
    untagged = keys.parse(f"my_model_{H64}_0_k", known_models=["my_model"])
    assert untagged.extra_backend_tag is None and untagged.model_component == "my_model" and untagged.exact_split
    tagged = keys.parse(k, known_models=["org/other", "my_model"])
    assert tagged.extra_backend_tag == "rel" and tagged.exact_split
    for p in (guessed, untagged, tagged):
        assert keys.format(p) in (k, f"my_model_{H64}_0_k")


@pytest.mark.parametrize("bad", [
    "", "plain", "@", f"@Qwen@tp_rank:0@pcp0@dcp0@pp_rank:0@group:0@{H64}",
    f"Qwen@tp_rank:01@pcp0@dcp0@pp_rank:0@group:0@{H64}",  # leading zero
    f"Qwen@tp_rank:0@pcp0@dcp0@pp_rank:0@group:0@{H64.upper()}",  # upper-case hex
    f"Qwen@tp_rank:0@pcp0@dcp0@pp_rank:0@{H64}",  # no group
    f"model_{H64[:-1]}_0_k", f"model_{H64}_0_x", f"model_{H64}_k", f"_{H64}_0_k"[1:],
])
def test_unknown_keys_are_reported_not_raised(bad: str) -> None:
    p = keys.parse(bad)
    assert isinstance(p, UnknownKey) and p.key == bad and keys.format(p) == bad


def test_non_string_is_unknown() -> None:
    assert isinstance(keys.parse(b"bytes"), UnknownKey)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        keys.format("not parsed")  # type: ignore[arg-type]


def _random_text(rng: random.Random, n: int) -> str:
    return "".join(rng.choice(AWKWARD) for _ in range(n))


def test_property_format_parse_roundtrip_for_any_string() -> None:
    rng = random.Random(1234)
    valid = [f"p@m@tp_rank:0@pcp1@dcp2@pp_rank:3@group:4@{H64}", f"tag_model_{H64}_0_1_k", f"m_{H64}_12_v"]
    for _ in range(3000):
        if rng.random() < 0.5:
            k = _random_text(rng, rng.randrange(0, 40))
        else:  # mutate a valid key: insert / delete / replace a character
            k = list(rng.choice(valid))
            for _ in range(rng.randrange(1, 3)):
                i = rng.randrange(len(k))
                op = rng.randrange(3)
                if op == 0:
                    k.insert(i, rng.choice(AWKWARD))
                elif op == 1 and len(k) > 1:
                    del k[i]
                else:
                    k[i] = rng.choice(AWKWARD)
            k = "".join(k)
        p = keys.parse(k)
        assert keys.format(p) == k, (k, p)


def test_property_fields_survive_for_awkward_names() -> None:
    rng = random.Random(99)
    no_at = AWKWARD.replace("@", "")
    for _ in range(1500):
        model = "".join(rng.choice(no_at) for _ in range(rng.randrange(1, 20)))
        prefix = rng.choice([None, _random_text(rng, rng.randrange(1, 20))])
        digest = rng.randbytes(rng.choice([16, 32]))
        ranks = dict(tp_rank=rng.randrange(64), pcp_rank=rng.randrange(8), dcp_rank=rng.randrange(8),
                     pp_rank=rng.randrange(8), group=rng.randrange(4))
        k = keys.vllm_key(model, digest, cache_prefix=prefix, **ranks)
        assert keys.parse(k) == VllmKey(model_name=model, block_hash=digest.hex(), cache_prefix=prefix, **ranks)

        served = _random_text(rng, rng.randrange(1, 20))
        tag = rng.choice([None, "".join(rng.choice(AWKWARD.replace("_", "")) for _ in range(rng.randrange(1, 12)))])
        page = rng.randbytes(32)
        tp, pp = rng.randrange(16), rng.choice([None, rng.randrange(4)])
        k_key, v_key = keys.sglang_keys(served, page, extra_backend_tag=tag, tp_rank=tp, pp_rank=pp)
        for key, kind in ((k_key, "k"), (v_key, "v")):
            parsed = keys.parse(key, known_models=[served])
            assert parsed == SglangKey(model_component=served.replace("/", "-"), page_hash=page.hex(), tp_rank=tp,
                                       kind=kind, extra_backend_tag=tag, pp_rank=pp, exact_split=True), key
            assert keys.format(parsed) == key
            blind = keys.parse(key)
            assert keys.format(blind) == key
            if tag is not None:  # a tag never has "_", so the blind split is right too
                assert blind.extra_backend_tag == tag and blind.model_component == served.replace("/", "-")


def test_vllm_model_name() -> None:
    assert keys.vllm_model_name("Qwen/Qwen3-8B") == keys.vllm_model_name("/models/Qwen3-8B/") == "Qwen3-8B"
    with pytest.raises(ValueError):
        keys.vllm_model_name("///")


def test_release_regex_selects_exactly_one_release() -> None:
    rel = "prod.v1+(x)"
    ours = [keys.vllm_key("M-1.5", H64, cache_prefix=rel, tp_rank=t, group=g) for t in range(3) for g in range(2)]
    others = [keys.vllm_key("M-1.5", H64, cache_prefix="prodXv1+(x)"), keys.vllm_key("M-1.5", H64),
              keys.vllm_key("M-2", H64, cache_prefix=rel), keys.vllm_key("M-1.5", H64, cache_prefix="a@" + rel),
              f"{rel}_M-1.5_{H64}_0_k"]
    pattern = re.compile(keys.release_regex("vllm", rel, "M-1.5"))
    assert all(pattern.search(k) for k in ours) and not any(pattern.search(k) for k in others)
    any_model = re.compile(keys.release_regex("vllm", rel))
    assert any_model.search(keys.vllm_key("M-2", H64, cache_prefix=rel)) and not any_model.search(others[1])

    sg = [*keys.sglang_keys("org/M.1", H64, extra_backend_tag=rel, tp_rank=2),
          *keys.sglang_keys("org/M.1", H64, extra_backend_tag=rel, tp_rank=0, pp_rank=1)]
    sg_others = [*keys.sglang_keys("org/M.1", H64, extra_backend_tag="other"),
                 *keys.sglang_keys("org/M.1", H64), *keys.sglang_keys("org/M.2", H64, extra_backend_tag=rel)]
    sg_pattern = re.compile(keys.release_regex("sglang", rel, "org/M.1"))
    assert all(sg_pattern.search(k) for k in sg) and not any(sg_pattern.search(k) for k in sg_others)
    with pytest.raises(ValueError):
        keys.release_regex("sglang", "")
    with pytest.raises(ValueError):
        keys.release_regex("trt", "x")


def test_regex_escape_is_literal() -> None:
    text = "a.b*c+d?e(f)g[h]i{j}k^l$m|n\\o@p_q-r/s:t u"
    assert re.fullmatch(keys.regex_escape(text), text)
    assert not re.fullmatch(keys.regex_escape(text), text.replace(".", "X"))
