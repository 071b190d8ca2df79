"""``kvpool-agent run``: ``--node`` follows the registry's node-name rule (``agent.contract.names``, also behind
``tenants.validators.validate_dns_label``), and every argument error is one line ``<prog> run: error: …``,
exit status 2, without argparse's usage block."""
from __future__ import annotations

import sys

import pytest
from django.core.exceptions import ValidationError

from agent.contract.names import is_node_name
from agent.node import cli
from tenants.validators import validate_dns_label

NAMES = ["node-a", "n", "a" * 63, "Node_A.x", "node.a", "node_a", "Node-A", "-node", "node-", "a" * 64, "", "no spaces"]


@pytest.mark.parametrize("name", NAMES)
def test_the_agent_and_the_registry_accept_the_same_node_names(name):
    try:
        validate_dns_label(name)
        registry = True
    except ValidationError:
        registry = False
    assert is_node_name(name) is registry
    assert registry is (name in ("node-a", "n", "a" * 63))


def _run_error(monkeypatch, capsys, *args: str) -> str:
    monkeypatch.setattr(sys, "argv", ["kvpool-agent"])
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["run", *args])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "usage:" not in err, err
    assert err.startswith("kvpool-agent run: error: "), err
    return err


def test_a_name_the_registry_refuses_is_refused_before_any_set_up(monkeypatch, capsys):
    err = _run_error(monkeypatch, capsys, "--node", "Node_A.x", "--broker", "memory://")
    assert "--node 'Node_A.x' is not a valid node name" in err


@pytest.mark.parametrize("args, named", [
    (["--node", "node-a", "--broker", "amqp://host"], "--broker"),
    (["--node", "node-a", "--broker", "memory://", "--report-interval", "-5"], "--report-interval"),
    (["--node", "node-a"], "--broker"),
    (["--node", "node-a", "--broker", "memory://", "--bogus"], "--bogus"),
])
def test_argument_errors_are_one_line(monkeypatch, capsys, args, named):
    assert named in _run_error(monkeypatch, capsys, *args)
