"""``bench.faults``' verdicts: ``behaved`` (what the tests assert, whatever the machine's speed) apart from the timing
goals that ``passed`` adds; ``--patience`` scales every wait."""
from __future__ import annotations

import pytest

from bench import faults


def figures(**over):
    base = {"reports_lost": 0, "reports_duplicated": 0, "detect_s": 3.0, "recover_s": 10.0,
            "occupancy_settled_s": 5.0, "quotas_held_s": 1.0, "stored_s": 2.0}
    base.update(over)
    return base


def test_a_slow_but_complete_scenario_behaved_and_missed_its_goals():
    slow = figures(detect_s=40.0, recover_s=100.0, quotas_held_s=20.0)
    for name in ("master", "broker", "failover"):
        assert faults.behaved(name, slow) and not faults.in_time(name, slow)
    assert faults.in_time("agent", figures()) and faults.in_time("master", figures(recover_s=30.0))
    assert not faults.in_time("master", figures(recover_s=30.5))
    assert faults.in_time("broker", figures(recover_s=300.0))   # only the master's recovery has a goal


@pytest.mark.parametrize("name,over", [
    ("broker", {"reports_lost": 1}), ("broker", {"reports_duplicated": 2}), ("master", {"detect_s": None}),
    ("master", {"recover_s": None}), ("agent", {"occupancy_settled_s": None}),
    ("failover", {"quotas_held_s": None}), ("failover", {"stored_s": None})])
def test_a_loss_a_duplicate_or_a_missing_step_is_misbehaviour(name, over):
    assert not faults.behaved(name, figures(**over))


def test_patience_scales_every_wait(monkeypatch):
    clock = iter(range(0, 1000))
    monkeypatch.setattr(faults.time, "monotonic", lambda: float(next(clock)))
    monkeypatch.setattr(faults.time, "sleep", lambda s: None)
    calls = []
    assert faults.wait(lambda: calls.append(1), 5) is None
    plain = len(calls)
    monkeypatch.setattr(faults, "PATIENCE", 4.0)
    calls.clear()
    assert faults.wait(lambda: calls.append(1), 5) is None
    assert (plain, len(calls)) == (4, 19)              # one check per clock tick: ticks 1-4 of 5, 1-19 of 20
