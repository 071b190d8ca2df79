"""The node agent runs on GPU nodes without a database: no module of ``agent/`` may import Django.

Each check imports every module of the ``agent`` package (found with ``pkgutil``) in a fresh interpreter.
Third-party libraries may probe for Django on their own (kombu's JSON module tries
``django.utils.functional`` when Django happens to be installed); that is not the agent importing Django, so
the checks look at *who* imports it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.support.paths import ROOT

MINE = {"agent.datapath.hashing", "agent.contract.keys", "agent.contract.scope", "agent.datapath.keyspace",
        "agent.datapath.kv_cache", "agent.datapath.store", "agent.datapath.errors", "agent.datapath.connector",
        "agent.datapath.ledger", "agent.sim.master"}

# A meta-path finder that records which source file asked for a "django" module (first frame outside the
# import machinery) and, with BLOCK=1, makes Django unimportable as on a GPU node without it.
_SCRIPT = r"""
import importlib, json, os, pkgutil, sys
BLOCK = os.environ.get("BLOCK_DJANGO") == "1"
importers = []
class Watch:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] != "django":
            return None
        frame = sys._getframe(1)
        while frame is not None and ("importlib" in frame.f_code.co_filename
                                     or frame.f_code.co_filename.startswith("<")):
            frame = frame.f_back
        importers.append((name, frame.f_code.co_filename if frame else "?"))
        if BLOCK:
            raise ModuleNotFoundError(f"No module named {name!r} (blocked)", name=name)
        return None
sys.meta_path.insert(0, Watch())
mine = sorted(json.loads(os.environ["MINE"]))
for name in mine:
    importlib.import_module(name)
django_after_mine = sorted(m for m in sys.modules if m.split(".")[0] == "django")
import agent
names = sorted(m.name for m in pkgutil.walk_packages(agent.__path__, "agent."))
for name in names:
    importlib.import_module(name)
print(json.dumps({"modules": names, "django_after_mine": django_after_mine, "importers": importers,
                  "django": sorted(m for m in sys.modules if m.split(".")[0] == "django")}))
"""


def _run(block: bool) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    env.update(PYTHONPATH=str(ROOT), BLOCK_DJANGO="1" if block else "0", MINE=json.dumps(sorted(MINE)))
    proc = subprocess.run([sys.executable, "-c", _SCRIPT], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_every_agent_module_imports_without_django_installed() -> None:
    result = _run(block=True)
    assert set(result["modules"]) >= MINE, f"modules not found: {MINE - set(result['modules'])}"
    assert "django" not in result["django"] and result["django"] == []


def test_no_agent_source_file_imports_django() -> None:
    result = _run(block=False)
    assert result["django_after_mine"] == [], "the data-path modules pulled in Django"
    agent_dir = str(ROOT / "agent") + os.sep
    culprits = [(name, path) for name, path in result["importers"] if path.startswith(agent_dir)]
    assert culprits == [], f"agent modules import Django: {culprits}"
