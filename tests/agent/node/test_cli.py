"""``python -m agent run`` refuses bad arguments before it connects anywhere: exit 2, one ``error:`` line.

Each case runs the real command line as a subprocess with a broker that does not answer (port 1), so a
command that got past the checks would hang or retry; the timeout turns that into a failure.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.paths import ROOT

DEAD_BROKER = "redis://127.0.0.1:1/0"


def _agent(*args: str, tmp_path: Path, extra_env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KVPOOL_", "PYTEST"))}
    env.update({"PYTHONPATH": str(ROOT), "KVPOOL_NODE_SECRET": "s3cret", "XDG_STATE_HOME": str(tmp_path / "xdg")})
    env.update(extra_env or {})
    return subprocess.run([sys.executable, "-m", "agent", "run", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=60)


def _refused(result: subprocess.CompletedProcess, *fragments: str) -> None:
    assert result.returncode == 2, (result.returncode, result.stderr)
    assert "Traceback" not in result.stderr, result.stderr
    assert "error:" in result.stderr
    for fragment in fragments:
        assert fragment in result.stderr, result.stderr


def test_unknown_log_level_is_refused(tmp_path):
    result = _agent("--node", "n", "--broker", DEAD_BROKER, "--loglevel", "FOO", tmp_path=tmp_path)
    _refused(result, "--loglevel", "'FOO'", "INFO")


@pytest.mark.parametrize("url, fragment", [
    ("foo://x", "not a supported broker URL"),
    ("notaurl", "not a supported broker URL"),
    ("amqp://guest@127.0.0.1//", "not a supported broker URL"),
    ("redis://", "names no host"),
    ("redis://127.0.0.1:99999/0", "not a valid URL"),
    ("redis://127.0.0.1:6379/abc", "database 'abc' is not a number"),
    ("redis://127.0.0.1:6379/-1", "database '-1' is not a number"),
])
def test_broker_must_be_a_redis_url_with_a_host(tmp_path, url, fragment):
    result = _agent("--node", "n", "--broker", url, tmp_path=tmp_path)
    _refused(result, "--broker", fragment)


def test_the_broker_may_come_from_the_environment(tmp_path):
    """``$KVPOOL_BROKER_URL`` (the service unit's environment file) instead of ``--broker``, whose value every local
    user could read in the command line: accepted, so the next check (the state directory) is the one that fails."""
    a_file = tmp_path / "plain"
    a_file.write_text("")
    result = _agent("--node", "n", "--state-dir", str(a_file), tmp_path=tmp_path,
                    extra_env={"KVPOOL_BROKER_URL": DEAD_BROKER})
    _refused(result, "--state-dir", "not a directory")


@pytest.mark.parametrize("env, fragment", [
    ({}, "no broker: pass --broker URL or set KVPOOL_BROKER_URL"),
    ({"KVPOOL_BROKER_URL": "foo://x"}, "KVPOOL_BROKER_URL: 'foo://x' is not a supported broker URL"),
])
def test_no_broker_or_a_bad_one_in_the_environment_is_refused(tmp_path, env, fragment):
    _refused(_agent("--node", "n", tmp_path=tmp_path, extra_env=env), fragment)


@pytest.mark.parametrize("option", ["--heartbeat-interval", "--report-interval"])
@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "NaN"])
def test_intervals_must_be_finite(tmp_path, option, value):
    result = _agent("--node", "n", "--broker", DEAD_BROKER, f"{option}={value}", tmp_path=tmp_path)
    _refused(result, option, "finite")


def test_state_dir_that_is_a_file_is_refused(tmp_path):
    a_file = tmp_path / "passwd"
    a_file.write_text("root:x:0:0\n")
    result = _agent("--node", "n", "--broker", DEAD_BROKER, "--state-dir", str(a_file), tmp_path=tmp_path)
    _refused(result, "--state-dir", "not a directory")
    assert a_file.read_text() == "root:x:0:0\n"


def test_state_dir_that_cannot_be_created_is_refused(tmp_path):
    a_file = tmp_path / "plain"
    a_file.write_text("")
    result = _agent("--node", "n", "--broker", DEAD_BROKER, "--state-dir", str(a_file / "below"),
                    tmp_path=tmp_path)
    _refused(result, "--state-dir", "cannot create")


@pytest.mark.skipif(not Path("/proc/1").is_dir(), reason="needs Linux /proc")
def test_state_dir_under_proc_is_refused(tmp_path):
    result = _agent("--node", "n", "--broker", DEAD_BROKER, "--state-dir", "/proc/1/nope", tmp_path=tmp_path)
    _refused(result, "--state-dir", "/proc/1/nope")


def test_broker_url_check_accepts_redis_and_memory_urls():
    from agent.node.cli_args import broker_url

    for url in ("redis://127.0.0.1:6379/0", "rediss://:pw@cache.example:6380/2", "REDIS://h", "memory://",
                "redis://h:6379/", "redis://h:6379/15"):
        assert broker_url(url) == url


def test_the_worker_exit_status_reaches_the_caller(monkeypatch):
    """Celery's worker_main drops the status of a worker that died (e.g. a transport error); run_worker keeps it."""
    from agent.node.celery_app import make_app, run_worker

    app = make_app("n", "memory://")
    seen = []
    monkeypatch.setattr(app, "start", lambda argv: seen.append(argv) or 1)
    assert run_worker(app, "n") == 1
    assert seen[0][0] == "worker" and "--queues=agent.n" in seen[0]
    monkeypatch.setattr(app, "start", lambda argv: None)
    assert run_worker(app, "n") == 0


@pytest.mark.parametrize("argv0, prog", [
    ("/opt/kvpool-agent/bin/kvpool-agent", "kvpool-agent"),  # the console script of `pip install ".[agent]"`
    (str(ROOT / "agent" / "__main__.py"), "python -m agent"),
    (str(ROOT / "agent" / "node" / "cli.py"), "python -m agent"),
    ("-c", "python -m agent"),
    ("", "python -m agent"),
])
def test_usage_and_errors_name_the_command_that_was_run(monkeypatch, capsys, argv0, prog):
    from agent.node import cli

    monkeypatch.setattr(sys, "argv", [argv0])
    assert cli.prog_name() == prog
    assert cli.build_parser().format_usage().startswith(f"usage: {prog} ")
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["run", "--node", "no spaces", "--broker", "memory://"])  # refused before any set-up
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.startswith(f"{prog} run: error: --node 'no spaces' is not a valid node name")
