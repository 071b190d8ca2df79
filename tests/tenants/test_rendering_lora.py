"""LoRA adapter flags of the rendered launch lines (vLLM 0.33.0 ``--lora-modules``, SGLang 0.5.23 ``--lora-paths``)
and the adapter values the config push gives the agent for its block hashes."""
from __future__ import annotations

import argparse
import json
import shlex

import pytest

from agent.contract.messages import InstanceSpec
from agent.datapath.keyspace import adapter_keyspaces, sglang_lora_id
from dashboard.rollout.push import render_content
from tenants.models import Release
from tenants.rendering import render_assignment, sglang_lora_args, vllm_lora_args
from tests.support.factories import (
    make_assignment,
    make_model,
    make_node,
    make_release,
    make_tenant,
)
from tests.tenants.test_rendering import _flag, _run_in_shell

pytestmark = pytest.mark.django_db

# Shell-hostile but valid (no whitespace, ',' or ';'): quotes, $, =, &, | and backquotes.
AWKWARD_ADAPTER_PATH = "/srv/it's/$HOME/\"q\"/a=b&&rm|`id`"
ADAPTERS = [
    {"name": "sql-lora", "path": AWKWARD_ADAPTER_PATH, "rank": 20},
    {"name": "chat-lora", "path": "org/chat-lora"},
]


def _release(engine: str, adapters=ADAPTERS, **kwargs) -> Release:
    model = make_model(make_tenant("acme corp/ü 'q'", quota="1TB"), "org/Model's", model_path="/models/it's/Qwen3-8B")
    version = "0.5.23" if engine == "sglang" else "0.33.0"
    return make_release(model, f"prod-{engine}", engine=engine, engine_version=version, adapters=adapters, **kwargs)


def _vllm_parser() -> argparse.ArgumentParser:
    """The part of the vLLM server's parser (``vllm serve`` / ``vllm.entrypoints.openai.api_server``) that reads
    the model and adapters: ``--lora-modules`` (``nargs="+"``) items are ``name=path`` when they hold ``=`` and no
    ``,``, else JSON (``LoRAParserAction``)."""
    parser = argparse.ArgumentParser(prog="vllm serve")
    parser.add_argument("--model")
    parser.add_argument("--enable-lora", action=argparse.BooleanOptionalAction)
    parser.add_argument("--lora-modules", nargs="+")
    parser.add_argument("--max-loras", type=int)
    parser.add_argument("--max-lora-rank", type=int, choices=[1, 8, 16, 32, 64, 128, 256, 320, 512])
    return parser


def _vllm_modules(items: list[str]) -> list[dict]:
    modules = []
    for item in items:
        if "=" in item and "," not in item:
            name, path = item.split("=", 1)
            modules.append({"name": name, "path": path})
        else:
            modules.append(json.loads(item))
    return modules


def _sglang_parser() -> argparse.ArgumentParser:
    """SGLang's ``--lora-paths`` (``nargs="*"``): an item that starts with ``{`` and ends with ``}`` is JSON with
    ``lora_name``/``lora_path``, else ``NAME=PATH`` split at the first ``=`` (``LoRAPathAction`` + lora_hook)."""
    parser = argparse.ArgumentParser(prog="sglang.launch_server")
    parser.add_argument("--enable-lora", action=argparse.BooleanOptionalAction)
    parser.add_argument("--lora-paths", nargs="*")
    parser.add_argument("--max-loras-per-batch", type=int)
    return parser


def _sglang_paths(items: list[str]) -> list[dict]:
    refs = []
    for item in (raw.strip() for raw in items):
        if item.startswith("{") and item.endswith("}"):
            refs.append(json.loads(item))
        else:
            name, _, path = item.partition("=")
            refs.append({"lora_name": name, "lora_path": path})
    return refs


def test_vllm_line_loads_every_adapter_with_its_exact_path(endpoints, tmp_path):
    release = _release("vllm")
    config = render_assignment(make_assignment(make_node(), release), endpoints)
    argv = list(config.argv)
    assert shlex.split(config.command_line) == argv
    assert _run_in_shell(config, tmp_path)["argv"] == argv[1:]  # a real sh hands the engine the same arguments
    assert argv[:3] == ["python", "-m", "vllm.entrypoints.openai.api_server"]
    parsed, rest = _vllm_parser().parse_known_args(argv[3:])
    assert parsed.enable_lora is True and parsed.max_loras == 2 and parsed.max_lora_rank == 32
    assert _vllm_modules(parsed.lora_modules) == [
        {"name": "chat-lora", "path": "org/chat-lora"},
        {"name": "sql-lora", "path": AWKWARD_ADAPTER_PATH},
    ]
    assert parsed.model == "/models/it's/Qwen3-8B" and "--prefix-caching-hash-algo" in rest
    assert "adapters_without_path" not in config.meta


def test_vllm_single_adapter_keeps_engine_defaults(endpoints):
    release = _release("vllm", adapters=[{"name": "sql-lora", "path": "/adapters/sql-v1"}])
    argv = list(render_assignment(make_assignment(make_node(), release), endpoints).argv)
    assert argv[argv.index("--enable-lora"):argv.index("--enable-prefix-caching")] == [
        "--enable-lora", "--lora-modules", '{"name":"sql-lora","path":"/adapters/sql-v1"}']


