"""Fixtures of the agent tests."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest


def native_expected() -> bool:
    """Whether agent.datapath._chainhash should be built here: a C compiler and OpenSSL's headers are present."""
    return shutil.which("cc") is not None and Path("/usr/include/openssl/evp.h").exists()


@pytest.fixture(params=["native", "python"])
def hash_impl(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Runs a test once with the compiled hash chain (agent.datapath._chainhash) and once with the pure-Python paths.

    Hashers pick their path when constructed, so tests must build them inside the test. "native" fails when
    the module is missing on a machine that can build it (scripts/build_native.py, run by make install).
    """
    import agent.datapath.hashing
    import agent.datapath.keyspace

    if request.param == "python":
        monkeypatch.setattr(agent.datapath.hashing, "_chainhash", None)
        monkeypatch.setattr(agent.datapath.keyspace, "_native_hex_keys", None)
    elif agent.datapath.hashing._chainhash is None:
        if native_expected():
            pytest.fail("agent.datapath._chainhash is not built although cc and OpenSSL headers exist: "
                        "run .venv/bin/python scripts/build_native.py")
        pytest.skip("agent.datapath._chainhash cannot be built here (no C compiler or OpenSSL headers)")
    return request.param
