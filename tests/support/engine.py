"""The real vLLM engine environment for tests: installed on first use, skipped only when the install fails."""
from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def engine_python() -> Path:
    """The engine environment's interpreter (``scripts/engine_env.sh`` runs on first use: about a minute and
    3.6 GB) with the tiny model built. Skips, with the script's output as the reason, only when the install fails."""
    from demo.engine import EngineError, ensure_engine_env, ensure_tiny_model

    try:
        python = ensure_engine_env(echo=lambda line: print(line, flush=True))
    except EngineError as exc:
        pytest.skip(f"the vLLM engine environment could not be installed: {exc}")
    ensure_tiny_model(python=python)
    return python
