"""Freshness of config documents (issue 16, item 10): each delivery is stamped ``sent_at`` by the dashboard and the
agent refuses one sent outside its window, so an old signed document replayed to a fresh agent (empty state
directory) applies nowhere, while the current version re-pushed after a long outage applies. Before this a fresh
agent applied any old document it was handed."""
from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta

import pytest

from agent.contract import signing
from agent.node.daemon import Daemon
from tests.support.messages import document

NOW = datetime.now(UTC)


@pytest.fixture
def fresh(tmp_path):
    daemon = Daemon("node-a", "s3cret", tmp_path / "state", publish=lambda batch: None)
    yield daemon
    daemon.stop()


def test_an_old_document_replayed_to_a_fresh_agent_is_refused_with_the_reason(fresh, caplog):
    caplog.set_level(logging.WARNING)
    ack = fresh.handle_document(document(version=9, sent_at=NOW - timedelta(days=400)))
    assert (ack["status"], ack["reason"], fresh.applied_version) == ("rejected", "stale", 0)
    assert "sent_at" in ack["error"] and "more than the 7200 s this agent accepts" in ack["error"]
    assert "rejected config document version=9: stale" in caplog.text
    unstamped = fresh.handle_document(document(version=9, sent_at=""))
    assert unstamped["reason"] == "stale" and "no sent_at stamp" in unstamped["error"]
    ahead = fresh.handle_document(document(version=9, sent_at=NOW + timedelta(hours=1)))
    assert ahead["reason"] == "stale" and "in the future" in ahead["error"]


def test_the_current_version_re_pushed_after_a_long_outage_applies(fresh):
    """issued_at stays the version's creation time (days ago); the re-push stamps a fresh sent_at."""
    old_version = document(version=3, sent_at=NOW - timedelta(days=3))
    assert fresh.handle_document(old_version)["reason"] == "stale"
    repushed = fresh.handle_document(document(version=3))
    assert repushed["status"] == "applied" and fresh.applied_version == 3
    # the stamp is not part of the version's identity: another delivery of version 3 is the same digest
    assert signing.document_digest(document(version=3)) == signing.document_digest(old_version)
    again = fresh.handle_document(document(version=3, sent_at=NOW - timedelta(minutes=5)))
    assert again["status"] == "applied" and again["digest"] == repushed["digest"] == fresh.applied_digest


def test_an_agent_with_state_still_applies_unstamped_newer_versions(fresh):
    """Dashboards before the stamp: the version check stops regressions once something is applied."""
    assert fresh.handle_document(document(version=1))["status"] == "applied"
    assert fresh.handle_document(document(version=2, sent_at=""))["status"] == "applied"
    assert fresh.handle_document(document(version=1, sent_at=""))["reason"] == "stale"


def test_the_window_is_the_agent_s_setting(tmp_path):
    daemon = Daemon("node-a", "s3cret", tmp_path / "state", publish=lambda batch: None, max_message_age=60)
    try:
        ack = daemon.handle_document(document(version=1, sent_at=NOW - timedelta(minutes=5)))
        assert ack["reason"] == "stale" and "more than the 60 s" in ack["error"]
    finally:
        daemon.stop()
