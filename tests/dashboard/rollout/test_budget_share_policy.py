"""The demand-weighted share policy (``dashboard.rollout.budget_shares.plan_shares``): a pure function of each
node's writers, occupancy, trims and current share (issue 18 item 6: cross-node budgets without waste)."""
from __future__ import annotations

import pytest

from dashboard.rollout.budget_shares import FLOOR_FRACTION, NodeDemand, plan_shares

BUDGET = 1_000_000


def test_nobody_reporting_keeps_the_writer_split() -> None:
    shares = plan_shares(BUDGET, {"a": NodeDemand(writers=2), "b": NodeDemand(writers=1), "c": NodeDemand(writers=0)})
    assert shares == {"a": 666_666, "b": 333_333, "c": 0}


def test_a_node_trimmed_at_its_share_gets_what_the_other_does_not_use() -> None:
    shares = plan_shares(BUDGET, {
        "a": NodeDemand(writers=1, used_bytes=450_000, silent=False, trimmed=True, current=500_000),
        "b": NodeDemand(writers=1, used_bytes=100_000, silent=False, current=500_000)})
    assert sum(shares.values()) == BUDGET
    assert shares["b"] == 115_000            # what it holds plus 15 % headroom: it gives the rest back
    assert shares["a"] == BUDGET - 115_000


def test_two_pressed_nodes_split_in_proportion_to_what_they_hold_and_shares_always_sum_to_the_budget() -> None:
    # a new budget below what both hold (the engine demo: node-a wrote most of the release)
    shares = plan_shares(173, {"a": NodeDemand(writers=1, used_bytes=250, silent=False, current=10_000),
                               "b": NodeDemand(writers=1, used_bytes=96, silent=False, current=10_000)})
    assert sum(shares.values()) == 173 and shares["a"] == 125 and shares["b"] == 48
    for used in (0, 1, 7, 99, 500, 10**9):
        for trimmed in (False, True):
            shares = plan_shares(997, {"a": NodeDemand(writers=3, used_bytes=used, silent=False, trimmed=trimmed),
                                       "b": NodeDemand(writers=1, used_bytes=500, silent=False, current=100),
                                       "c": NodeDemand(writers=1, used_bytes=None)})
            assert sum(shares.values()) == 997, (used, trimmed, shares)


