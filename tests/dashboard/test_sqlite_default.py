"""The embedded default database (SQLite, ``dashboard.settings``) takes API writes while another process writes
the same file, as the Celery worker does: WAL journal, immediate transactions, a busy timeout.

With Django's defaults (rollback journal, deferred transactions, 5 s timeout) ``POST /api/v1/releases/`` answered
``500 database is locked`` next to a running worker.
"""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
from django.conf import settings as django_settings
from django.db import connection

from tests.support.factories import RELEASE_DEFAULTS, make_model, make_tenant
from tests.support.registry import fast_password_hashing, operator, token_client  # noqa: F401  (fixtures)
from tests.support.telemetry import _base_env, database_url  # also: the SQLite test database is a file
from tests.support.waiting import wait_for

ON_SQLITE = django_settings.DATABASES["default"]["ENGINE"].endswith("sqlite3")
#: The tests below need the embedded default; a run on PostgreSQL (CI) runs this file again without DATABASE_URL.
sqlite_only = pytest.mark.skipif(not ON_SQLITE, reason="runs on the embedded default (SQLite): "
                                                       "test_the_sqlite_tests_run_on_a_postgresql_run_too runs them")

RELEASES = 40


@sqlite_only
@pytest.mark.django_db(transaction=True)
def test_the_sqlite_default_is_wal_with_immediate_transactions_and_a_busy_timeout():
    options = django_settings.DATABASES["default"]["OPTIONS"]
    assert options["transaction_mode"] == "IMMEDIATE" and options["timeout"] >= 20
    with connection.cursor() as cursor:
        cursor.execute("PRAGMA journal_mode")
        assert cursor.fetchone()[0] == "wal"


@sqlite_only
@pytest.mark.django_db(transaction=True)
def test_the_api_takes_writes_while_another_process_writes_the_file(operator, settings, tmp_path):  # noqa: F811
    settings.KVPOOL_MASTER_SYNC = False
    model = make_model(make_tenant())
    api = token_client(operator)
    api.raise_request_exception = False
    ready, stop = tmp_path / "ready", tmp_path / "stop"
    writer = subprocess.Popen([sys.executable, "-m", "tests.support.sqlite_writer", "--ready", str(ready),
                               "--stop", str(stop)], env=_base_env(DATABASE_URL=database_url()),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: ready.exists() or writer.poll() is not None, 60, "the writer's first commit")
        statuses = [api.post("/api/v1/releases/", {"model": model.pk, "namespace": f"release-{index}",
                                                   "weights_revision": "r1", **RELEASE_DEFAULTS},
                             format="json").status_code for index in range(RELEASES)]
    finally:
        stop.touch()
        out, err = writer.communicate(timeout=120)
    assert writer.returncode == 0, err[-3000:]
    rounds = json.loads(out.strip().splitlines()[-1])
    assert rounds["committed"] > RELEASES / 4, rounds  # it did write all along
    assert statuses == [201] * RELEASES
    assert rounds["locked"] == 0, rounds


@pytest.mark.skipif(ON_SQLITE, reason="the SQLite tests of this file run directly")
def test_the_sqlite_tests_run_on_a_postgresql_run_too(tmp_path):
    """CI runs the suite on PostgreSQL; the embedded default must hold there too: this file again, in a pytest of
    its own without ``DATABASE_URL`` (so on SQLite), and both tests must pass (not skip)."""
    env = {key: value for key, value in _base_env().items() if key != "DATABASE_URL"}
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs", __file__,
                           "-k", "not postgresql_run", "--basetemp", str(tmp_path / "t")],
                          env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0 and "2 passed" in done.stdout and "skipped" not in done.stdout, done.stdout[-3000:]