@pytest.mark.parametrize(("ranks", "flag"), [((8,), "8"), ((16, 1), "16"), ((17,), "32"), ((300,), "320"),
                                             ((512,), "512"), ((None,), None)])
def test_vllm_max_lora_rank_fits_the_largest_declared_rank(served_model, ranks, flag):
    adapters = [{"name": f"a{i}", "path": f"/adapters/a{i}", "rank": rank} for i, rank in enumerate(ranks)]
    argv = vllm_lora_args(make_release(served_model, adapters=adapters))
    assert (_flag(argv, "--max-lora-rank") if "--max-lora-rank" in argv else None) == flag


def test_sglang_line_loads_every_adapter_with_its_exact_path(endpoints, tmp_path):
    release = _release("sglang")
    config = render_assignment(make_assignment(make_node(), release), endpoints)
    argv = list(config.argv)
    assert shlex.split(config.command_line) == argv
    assert _run_in_shell(config, tmp_path)["argv"] == argv[1:]
    parsed, rest = _sglang_parser().parse_known_args(argv[3:])
    assert parsed.enable_lora is True and parsed.max_loras_per_batch is None  # 2 adapters + base fit in 8
    assert _sglang_paths(parsed.lora_paths) == [
        {"lora_name": "chat-lora", "lora_path": "org/chat-lora"},
        {"lora_name": "sql-lora", "lora_path": AWKWARD_ADAPTER_PATH},
    ]
    assert "--enable-hierarchical-cache" in rest and "--max-lora-rank" not in argv  # SGLang infers the rank


def test_sglang_raises_max_loras_per_batch_only_when_needed(served_model):
    def release(count: int) -> Release:
        adapters = [{"name": f"a{i}", "path": f"/adapters/a{i}"} for i in range(count)]
        return make_release(served_model, f"n{count}", engine="sglang", engine_version="0.5.23", adapters=adapters)

    assert "--max-loras-per-batch" not in sglang_lora_args(release(7))
    assert _flag(sglang_lora_args(release(8)), "--max-loras-per-batch") == "9"


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_no_adapters_no_lora_flags(served_model, endpoints, engine):
    release = make_release(served_model, engine=engine, engine_version="0.5.23" if engine == "sglang" else "0.33.0")
    argv = render_assignment(make_assignment(make_node(), release), endpoints).argv
    assert "--enable-lora" not in argv and "--lora-modules" not in argv and "--lora-paths" not in argv


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_adapter_stored_without_path_is_listed_not_launched(endpoints, engine):
    release = _release(engine, adapters=[{"name": "chat-lora", "path": "org/chat-lora"}])
    Release.objects.filter(pk=release.pk).update(
        adapters=[{"name": "old-lora", "path": None}, {"name": "chat-lora", "path": "org/chat-lora"}])
    release.refresh_from_db()
    config = render_assignment(make_assignment(make_node(), release), endpoints)
    assert config.meta["adapters_without_path"] == ["old-lora"]
    assert config.to_dict()["adapters_without_path"] == ["old-lora"]
    assert "old-lora" not in config.command_line and "chat-lora" in config.command_line


# --- what the agent gets: the same name and path as the engine ---------------------------------------------------


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_pushed_adapters_give_the_agent_the_engines_hash_inputs(endpoints, engine):
    release = _release(engine)
    node = make_node()
    config = render_assignment(make_assignment(node, release), endpoints)
    if engine == "vllm":
        launched = {m["name"]: m["path"] for m in _vllm_modules(_vllm_parser().parse_known_args(
            list(config.argv)[2:])[0].lora_modules)}
    else:
        launched = {r["lora_name"]: r["lora_path"] for r in _sglang_paths(_sglang_parser().parse_known_args(
            list(config.argv)[3:])[0].lora_paths)}
    [raw] = render_content(node)["instances"]
    spec = InstanceSpec.model_validate(raw)
    assert [(a.name, a.path) for a in spec.kv_layout.adapters] == sorted(launched.items())
    bound = adapter_keyspaces(spec)
    assert set(bound) == {(0, "", ""), (0, "", "chat-lora"), (0, "", "sql-lora")}
    for name, path in launched.items():
        ns = bound[(0, "", name)]
        if engine == "vllm":
            assert (ns.hasher.lora.name, ns.hasher.lora.path) == (name, path)
        else:
            assert ns.hasher.extra_key == sglang_lora_id(name, path)
        assert ns.keys_for(b"\x01" * ns.digest_size) == bound[(0, "", "")].keys_for(b"\x01" * ns.digest_size)
        assert ns.block_hashes(list(range(64))) != bound[(0, "", "")].block_hashes(list(range(64)))


def test_pushed_adapter_without_path_reaches_the_agent_without_a_namespace(endpoints):
    release = _release("vllm", adapters=[])
    Release.objects.filter(pk=release.pk).update(adapters=[{"name": "old-lora", "path": None}])
    node = make_node()
    make_assignment(node, Release.objects.get(pk=release.pk))
    [raw] = render_content(node)["instances"]
    assert raw["kv_layout"]["adapters"] == [{"name": "old-lora", "path": ""}]
    assert set(adapter_keyspaces(InstanceSpec.model_validate(raw))) == {(0, "", "")}