def test_every_node_keeps_its_floor() -> None:
    shares = plan_shares(BUDGET, {
        "a": NodeDemand(writers=1, used_bytes=10**9, silent=False, trimmed=True, current=500_000),
        "b": NodeDemand(writers=1, used_bytes=0, silent=False, current=500_000)})
    floor = int(BUDGET // 2 * FLOOR_FRACTION)
    assert shares["b"] == floor and shares["a"] == BUDGET - floor


def test_hysteresis_keeps_the_current_shares_until_one_moves_by_more_than_ten_percent() -> None:
    current = {"a": 600_000, "b": 400_000}

    def plan(used_b: int) -> dict[str, int]:
        return plan_shares(BUDGET, {
            "a": NodeDemand(writers=1, used_bytes=560_000, silent=False, trimmed=True, current=current["a"]),
            "b": NodeDemand(writers=1, used_bytes=used_b, silent=False, current=current["b"])})

    assert plan(330_000) == current          # b would get 379,500: 5 % less, not worth a new document
    moved = plan(200_000)                    # b would get 230,000: 42 % less
    assert moved == {"a": 770_000, "b": 230_000}
    # the current shares no longer fit a lowered budget: always re-planned
    assert sum(plan_shares(800_000, {
        "a": NodeDemand(writers=1, used_bytes=560_000, silent=False, trimmed=True, current=current["a"]),
        "b": NodeDemand(writers=1, used_bytes=300_000, silent=False, current=current["b"])}).values()) == 800_000


def test_a_silent_node_keeps_what_it_held_and_lends_only_its_unused_share() -> None:
    trimmed = NodeDemand(writers=1, used_bytes=450_000, silent=False, trimmed=True, current=500_000)
    shares = plan_shares(BUDGET, {"a": trimmed,
                                  "b": NodeDemand(writers=1, used_bytes=300_000, silent=True, current=500_000)})
    assert shares == {"a": 700_000, "b": 300_000}      # its blocks are still in the Store: still counted
    # a silent node never heard from keeps its floor
    shares = plan_shares(BUDGET, {"a": trimmed, "b": NodeDemand(writers=1, current=500_000)})
    assert shares["b"] == int(BUDGET // 2 * FLOOR_FRACTION) and sum(shares.values()) == BUDGET
    # and never more than its current share, even when it last reported more
    shares = plan_shares(BUDGET, {"a": trimmed,
                                  "b": NodeDemand(writers=1, used_bytes=900_000, silent=True, current=500_000)})
    assert shares["b"] <= 500_000 and sum(shares.values()) == BUDGET


def test_a_node_that_stops_writing_gives_back_what_it_does_not_hold() -> None:
    current = {"a": 500_000, "b": 500_000}
    # b wrote, was trimmed at its share, then stopped: its trims stop; it keeps what it holds plus headroom only
    # once it is under PRESSED of its share
    busy = plan_shares(BUDGET, {
        "a": NodeDemand(writers=1, used_bytes=460_000, silent=False, trimmed=True, current=current["a"]),
        "b": NodeDemand(writers=1, used_bytes=460_000, silent=False, trimmed=True, current=current["b"])})
    assert busy == current
    stopped = plan_shares(BUDGET, {
        "a": NodeDemand(writers=1, used_bytes=460_000, silent=False, trimmed=True, current=current["a"]),
        "b": NodeDemand(writers=1, used_bytes=200_000, silent=False, trimmed=False, current=current["b"])})
    assert stopped == {"a": 770_000, "b": 230_000}     # still writing a little: 15 % headroom
    idle = plan_shares(BUDGET, {
        "a": NodeDemand(writers=1, used_bytes=460_000, silent=False, trimmed=True, current=current["a"]),
        "b": NodeDemand(writers=1, used_bytes=200_000, silent=False, writing=False, current=current["b"])})
    assert idle == {"a": 800_000, "b": 200_000}        # no writes in the window: exactly what it holds
    # and holding all of its share without writing does not make it ask for more (no flapping)
    assert plan_shares(BUDGET, {
        "a": NodeDemand(writers=1, used_bytes=760_000, silent=False, trimmed=True, current=800_000),
        "b": NodeDemand(writers=1, used_bytes=200_000, silent=False, writing=False, current=200_000)}) == idle


def test_nobody_pressed_returns_the_rest_to_the_reporting_nodes() -> None:
    shares = plan_shares(BUDGET, {"a": NodeDemand(writers=1, used_bytes=100_000, silent=False, current=500_000),
                                  "b": NodeDemand(writers=1, used_bytes=300_000, silent=False, current=500_000),
                                  "c": NodeDemand(writers=1, used_bytes=50_000, silent=True, current=0)})
    assert sum(shares.values()) == BUDGET
    assert shares["c"] == int(BUDGET // 3 * FLOOR_FRACTION)   # silent: its floor, nothing lent to it
    assert shares["b"] > 2 * shares["a"]


def test_a_negative_budget_is_refused() -> None:
    with pytest.raises(ValueError, match="budget"):
        plan_shares(-1, {"a": NodeDemand(writers=1)})


def test_a_report_taken_during_a_trim_does_not_move_the_split_of_two_pressed_nodes() -> None:
    # the engine demo's sequence (173 blocks of 16 KiB): the budget was split 127 / 46 blocks from what the nodes
    # held; then node-b's agent had trimmed to 42 blocks while node-a's report still showed 251 of its 254 (3
    # removed so far). Weighting the split by those holdings cut node-b to 24.8 blocks (it trimmed again, and
    # node-a, already at its share, did not grow into what node-b lost): 89 % of the budget held.
    block, budget = 16_384, 173 * 16_384
    current = {"a": 2_080_768, "b": 753_664}

    def plan(held_a: int, held_b: int) -> dict[str, int]:
        return plan_shares(budget, {
            "a": NodeDemand(writers=1, used_bytes=held_a * block, silent=False, trimmed=True, current=current["a"]),
            "b": NodeDemand(writers=1, used_bytes=held_b * block, silent=False, trimmed=True, current=current["b"])})

    assert plan(251, 42) == current          # node-a mid-trim, node-b done
    assert plan(115, 92) == current          # the mirror: node-a done, node-b's report before its trim
    assert plan(115, 42) == current          # both done (each at or above 90 % of its share)
    # a node pressed by its writes (not trimmed yet) holding more than its share counts at its share too
    assert plan_shares(budget, {
        "a": NodeDemand(writers=1, used_bytes=251 * block, silent=False, current=current["a"]),
        "b": NodeDemand(writers=1, used_bytes=42 * block, silent=False, trimmed=True, current=current["b"])}) == current
