"""Fixtures every test directory may use: the Mooncake master and Store clients (tests/support/mooncake.py).

Every other fixture lives in tests/support/ and is imported by name by the conftest.py of the directories that use
it, so one name means one thing and autouse fixtures stay in their directories.
"""
from tests.support.mooncake import mooncake_master, mooncake_master_factory, store_client_factory, unique_name
