"""``pip install ".[agent]"`` gives a working node agent without Django (tests/agent/test_no_django.py checks the
source tree; this checks what a GPU node gets).

A fresh virtual environment (no ``--system-site-packages``: the project's .venv has Django) installs a copy of the
checkout, built as any node builds it (a wheel with build isolation, not an editable install), then:

* ``kvpool-agent run --help`` exits 0 and names itself ``kvpool-agent``;
* every module of the installed ``agent`` package imports, from outside the checkout, and Django is neither
  installed nor imported.

The install is constrained to the torch that requirements.txt pins (the version every other test runs with; on this
machine the CPU wheel in the local wheel folder of pip's configuration). Unconstrained, pip picks the newest torch
its indexes hold, here a CUDA build that pulls about 2.5 GB of NVIDIA libraries a CPU test never loads: their
unpacking took most of the test's time. Installing torch still dominates; a cold cache downloads the other
dependencies once.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.paths import ROOT

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

#: Not part of the source (local build products, caches, the project's own environments and run data).
_NOT_SOURCE = shutil.ignore_patterns(
    ".git", ".venv", "var", "build", "dist", "staticfiles", "test-artifacts", "__pycache__", "*.egg-info", "*.so",
    ".*_cache", "node_modules", "db.sqlite3",
)

_IMPORT_ALL = r"""
import importlib, importlib.metadata, importlib.util, json, pkgutil, sys
import agent
names = sorted(m.name for m in pkgutil.walk_packages(agent.__path__, "agent."))
for name in names:
    importlib.import_module(name)
print(json.dumps({
    "file": agent.__file__,
    "modules": names,
    "django_imported": sorted(m for m in sys.modules if m.split(".")[0] == "django"),
    "django_installed": importlib.util.find_spec("django") is not None,
    "native": importlib.util.find_spec("agent.datapath._chainhash") is not None,
    "torch": importlib.metadata.version("torch"),
}))
"""


def _env() -> dict[str, str]:
    """The environment without anything that would make the checkout (or .venv) importable."""
    drop = {"PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "DJANGO_SETTINGS_MODULE", "PYTHONSTARTUP"}
    return {k: v for k, v in os.environ.items() if k not in drop}


def _pinned(name: str) -> str:
    """``name==version`` as requirements.txt pins it (the pinned set ``make install`` uses).

    Raises:
        AssertionError: requirements.txt does not pin ``name`` with ``==``.
    """
    for line in (ROOT / "requirements.txt").read_text().splitlines():
        if re.fullmatch(rf"{re.escape(name)}==\S+", line.strip()):
            return line.strip()
    raise AssertionError(f"requirements.txt pins no {name}==")


def _run(cmd: list[str], *, cwd: Path, timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=cwd, env=_env(), capture_output=True, text=True, timeout=timeout)


def test_agent_extra_installs_a_working_agent_without_django(tmp_path: Path) -> None:
    source = tmp_path / "src"
    shutil.copytree(ROOT, source, ignore=_NOT_SOURCE)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    bin_dir = venv / "bin"

    constraints = tmp_path / "constraints.txt"
    constraints.write_text(_pinned("torch") + "\n")
    started = time.monotonic()
    # --no-compile: no bytecode for torch's 2,371 modules (45 MiB of source) and the other dependencies' up front;
    # what the checks below import compiles on import as usual. Otherwise the install a node runs
    install = _run([str(bin_dir / "pip"), "install", "--disable-pip-version-check", "--no-compile",
                    "--constraint", str(constraints), f"{source}[agent]"], cwd=tmp_path, timeout=780)
    elapsed = time.monotonic() - started
    print(f"pip install .[agent] into a fresh venv: {elapsed:.0f} s")
    assert install.returncode == 0, (install.stdout + install.stderr)[-4000:]

    help_run = _run([str(bin_dir / "kvpool-agent"), "run", "--help"], cwd=tmp_path, timeout=120)
    assert help_run.returncode == 0, help_run.stderr[-3000:]
    assert help_run.stdout.startswith("usage: kvpool-agent run"), help_run.stdout[:500]
    assert "--node" in help_run.stdout and "--broker" in help_run.stdout

    bad = _run([str(bin_dir / "kvpool-agent"), "run", "--node", "n", "--broker", "nope"], cwd=tmp_path, timeout=120)
    assert bad.returncode == 2 and "kvpool-agent run: error:" in bad.stderr, bad.stderr[-3000:]

    probe = _run([str(bin_dir / "python"), "-c", _IMPORT_ALL], cwd=tmp_path, timeout=300)
    assert probe.returncode == 0, probe.stderr[-4000:]
    result = json.loads(probe.stdout.strip().splitlines()[-1])
    assert Path(result["file"]).resolve().is_relative_to(venv.resolve()), result["file"]
    expected = {"agent.contract.messages", "agent.contract.signing", "agent.contract.keys", "agent.node.cli",
                "agent.datapath.connector", "agent.datapath.store", "agent.sim.workload"}
    assert expected <= set(result["modules"]), sorted(expected - set(result["modules"]))
    assert result["torch"].split("+")[0] == _pinned("torch").split("==")[1], result["torch"]  # the constraint held
    assert result["django_installed"] is False
    assert result["django_imported"] == []
