"""The agent's Celery app talks to the broker it was given, whatever the environment says."""
from __future__ import annotations

import logging

import pytest

from agent.node.celery_app import make_app


def test_broker_flag_wins_over_celery_broker_url(monkeypatch: pytest.MonkeyPatch,
                                                 caplog: pytest.LogCaptureFixture) -> None:
    """Celery prefers CELERY_BROKER_URL over its ``broker`` argument; the agent must not join that broker."""
    monkeypatch.setenv("CELERY_BROKER_URL", "redis://dashboard-host:6379/0")
    with caplog.at_level(logging.WARNING, logger="kvpool.agent.celery"):
        app = make_app("node-a", "redis://:pw@127.0.0.1:6400/3")
    assert app.conf.broker_read_url == app.conf.broker_write_url == "redis://:pw@127.0.0.1:6400/3"
    with app.connection_for_read() as conn:
        assert (conn.hostname, conn.port, conn.virtual_host) == ("127.0.0.1", 6400, "3")
    with app.connection_for_write() as conn:
        assert (conn.hostname, conn.port) == ("127.0.0.1", 6400)
    assert "ignoring CELERY_BROKER_URL" in caplog.text and "pw" not in caplog.text


@pytest.mark.parametrize("name", ["CELERY_BROKER_READ_URL", "CELERY_BROKER_WRITE_URL"])
def test_split_broker_variables_are_refused(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    monkeypatch.setenv(name, "redis://elsewhere:6379/0")
    with pytest.raises(ValueError, match=name):
        make_app("node-a", "redis://127.0.0.1:6400/3")
