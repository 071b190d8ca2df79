"""Fixtures of the agent tests (tests/support/agent.py)."""
from tests.support.agent import hash_impl
