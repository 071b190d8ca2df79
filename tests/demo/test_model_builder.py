"""The model builder (scripts/tiny_model.py) read through demo.engine: the sizes' configs, their stamps and KV
layouts, and the stamp-aware cache of ensure_model. Nothing here imports torch or transformers or builds weights."""
from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from demo import engine


def test_large_model_has_more_layers_and_width_than_tiny():
    tiny, large = engine.model_spec("tiny"), engine.model_spec("large")
    assert (tiny["num_hidden_layers"], tiny["hidden_size"]) == (2, 128)
    assert (large["num_hidden_layers"], large["hidden_size"], large["intermediate_size"]) == (4, 2048, 5632)
    assert (large["num_attention_heads"], large["num_key_value_heads"], large["head_dim"]) == (16, 2, 128)
    assert large["num_attention_heads"] * large["head_dim"] == large["hidden_size"]
    # same vocabulary and tokenizer, so the harness's prompts (t0..t1019) serve both
    for key in ("vocab_size", "word_tokens", "specials", "dtype", "seed"):
        assert large[key] == tiny[key], key
    # a 2,000-token prompt and its output token fit; vLLM's CPU attention wants 32-token blocks
    assert large["max_position_embeddings"] >= 2048 + 1


def test_kv_bytes_parameters_and_layouts():
    builder = engine.model_builder()
    assert builder.kv_bytes_per_token(engine.model_spec("tiny")) == 512  # 16 KiB per 32-token block
    assert builder.kv_bytes_per_token(engine.model_spec("large")) == 4096  # 128 KiB per block
    # counts checked once against transformers' LlamaForCausalLM (untied embeddings)
    assert builder.parameter_count(engine.model_spec("tiny")) == 557_696
    assert builder.parameter_count(engine.model_spec("large")) == 180_373_504
    assert engine.model_layout("tiny") == engine.TINY_LAYOUT
    assert engine.model_layout("large") == {"num_layers": 4, "num_kv_heads": 2, "head_dim": 128, "block_size": 32}
    with pytest.raises(KeyError):
        engine.model_spec("huge")


def test_configs_and_stamps_are_deterministic():
    builder = engine.model_builder()
    for size in ("tiny", "large"):
        spec = engine.model_spec(size)
        kwargs = builder.llama_config_kwargs(spec)
        assert kwargs == builder.llama_config_kwargs(engine.model_spec(size))
        assert (kwargs["num_hidden_layers"], kwargs["hidden_size"]) == (spec["num_hidden_layers"], spec["hidden_size"])
        assert kwargs["tie_word_embeddings"] is False and kwargs["bos_token_id"] == 1020
        assert json.loads(builder.stamp_text(spec)) == spec
        assert builder.stamp_text(spec) == json.dumps(spec, sort_keys=True)
    # the tiny stamp is what builds before the large size existed wrote: those builds stay valid
    assert builder.stamp_text(engine.model_spec("tiny")) == json.dumps({
        "format": 1, "seed": 0, "num_hidden_layers": 2, "hidden_size": 128, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 32, "vocab_size": 1024, "intermediate_size": 256,
        "max_position_embeddings": 2048, "dtype": "bfloat16", "word_tokens": 1020,
        "specials": ["<s>", "</s>", "<unk>", "<pad>"]}, sort_keys=True)
    assert builder.stamp_text(engine.model_spec("tiny")) != builder.stamp_text(engine.model_spec("large"))


def _fake_python(tmp_path: Path) -> tuple[Path, Path]:
    """An 'interpreter' that records its arguments and writes a finished build with the stamp of --size."""
    calls = tmp_path / "calls.txt"
    builder = engine.model_builder()
    stamps = {size: builder.stamp_text(spec) for size, spec in builder.SPECS.items()}
    script = tmp_path / "python"
    script.write_text(
        "#!/bin/sh\n"
        f'echo "$@" >> {calls}\n'
        'size=$3; out=$4; mkdir -p "$out"; : > "$out/config.json"; : > "$out/model.safetensors"\n'
        f"case $size in tiny) printf '%s' '{stamps['tiny']}' ;; large) printf '%s' '{stamps['large']}' ;; esac"
        f' > "$out/{builder.STAMP}"\n'
        'echo "$size model: written to $out"\n')
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return script, calls


def test_ensure_model_builds_once_and_again_when_the_spec_changes(tmp_path):
    python, calls = _fake_python(tmp_path)
    out = tmp_path / "large-llama"
    lines: list[str] = []
    assert engine.ensure_model("large", python=python, out=out, echo=lines.append) == out
    assert calls.read_text().split() == [str(engine.TINY_MODEL_SCRIPT), "--size", "large", str(out)]
    assert engine.ensure_model("large", python=python, out=out, echo=lines.append) == out
    assert len(calls.read_text().splitlines()) == 1  # cached: the stamp matches
    (out / engine.model_builder().STAMP).write_text(engine.model_builder().stamp_text(engine.model_spec("tiny")))
    engine.ensure_model("large", python=python, out=out, echo=lines.append)  # a build of another spec
    assert len(calls.read_text().splitlines()) == 2
    assert any("large model: written to" in line for line in lines)


def test_ensure_model_reports_a_failed_build(tmp_path):
    script = tmp_path / "python"
    script.write_text("#!/bin/sh\necho 'out of disk' >&2\nexit 4\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    with pytest.raises(engine.EngineError, match=r"(?s)exit 4.*out of disk"):
        engine.ensure_model("large", python=script, out=tmp_path / "m", echo=lambda line: None)
