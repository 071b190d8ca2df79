"""An ingest task that finds the database unreachable is retried (a database restart loses no agent message)."""
from __future__ import annotations

import pytest
from django.db import OperationalError

from dashboard import tasks
from dashboard.models import Report
from dashboard.telemetry import ingest as ingest_module
from tests.support.messages import register, report

pytestmark = pytest.mark.django_db


def test_ingest_retries_while_the_database_is_down_and_then_stores(monkeypatch):
    register("node-a")
    real = ingest_module.ingest
    calls = []

    def flaky(messages):
        calls.append(len(messages))
        if len(calls) < 3:
            raise OperationalError("terminating connection due to administrator command")
        return real(messages)

    monkeypatch.setattr(ingest_module, "ingest", flaky)
    result = tasks.ingest.apply(args=[[report(node="node-a", sequence=7)]]).get()
    assert calls == [1, 1, 1] and result["reports"] == 1
    assert Report.objects.filter(node_name="node-a", sequence=7).count() == 1


def test_ingest_gives_up_after_its_retries(monkeypatch):
    def down(messages):
        raise OperationalError("connection refused")

    monkeypatch.setattr(ingest_module, "ingest", down)
    monkeypatch.setattr(tasks.ingest, "max_retries", 2)
    with pytest.raises(OperationalError):
        tasks.ingest.apply(args=[[report(node="node-a", sequence=8)]]).get()
