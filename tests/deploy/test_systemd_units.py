"""The service units of ``deploy/systemd/`` against systemd's own checkers (Debian's systemd 252 here).

No systemd runs on the test machine, so nothing is started. ``systemd-analyze verify --root=ROOT`` loads each unit
the way the manager would, from a throwaway root holding the units, the system's own units (targets), and what an
install puts where the units expect it: the console scripts (checked against the project's environment and
``pyproject.toml``), the master's ``launch.sh`` as ``manage.py render_config --master --out`` writes it, and an
engine instance's directory and drop-in as the agent writes them (``agent.node.instance_dirs``,
``agent.node.unit_dropins``). Any line it prints (an unknown key, a value it cannot parse, a missing executable) fails
the test. ``systemd-analyze security --offline`` then rates each unit's hardening, and the engine template's
settings that make a stop end its whole process tree, and that keep it from ever running as root, are checked
against what the agent really writes.
"""
from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.node.accounts import Account
from agent.node.cli import build_parser
from agent.node.instance_dirs import ENV_FILE, LAUNCH_SH, write_instance_dirs
from agent.node.unit_dropins import DROPIN_NAME, dropin_path, write_account_dropins
from tests.support.paths import ROOT

UNITS = ROOT / "deploy" / "systemd"
#: Where the system's own units are (targets the units are ordered after); Debian's /lib is /usr/lib.
SYSTEM_UNITS = Path("/usr/lib/systemd/system")
#: The control plane's and the node agent's virtual environments (README "Run it with systemd").
CONTROL_VENV, AGENT_VENV = "/opt/kvpool/bin/", "/opt/kvpool-agent/bin/"
#: The engine instance the template is loaded as.
INSTANCE = "7"
ENGINE_ACCOUNT = Account(name="kvpool-t3", uid=4003, gid=4003)
#: Overall exposure ``systemd-analyze security`` may give each unit (0 best, 10 worst; measured 1.5 to 3.6).
EXPOSURE_LIMIT = {"kvpool-agent.service": 4.0, "kvpool-engine@.service": 3.0}
DEFAULT_EXPOSURE_LIMIT = 2.0


def _analyze() -> str:
    tool = shutil.which("systemd-analyze")
    if tool is None:
        pytest.fail("systemd-analyze is missing: install Debian's systemd (scripts/bootstrap.sh does when root)")
    return tool


def unit_files() -> list[Path]:
    return sorted(UNITS.glob("*.service"))


def parse_unit(text: str) -> dict[str, dict[str, list[str]]]:
    """``{section: {key: [values in order]}}`` of a unit file (comments and blank lines skipped; these units use
    no line continuations)."""
    sections: dict[str, dict[str, list[str]]] = {}
    current: dict[str, list[str]] | None = None
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], {})
            continue
        assert current is not None and "=" in line and not line.endswith("\\"), raw
        key, value = line.split("=", 1)
        current.setdefault(key.strip(), []).append(value.strip())
    return sections


def unit(name: str) -> dict[str, dict[str, list[str]]]:
    return parse_unit((UNITS / name).read_text())


def one(settings: dict[str, list[str]], key: str) -> str:
    values = settings.get(key, [])
    assert len(values) == 1, (key, values)
    return values[0]


def exec_binaries(path: Path) -> list[str]:
    """The programs of every ``Exec*=`` line of a unit (``%i`` as ``INSTANCE``)."""
    service = parse_unit(path.read_text()).get("Service", {})
    return [shlex.split(value.replace("%i", INSTANCE))[0].lstrip("-@:+!")
            for key, values in service.items() if key.startswith("Exec") for value in values]


def agent_args():
    """The agent unit's command line, parsed by the agent's own parser."""
    argv = shlex.split(one(unit("kvpool-agent.service")["Service"], "ExecStart").replace("${KVPOOL_NODE}", "node-a"))
    assert argv[0] == AGENT_VENV + "kvpool-agent"
    return build_parser().parse_args(argv[1:])


def instance_root() -> Path:
    args = agent_args()
    return Path(args.instance_root) if args.instance_root else Path(args.state_dir) / "instances"


