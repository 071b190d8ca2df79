"""Throwaway system accounts for tests of file modes and socket ownership (they need root, as CI runs).

``local_account`` is a fixture factory: each call creates ``kvpool-test-<random>`` with ``useradd --system
--no-create-home`` and removes it after the test (an agent given them needs ``THROWAWAY_ACCOUNT_RULES``);
``run_as(account, argv)`` runs a command as that account (``setpriv``: its uid, its group, no supplementary groups).
Tests that need them skip when not root, saying why.
"""
from __future__ import annotations

import os
import pwd
import secrets
import shutil
import subprocess
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest

from agent.node.accounts import Account, EngineAccountRules

#: The engine-account rules of an agent in tests that give instances to throwaway accounts: these are system
#: accounts (uid below login.defs' UID_MIN), which a real agent refuses (``agent.node.accounts.EngineAccountRules``).
THROWAWAY_ACCOUNT_RULES = EngineAccountRules(min_uid=1, max_uid=60000)

#: Why tests of other accounts skip when not root.
NOT_ROOT = "needs root: creates throwaway system accounts (useradd) and runs processes as them (setpriv)"


def require_root() -> None:
    """Skip the calling test unless it runs as root with ``useradd`` and ``setpriv`` (CI runs as root)."""
    if os.geteuid() != 0:
        pytest.skip(NOT_ROOT)
    for tool in ("useradd", "userdel", "setpriv"):
        if shutil.which(tool) is None:
            pytest.skip(f"needs {tool}")


@pytest.fixture
def local_account() -> Iterator[Callable[[], Account]]:
    """``make() -> Account``: a fresh throwaway system account per call, removed after the test."""
    require_root()
    made: list[str] = []

    def make() -> Account:
        name = f"kvpool-test-{secrets.token_hex(4)}"
        subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name],
                       check=True, capture_output=True)
        made.append(name)
        entry = pwd.getpwnam(name)
        return Account(name=name, uid=entry.pw_uid, gid=entry.pw_gid)

    try:
        yield make
    finally:
        for name in made:
            subprocess.run(["userdel", name], check=False, capture_output=True)


@pytest.fixture
def shared_tmp() -> Iterator[Any]:
    """A fresh directory under the system temp dir that other accounts may traverse (0711; pytest's own tmp_path
    lies below a 0700 directory of root's), removed after the test."""
    import tempfile
    from pathlib import Path

    path = Path(tempfile.mkdtemp(prefix="kvpool-test-"))
    os.chmod(path, 0o711)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def run_as(account: Account, argv: Sequence[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` as ``account`` (uid, gid, no supplementary groups); captured text output, no check."""
    cmd = ["setpriv", f"--reuid={account.uid}", f"--regid={account.gid}", "--clear-groups", "--", *argv]
    kwargs.setdefault("capture_output", True)
    kwargs.setdefault("text", True)
    return subprocess.run(cmd, check=False, **kwargs)


def python_for(account: Account) -> tuple[list[str], dict[str, str]]:
    """``(argv prefix, extra env)`` that runs a Python with ``zmq`` as ``account``: this interpreter when the account
    can run it, else the system ``python3`` of the same version with this environment's ``site-packages`` on its
    path (this interpreter may live below root's 0700 home). Skips the test when neither works."""
    import sys
    from pathlib import Path

    import zmq

    probe = ["-c", "import zmq, msgpack"]
    if run_as(account, [sys.executable, *probe], cwd="/").returncode == 0:
        return [sys.executable], {}
    site = str(Path(zmq.__file__).resolve().parents[1])
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    for candidate in (f"/usr/bin/{version}", f"/usr/local/bin/{version}"):
        if os.path.exists(candidate):
            env = {**os.environ, "PYTHONPATH": site}
            if run_as(account, [candidate, *probe], cwd="/", env=env).returncode == 0:
                return [candidate], {"PYTHONPATH": site}
    pytest.skip(f"no Python with zmq that account {account.name} may run")
