"""System checks of the settings (``dashboard.checks``): one case per check id, and a clean ``manage.py check``."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
from django.core import checks
from django.test import override_settings

from dashboard.checks import TAG
from dashboard.settings import BASE_DIR


def _ids(**overrides) -> list[str]:
    with override_settings(**overrides):
        return sorted(message.id for message in checks.run_checks(tags=[TAG]))


def _messages(**overrides) -> list[checks.CheckMessage]:
    with override_settings(**overrides):
        return checks.run_checks(tags=[TAG])


def test_the_checks_are_registered_under_the_kvpool_tag():
    names = {check.__name__ for check in checks.registry.registry.get_checks() if TAG in check.tags}
    assert {"check_integer_settings", "check_rollup_ages", "check_broker", "check_master_endpoints",
            "check_paths_and_flags", "check_timing_relations"} <= names


def test_default_settings_pass():
    assert _ids() == []


@pytest.mark.parametrize("name, value", [
    ("KVPOOL_REPUSH_AFTER_SECONDS", "30"),
    ("KVPOOL_PUSH_EXPIRES_SECONDS", 3600.0),
    ("KVPOOL_HEARTBEAT_SILENCE_SECONDS", True),
    ("KVPOOL_GLOBAL_SEGMENT_SIZE", None),
    ("KVPOOL_AGENT_CLOCK_SKEW_SECONDS", "300"),
    ("KVPOOL_MAX_INSTANCES_PER_NODE", "64"),
])
def test_e001_non_integer(name, value):
    messages = _messages(**{name: value})
    assert [(m.id, m.obj) for m in messages] == [("kvpool.E001", name)]
    assert messages[0].level == checks.ERROR and name in messages[0].msg and messages[0].hint


def test_e001_missing_setting(settings):
    del settings.KVPOOL_METRICS_WINDOW_SECONDS
    assert [(m.id, m.obj) for m in checks.run_checks(tags=[TAG])] == [
        ("kvpool.E001", "KVPOOL_METRICS_WINDOW_SECONDS")]


@pytest.mark.parametrize("name, value", [
    ("KVPOOL_REPUSH_AFTER_SECONDS", 0),
    ("KVPOOL_PUSH_EXPIRES_SECONDS", -5),
    ("KVPOOL_MASTER_ADMIN_TIMEOUT_SECONDS", 0),
    ("KVPOOL_MASTER_SAMPLE_RETENTION_SECONDS", 59),
    ("KVPOOL_AGENT_MESSAGE_MAX_AGE_SECONDS", 30),
    ("KVPOOL_AGENT_CLOCK_SKEW_SECONDS", -1),
    ("KVPOOL_LOCAL_BUFFER_SIZE", -1),
    ("KVPOOL_MAX_REQUEST_BYTES", 1024),
    ("KVPOOL_MAX_JSON_DEPTH", 2),
    ("KVPOOL_MAX_INSTANCES_PER_TENANT_PER_NODE", 0),
    ("KVPOOL_MAX_INSTANCES_PER_TENANT", -1),
])
def test_e002_below_minimum(name, value):
    messages = _messages(**{name: value})
    assert [(m.id, m.obj) for m in messages] == [("kvpool.E002", name)]
    assert f"{name}={value}" in messages[0].msg


@pytest.mark.parametrize(("name", "value", "unit"), [
    ("KVPOOL_MAX_REQUEST_BYTES", 1024, "65536 bytes"),
    ("KVPOOL_MAX_JSON_DEPTH", 2, "8 levels"),
    ("KVPOOL_LOCAL_BUFFER_SIZE", -1, "0 bytes"),
    ("KVPOOL_MAX_INSTANCES_PER_NODE", 0, "1 instances"),
    ("KVPOOL_REPUSH_AFTER_SECONDS", 0, "1 seconds"),
])
def test_e002_names_the_unit(name, value, unit):
    assert f"below its minimum of {unit}." in _messages(**{name: value})[0].msg


def test_zero_sized_store_segments_and_no_clock_skew_are_allowed():
    assert _ids(KVPOOL_GLOBAL_SEGMENT_SIZE=0, KVPOOL_LOCAL_BUFFER_SIZE=0, KVPOOL_AGENT_CLOCK_SKEW_SECONDS=0) == []


def test_e002_ratio_settings_lie_in_the_unit_interval(monkeypatch):
    from dashboard import checks as kvpool_checks

    monkeypatch.setattr(kvpool_checks, "_RATIOS", ("KVPOOL_TEST_RATIO",))
    for bad in (0, 1.5, -0.1, "0.5", None, True):
        assert _ids(KVPOOL_TEST_RATIO=bad) == ["kvpool.E002"], bad
    for good in (1, 0.9, 1e-6):
        assert _ids(KVPOOL_TEST_RATIO=good) == [], good


@pytest.mark.parametrize("raw, minute, retention", [
    (7200, 3600, 90 * 86400),      # raw rows outlive the minute rows they feed
    (3600, 86400, 86400),           # hour rows deleted the moment they are made
    (3600, 10 * 86400, 5 * 86400),
])
def test_e003_rollup_ages_must_increase(raw, minute, retention):
    messages = _messages(KVPOOL_ROLLUP_RAW_AFTER_SECONDS=raw, KVPOOL_ROLLUP_MINUTE_AFTER_SECONDS=minute,
                         KVPOOL_RETENTION_SECONDS=retention,
                         KVPOOL_AGENT_MESSAGE_MAX_AGE_SECONDS=60)  # keep W003 out of the way
    assert [m.id for m in messages] == ["kvpool.E003"]
    assert f"({raw})" in messages[0].msg and f"({retention})" in messages[0].msg


def test_e003_not_repeated_when_an_age_is_not_an_integer():
    assert _ids(KVPOOL_RETENTION_SECONDS="90d") == ["kvpool.E001"]


@pytest.mark.parametrize("url", ["http://127.0.0.1:6379/0", "redis://127.0.0.1:6379/abc", "localhost",
                                 "redis://:6379/0", "memory://", None, "redis://h:99999/0"])
def test_e004_broker_url(url):
    messages = _messages(CELERY_BROKER_URL=url)
    assert [m.id for m in messages] == ["kvpool.E004"]
    assert "redis://127.0.0.1:6379/0" in messages[0].hint


@pytest.mark.parametrize("url", ["redis://127.0.0.1:6379/0", "rediss://:secret@cache.example:6380/2",
                                 "redis://redis"])
def test_broker_urls_the_agents_accept_pass(url):
    assert _ids(CELERY_BROKER_URL=url) == []


def test_e013_beat_periods_and_visibility_timeout(settings):
    schedule = {**settings.CELERY_BEAT_SCHEDULE}
    schedule["rollup-occupancy"] = {**schedule["rollup-occupancy"], "schedule": 0}
    schedule["reconcile-configs"] = {**schedule["reconcile-configs"], "schedule": float("nan")}
    assert _ids(CELERY_BEAT_SCHEDULE=schedule) == ["kvpool.E013", "kvpool.E013"]
    options = {**settings.CELERY_BROKER_TRANSPORT_OPTIONS, "visibility_timeout": -1}
    assert _ids(CELERY_BROKER_TRANSPORT_OPTIONS=options) == ["kvpool.E013"]


@pytest.mark.parametrize("url, problem", [
    ("127.0.0.1:9003", "does not start with http:// or https://"),
    ("ftp://127.0.0.1:9003", "does not start with"),
    ("http://127.0.0.1", "names no port"),
    ("http://:9003", "names no host"),
    ("http://127.0.0.1:9003/api/v1", "has a path"),
    ("http://127.0.0.1:9003?x=1", "has a path, query or fragment"),
    ("http://127.0.0.1:port", "not a valid URL"),
    ("", "is not a URL"),
])
def test_e005_master_admin_url(url, problem):
    messages = _messages(KVPOOL_MASTER_ADMIN_URL=url)
    assert [m.id for m in messages] == ["kvpool.E005"]
    assert problem in messages[0].msg


@pytest.mark.parametrize("url", ["http://127.0.0.1:9003", "https://master.example:443/", "http://[::1]:9003"])
def test_master_admin_urls_that_pass(url):
    assert _ids(KVPOOL_MASTER_ADMIN_URL=url) == []


@pytest.mark.parametrize("address", ["nohost", "127.0.0.1", "tcp://127.0.0.1:50051", "127.0.0.1:50051/x",
                                     "127.0.0.1:99999", ":50051", "", 50051])
def test_e006_master_address(address):
    assert _ids(KVPOOL_MASTER_ADDRESS=address) == ["kvpool.E006"]


@pytest.mark.parametrize("address", ["127.0.0.1:50051", "master.example:50051", "[::1]:50051"])
def test_master_addresses_that_pass(address):
    assert _ids(KVPOOL_MASTER_ADDRESS=address) == []


@pytest.mark.parametrize("value, expected", [
    ("", ["kvpool.E007"]),
    (None, ["kvpool.E007"]),
    ("http://127.0.0.1/metadata", ["kvpool.E007"]),
    ("https://:8080/metadata", ["kvpool.E007"]),
    ("metadata.example", ["kvpool.W007"]),
    ("http://127.0.0.1:8080/metadata", []),
    ("P2PHANDSHAKE", []),
    ("etcd://10.0.0.1:2379", []),
    ("redis://10.0.0.1:6379", []),
])
def test_e007_w007_metadata_server(value, expected):
    assert _ids(KVPOOL_METADATA_SERVER=value) == expected


@pytest.mark.parametrize("overrides, expected", [
    ({"KVPOOL_STORE_PROTOCOL": ""}, ["kvpool.E008"]),
    ({"KVPOOL_STORE_PROTOCOL": None}, ["kvpool.E008"]),
    ({"KVPOOL_STORE_DEVICE": ["mlx5_0"]}, ["kvpool.E008"]),
    ({"KVPOOL_STORE_PROTOCOL": "efa"}, ["kvpool.W001"]),
    ({"KVPOOL_STORE_PROTOCOL": "rdma", "KVPOOL_STORE_DEVICE": "mlx5_0,mlx5_1"}, []),
])
def test_e008_w001_store_protocol_and_device(overrides, expected):
    assert _ids(**overrides) == expected


@pytest.mark.parametrize("value", ["etc/kvpool", "", None, "~/kvpool"])
def test_e009_engine_config_dir(value):
    assert _ids(KVPOOL_ENGINE_CONFIG_DIR=value) == ["kvpool.E009"]


@pytest.mark.parametrize("value", ["", "  ", None])
def test_e010_tenant_quotas_path(value):
    assert _ids(KVPOOL_TENANT_QUOTAS_PATH=value) == ["kvpool.E010"]


@pytest.mark.parametrize("value", ["true", 1, None])
def test_e011_master_sync(value):
    assert _ids(KVPOOL_MASTER_SYNC=value) == ["kvpool.E011"]


@pytest.mark.parametrize("value, expected", [("two words", ["kvpool.E012"]), ("tok\n", ["kvpool.E012"]),
                                             (None, ["kvpool.E012"]), ("", []), ("s3cr3t-Token_1", [])])
def test_e012_metrics_token(value, expected):
    assert _ids(KVPOOL_METRICS_TOKEN=value) == expected


def test_w002_push_expires_before_repush():
    messages = _messages(KVPOOL_PUSH_EXPIRES_SECONDS=20, KVPOOL_REPUSH_AFTER_SECONDS=30)
    assert [(m.id, m.level) for m in messages] == [("kvpool.W002", checks.WARNING)]
    assert _ids(KVPOOL_PUSH_EXPIRES_SECONDS=30, KVPOOL_REPUSH_AFTER_SECONDS=30) == []


def test_w003_message_age_beyond_the_receipt_horizon():
    assert _ids(KVPOOL_AGENT_MESSAGE_MAX_AGE_SECONDS=3 * 86400) == ["kvpool.W003"]
    assert _ids(KVPOOL_AGENT_MESSAGE_MAX_AGE_SECONDS=2 * 86400) == []


def test_w004_heartbeat_silence_shorter_than_two_heartbeats():
    assert _ids(KVPOOL_HEARTBEAT_SILENCE_SECONDS=9) == ["kvpool.W004"]
    assert _ids(KVPOOL_HEARTBEAT_SILENCE_SECONDS=10) == []


def test_w005_metrics_window_shorter_than_two_reports():
    assert _ids(KVPOOL_METRICS_WINDOW_SECONDS=15) == ["kvpool.W005"]
    assert _ids(KVPOOL_METRICS_WINDOW_SECONDS=20) == []


def test_w006_master_timeout_not_shorter_than_the_sampling_period(settings):
    schedule = {**settings.CELERY_BEAT_SCHEDULE}
    schedule["sample-master-quotas"] = {**schedule["sample-master-quotas"], "schedule": 5}
    assert _ids(CELERY_BEAT_SCHEDULE=schedule, KVPOOL_MASTER_ADMIN_TIMEOUT_SECONDS=5) == ["kvpool.W006"]
    assert _ids(CELERY_BEAT_SCHEDULE=schedule, KVPOOL_MASTER_ADMIN_TIMEOUT_SECONDS=4) == []


def _manage(*args: str, **env: str) -> subprocess.CompletedProcess:
    environ = {key: value for key, value in os.environ.items()
               if not key.startswith(("DJANGO_", "KVPOOL_", "CELERY_", "DATABASE_URL", "PYTEST"))}
    # the default settings, less DEBUG, need a secret key (tests/dashboard/test_production_settings.py)
    environ.update({"DJANGO_SETTINGS_MODULE": "dashboard.settings", "DJANGO_SECRET_KEY": "k" * 50, **env})
    return subprocess.run([sys.executable, str(BASE_DIR / "manage.py"), *args], env=environ, cwd=BASE_DIR,
                          capture_output=True, text=True, timeout=120)


def test_manage_py_check_passes_on_the_default_settings():
    result = _manage("check")
    assert result.returncode == 0, result.stderr
    assert "System check identified no issues" in result.stdout


def test_manage_py_check_fails_with_the_check_id_and_hint():
    result = _manage("check", KVPOOL_ROLLUP_RAW_AFTER_SECONDS="864000")
    assert result.returncode == 1
    assert "(kvpool.E003)" in result.stderr and "HINT:" in result.stderr


@pytest.mark.parametrize(("overrides", "expected"), [
    ({"DEBUG": False, "SECRET_KEY": "insecure-dev-key-change-me"}, ["kvpool.E014"]),
    ({"DEBUG": False, "SECRET_KEY": " "}, ["kvpool.E014"]),
    ({"DEBUG": True, "SECRET_KEY": "insecure-dev-key-change-me"}, []),
    ({"SECURE_PROXY_SSL_HEADER": ("X_FORWARDED_PROTO", "https")}, ["kvpool.E015"]),
    ({"SECURE_PROXY_SSL_HEADER": "HTTP_X_FORWARDED_PROTO"}, ["kvpool.E015"]),
    ({"SECURE_PROXY_SSL_HEADER": ("HTTP_X_FORWARDED_PROTO", "https")}, []),
])
def test_e014_e015_production_secrets(overrides, expected):
    assert _ids(**overrides) == expected