def _stub(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\nexit 0\n")
    path.chmod(0o755)


@pytest.fixture
def system_root(tmp_path: Path, db) -> Iterator[Path]:
    """A root for ``--root``: the system's units, the kvpool units, and what an install puts where they point."""
    from django.core.management import call_command

    root = tmp_path / "root"
    if not SYSTEM_UNITS.is_dir():
        pytest.fail(f"{SYSTEM_UNITS} is missing: install Debian's systemd")
    shutil.copytree(SYSTEM_UNITS, root / SYSTEM_UNITS.relative_to("/"), symlinks=True)
    unit_dir = root / "etc" / "systemd" / "system"
    unit_dir.mkdir(parents=True)
    for path in unit_files():
        shutil.copy(path, unit_dir / path.name)
    scripts = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"])
    for path in unit_files():
        for binary in exec_binaries(path):
            if binary.startswith(CONTROL_VENV):  # a console script of the control plane's requirements
                name = binary[len(CONTROL_VENV):]
                assert (ROOT / ".venv" / "bin" / name).is_file(), f"{path.name}: no {name} in the environment"
                _stub(root / binary.lstrip("/"))
            elif binary.startswith(AGENT_VENV):  # the agent's own console script
                assert binary[len(AGENT_VENV):] in scripts, f"{path.name}: {binary} is no script of pyproject.toml"
                _stub(root / binary.lstrip("/"))
            elif binary.startswith(("/bin/", "/usr/bin/")):
                assert shutil.which(Path(binary).name), binary
                _stub(root / binary.lstrip("/"))
    # The master's launch.sh and quota file, as the registry renders them.
    call_command("render_config", "--master", "--out", str(root / "var" / "lib" / "kvpool-master"))
    # An engine instance's directory and its account drop-in, as the agent writes them.
    write_instance_dirs(root / instance_root().relative_to("/"), [{
        "instance_id": INSTANCE, "argv": ["python", "-m", "vllm.entrypoints.openai.api_server"], "env": {}}])
    args = agent_args()
    write_account_dropins(root / Path(args.engine_unit_dir).relative_to("/"), {INSTANCE: ENGINE_ACCOUNT})
    yield root


def loaded_name(path: Path) -> str:
    """The name a unit is loaded as (a template as instance ``INSTANCE``)."""
    return path.name.replace("@.", f"@{INSTANCE}.")


def verify(root: Path, name: str) -> subprocess.CompletedProcess:
    return subprocess.run([_analyze(), "verify", f"--root={root}", name], capture_output=True, text=True,
                          timeout=60, cwd=root)


@pytest.mark.parametrize("path", unit_files(), ids=lambda p: p.name)
def test_systemd_analyze_verify_passes_without_a_word(system_root, path):
    result = verify(system_root, loaded_name(path))
    assert (result.returncode, result.stdout + result.stderr) == (0, "")


def test_the_verifier_speaks_up_for_what_the_units_could_get_wrong(system_root):
    """Otherwise the test above could not fail: a mistyped key, a value systemd cannot parse and a program that is
    not where the unit says each print a line."""
    unit_dir = system_root / "etc" / "systemd" / "system"
    text = (UNITS / "kvpool-engine@.service").read_text()
    cases = {
        "KillMod=control-group": "Unknown key",
        "KillMode=control-grou": "Failed to parse kill mode",
        "ExecStartPre=/opt/kvpool-agent/bin/nope": "is not executable",
    }
    for line, complaint in cases.items():
        (unit_dir / "kvpool-engine@.service").write_text(text.replace("[Service]\n", f"[Service]\n{line}\n", 1))
        result = verify(system_root, f"kvpool-engine@{INSTANCE}.service")
        assert complaint in result.stdout + result.stderr, (line, result.stdout, result.stderr)


def security(root: Path, name: str) -> list[dict]:
    result = subprocess.run([_analyze(), "security", "--offline=yes", f"--root={root}", "--json=short", name],
                            capture_output=True, text=True, timeout=60, cwd=root)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def exposure(root: Path, name: str) -> float:
    result = subprocess.run([_analyze(), "security", "--offline=yes", f"--root={root}", name],
                            capture_output=True, text=True, timeout=60, cwd=root)
    assert result.returncode == 0, result.stderr
    last = [line for line in result.stdout.splitlines() if "Overall exposure level" in line][-1]
    return float(last.split(":")[-1].split()[0])


@pytest.mark.parametrize("path", unit_files(), ids=lambda p: p.name)
def test_every_unit_is_hardened(system_root, path):
    """No new privileges, a private /tmp, a read-only system, no home directories: and an overall exposure (0 to
    10) of at most ``EXPOSURE_LIMIT``."""
    results = {item["name"]: item for item in security(system_root, loaded_name(path))}
    for setting in ("NoNewPrivileges=", "PrivateTmp=", "ProtectSystem=", "ProtectHome=", "ProtectKernelModules=",
                    "ProtectControlGroups=", "RestrictSUIDSGID=", "SystemCallArchitectures="):
        assert results[setting]["set"], (setting, results[setting]["description"])
    assert exposure(system_root, loaded_name(path)) <= EXPOSURE_LIMIT.get(path.name, DEFAULT_EXPOSURE_LIMIT)


def test_only_the_node_agent_runs_as_root(system_root):
    for path in unit_files():
        user = {item["name"]: item for item in security(system_root, loaded_name(path))}["User=/DynamicUser="]
        assert user["set"] == (path.name != "kvpool-agent.service"), (path.name, user["description"])


def test_the_engine_template_stops_the_whole_process_tree():
    """What makes a stop (and the death of the API server, however it dies) end the EngineCore and workers too: one
    cgroup per instance, every process in it signalled, SIGKILL after a bounded time, no way out of it."""
    service = unit("kvpool-engine@.service")["Service"]
    assert one(service, "KillMode") == "control-group"
    assert one(service, "KillSignal") == "SIGTERM"
    assert service.get("SendSIGKILL", ["yes"]) == ["yes"]
    assert 0 < int(one(service, "TimeoutStopSec")) <= 60
    assert one(service, "Delegate") == "no" and one(service, "OOMPolicy") == "stop"
    assert one(service, "Type") == "exec"  # launch.sh execs the engine: the main process is the API server
    assert launch_exec_line().startswith("exec ")
    for key in ("ExecStop", "ExecStopPost", "RemainAfterExit", "GuessMainPID", "PIDFile"):
        assert key not in service, key


def launch_exec_line() -> str:
    """The last line of a ``launch.sh`` the agent writes (the ``exec`` of the engine)."""
    import tempfile

    with tempfile.TemporaryDirectory() as directory:
        (path,) = write_instance_dirs(Path(directory), [{"instance_id": INSTANCE, "argv": ["python", "-V"]}])
        return (path / LAUNCH_SH).read_text().splitlines()[-1]


def test_the_engine_template_runs_what_the_agent_writes_as_the_account_it_names():
    """ExecStart, EnvironmentFile, the working and writable directory are the instance directory under the agent
    unit's instance root; the account comes from the drop-in the agent unit's ``--engine-unit-dir`` receives, and
    without that drop-in the instance does not start (and would not be root if it did)."""
    service = unit("kvpool-engine@.service")["Service"]
    directory = instance_root() / "%i"
    assert one(service, "ExecStart") == str(directory / LAUNCH_SH)
    assert str(directory / ENV_FILE) in service["EnvironmentFile"]
    assert service["EnvironmentFile"][-1] == str(directory / ENV_FILE)  # the instance's own values win
    assert one(service, "WorkingDirectory") == one(service, "ReadWritePaths") == str(directory)
    engine_unit_dir = agent_args().engine_unit_dir
    assert engine_unit_dir in unit("kvpool-agent.service")["Service"]["ReadWritePaths"]
    written = str(dropin_path(engine_unit_dir, INSTANCE))
    assert written == f"{engine_unit_dir}/kvpool-engine@{INSTANCE}.service.d/{DROPIN_NAME}"
    assert one(unit("kvpool-engine@.service")["Unit"], "AssertPathExists") == written.replace(f"@{INSTANCE}.", "@%i.")
    assert one(service, "User") not in ("root", "0", "") and one(service, "Group") not in ("root", "0", "")
    assert "DynamicUser" not in service  # the directory belongs to a fixed account


def test_the_agent_unit_keeps_its_state_where_the_engines_look():
    service = unit("kvpool-agent.service")["Service"]
    args = agent_args()
    assert one(service, "StateDirectory") == Path(args.state_dir).relative_to("/var/lib").as_posix()
    assert one(service, "StateDirectoryMode") == "0711"  # the instance root is inside: engines traverse it
    assert args.broker is None  # from KVPOOL_BROKER_URL in the environment file, not the command line
    assert set(one(service, "CapabilityBoundingSet").split()) == {"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FOWNER",
                                                                   "CAP_SYS_PTRACE"}
    assert one(service, "KillMode") == "control-group"  # its mooncake_client goes with it


@pytest.mark.parametrize("name", ["kvpool-dashboard.service", "kvpool-worker.service", "kvpool-beat.service"])
def test_the_dashboards_processes_migrate_first_and_run_as_it_does_today(name):
    """``gunicorn dashboard.wsgi``, ``celery -A dashboard.celery worker -Q dashboard.ingest,dashboard.control`` and
    ``celery -A dashboard.celery beat`` (README "Pointing it at a real cluster", dashboard/celery.py)."""
    sections = unit(name)
    argv = shlex.split(one(sections["Service"], "ExecStart"))
    expected = {"kvpool-dashboard.service": ["gunicorn", "dashboard.wsgi"],
                "kvpool-worker.service": ["celery", "-A", "dashboard.celery", "worker", "-Q",
                                          "dashboard.ingest,dashboard.control"],
                "kvpool-beat.service": ["celery", "-A", "dashboard.celery", "beat"]}[name]
    assert [Path(argv[0]).name, *argv[1:len(expected)]] == expected
    assert one(sections["Unit"], "Requires") == "kvpool-migrate.service"
    assert "kvpool-migrate.service" in one(sections["Unit"], "After").split()
    assert "DJANGO_SETTINGS_MODULE=dashboard.settings" in sections["Service"]["Environment"][0].split()


@pytest.mark.integration
def test_the_master_unit_runs_the_registrys_launch_script(db, settings, tmp_path):
    """What kvpool-master.service does, without systemd: ``render_config --master --out`` into the state directory,
    then its ``launch.sh`` with the unit's working directory and PATH (the control plane's environment): a real
    mooncake_master serves the registry's tenant quotas, and stops on the unit's SIGTERM."""
    import signal
    import urllib.request

    from django.core.management import call_command

    from agent.sim.master import free_ports
    from tests.support.factories import make_tenant
    from tests.support.waiting import wait_for

    service = unit("kvpool-master.service")["Service"]
    rpc, meta, admin = free_ports(3)
    settings.KVPOOL_MASTER_ADDRESS = f"127.0.0.1:{rpc}"
    settings.KVPOOL_METADATA_SERVER = f"http://127.0.0.1:{meta}/metadata"
    settings.KVPOOL_MASTER_ADMIN_URL = f"http://127.0.0.1:{admin}"
    make_tenant("acme", quota="64MB")
    state = tmp_path / Path(one(service, "StateDirectory"))
    call_command("render_config", "--master", "--out", str(state))
    script = Path(one(service, "ExecStart").replace(f"/var/lib/{one(service, 'StateDirectory')}", str(state)))
    path = one(service, "Environment").removeprefix("PATH=").replace(CONTROL_VENV.rstrip("/"), str(ROOT / ".venv/bin"))
    proc = subprocess.Popen([str(script)], cwd=state, env={"PATH": path}, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        def quotas():
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{admin}/api/v1/tenant_quotas", timeout=2) as resp:
                    return json.loads(resp.read())
            except OSError:
                assert proc.poll() is None, f"the master exited with status {proc.returncode}"
                return None

        body = wait_for(quotas, timeout=60, what="the master's admin API")
        assert "acme" in json.dumps(body) and str(64 << 20) in json.dumps(body), body
        proc.send_signal(signal.SIGTERM)  # KillMode=control-group: SIGTERM to the (exec'd) master
        proc.wait(timeout=int(one(service, "TimeoutStopSec")))
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
