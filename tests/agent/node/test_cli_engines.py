"""The agent's command-line flags for real engines: ``--instance-root``, ``--reconcile-interval``,
``--metrics-interval`` are checked before the agent connects anywhere (exit 2, one ``error:`` line)."""
from __future__ import annotations

import pytest

from agent.node.cli import build_parser
from tests.agent.node.test_cli import DEAD_BROKER, _agent, _refused


def test_defaults_and_parsing():
    args = build_parser().parse_args(["run", "--node", "n", "--broker", DEAD_BROKER])
    assert (args.instance_root, args.reconcile_interval, args.metrics_interval) == (None, 30.0, 5.0)
    args = build_parser().parse_args(["run", "--node", "n", "--broker", DEAD_BROKER, "--instance-root", "/x",
                                      "--reconcile-interval", "0.5", "--metrics-interval", "30"])
    assert (args.instance_root, args.reconcile_interval, args.metrics_interval) == ("/x", 0.5, 30.0)
    assert args.engine_unit_dir is None
    args = build_parser().parse_args(["run", "--node", "n", "--engine-unit-dir", "/etc/systemd/system"])
    assert (args.engine_unit_dir, args.broker) == ("/etc/systemd/system", None)


@pytest.mark.parametrize("option", ["--reconcile-interval", "--metrics-interval"])
@pytest.mark.parametrize("value", ["nan", "0", "-1"])
def test_engine_intervals_must_be_positive_and_finite(tmp_path, option, value):
    result = _agent("--node", "n", "--broker", DEAD_BROKER, f"{option}={value}", tmp_path=tmp_path)
    _refused(result, option)


def test_an_instance_root_that_is_a_file_is_refused(tmp_path):
    a_file = tmp_path / "plain"
    a_file.write_text("keep me\n")
    result = _agent("--node", "n", "--broker", DEAD_BROKER, "--state-dir", str(tmp_path / "state"),
                    "--instance-root", str(a_file), tmp_path=tmp_path)
    _refused(result, "--instance-root", "not a directory")
    assert a_file.read_text() == "keep me\n"
