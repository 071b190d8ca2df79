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


def test_budget_policy_and_orphan_collection_flags():
    from agent.datapath.budget import BUDGET_POLICIES, DEFAULT_BUDGET_POLICY

    run = build_parser()._subparsers._group_actions[0].choices["run"]
    choices = next(a.choices for a in run._actions if a.dest == "budget_policy")
    assert sorted(choices) == sorted(BUDGET_POLICIES)  # the flag offers exactly the policies the agent knows
    args = build_parser().parse_args(["run", "--node", "n", "--broker", DEAD_BROKER])
    assert (args.budget_policy, args.orphan_collection) == (DEFAULT_BUDGET_POLICY, "pressure")
    args = build_parser().parse_args(["run", "--node", "n", "--broker", DEAD_BROKER, "--budget-policy", "lru",
                                      "--keep-orphans"])
    assert (args.budget_policy, args.orphan_collection) == ("lru", "off")
    args = build_parser().parse_args(["run", "--node", "n", "--broker", DEAD_BROKER, "--orphan-collection", "eager"])
    assert args.orphan_collection == "eager"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["run", "--node", "n", "--broker", DEAD_BROKER, "--orphan-collection", "later"])


def test_the_flags_reach_the_node_maintenance(tmp_path):
    import gc

    from agent.datapath.eviction import LeafLRUPolicy
    from agent.datapath.ledger import Ledger
    from agent.node.cli import _engines

    args = build_parser().parse_args(["run", "--node", "n", "--broker", DEAD_BROKER, "--budget-policy", "lru",
                                      "--keep-orphans", "--instance-root", str(tmp_path / "instances")])
    thresholds = gc.get_threshold()
    try:
        engines = _engines(args, Ledger(), tmp_path, observe=True)
    finally:
        gc.set_threshold(*thresholds)  # _engines tunes the collector of the agent's process
    assert engines.budget.policy_factory is LeafLRUPolicy and engines.maintenance.orphan_collection == "off"


def test_an_unknown_budget_policy_is_refused(tmp_path):
    result = _agent("--node", "n", "--broker", DEAD_BROKER, "--budget-policy", "fifo", tmp_path=tmp_path)
    _refused(result, "--budget-policy")
