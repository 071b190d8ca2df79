"""Paths the tests read: the repository root, the recorded engine data, the shared FAST'25 traces."""
from __future__ import annotations

from pathlib import Path

#: The repository root (what ``python -m agent`` / ``manage.py`` run from).
ROOT = Path(__file__).resolve().parents[2]
#: Recorded inputs kept with the tests (``tests/data/vllm``: captured vLLM 0.32.0 events).
DATA = ROOT / "tests" / "data"
#: The FAST'25 conversation trace, shared between checkouts (outside the repository).
CONVERSATION_TRACE = ROOT.parent / "shared" / "traces" / "conversation_trace.jsonl"
