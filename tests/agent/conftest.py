"""Fixtures of the agent tests (tests/support/agent.py, tests/support/accounts.py)."""
from tests.support.accounts import local_account, shared_tmp
from tests.support.agent import hash_impl
