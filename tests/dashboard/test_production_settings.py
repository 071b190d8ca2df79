"""Production settings: no start without a real secret key outside DEBUG, HTTPS settings from the environment,
and ``manage.py check --deploy`` clean with the documented production variables (README "Production settings").
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from dashboard.env import DEV_SECRET_KEY, ImproperlyConfiguredValue, env_proxy_ssl_header, env_secret_key
from tests.support.paths import ROOT

#: A key Django's deploy check accepts (50+ characters, varied, not the ``django-insecure-`` prefix).
PRODUCTION_KEY = "kvpool-prod-4f9c2e7a1b8d3f6e0a5c9b2d7e4f1a8c3b6d9e2f5a8c1b4d7e0f3a6"

#: The production variables of README "Production settings".
PRODUCTION_ENV = {
    "DJANGO_SECRET_KEY": PRODUCTION_KEY,
    "DJANGO_ALLOWED_HOSTS": "kvpool.example.com",
    "DJANGO_SECURE_SSL_REDIRECT": "true",
    "DJANGO_SECURE_HSTS_SECONDS": "31536000",
    "DJANGO_SECURE_HSTS_INCLUDE_SUBDOMAINS": "true",
    "DJANGO_SECURE_HSTS_PRELOAD": "true",
    "DJANGO_SECURE_COOKIES": "true",
    "DJANGO_SECURE_PROXY_SSL_HEADER": "X-Forwarded-Proto: https",
    "DJANGO_CSRF_TRUSTED_ORIGINS": "https://kvpool.example.com",
    "KVPOOL_METRICS_TOKEN": "scrape-token-9f2c",
}


def _run(argv: list[str], **env: str) -> subprocess.CompletedProcess:
    """``argv`` in a clean environment: none of the test run's Django, kvpool, Celery or database variables."""
    environ = {key: value for key, value in os.environ.items()
               if not key.startswith(("DJANGO_", "KVPOOL_", "CELERY_", "DATABASE_URL", "PYTEST"))}
    environ.update({"DJANGO_SETTINGS_MODULE": "dashboard.settings", **env})
    return subprocess.run(argv, env=environ, cwd=ROOT, capture_output=True, text=True, timeout=120)


def _manage(*args: str, **env: str) -> subprocess.CompletedProcess:
    return _run([sys.executable, str(ROOT / "manage.py"), *args], **env)


def test_check_deploy_is_clean_with_the_production_variables():
    result = _manage("check", "--deploy", "--fail-level", "WARNING", **PRODUCTION_ENV)
    assert result.returncode == 0, result.stderr
    assert "System check identified no issues" in result.stdout


def test_check_deploy_names_what_is_missing_without_them():
    result = _manage("check", "--deploy", "--fail-level", "WARNING", DJANGO_SECRET_KEY=PRODUCTION_KEY)
    assert result.returncode == 1
    for check in ("security.W004", "security.W008", "security.W012", "security.W016", "kvpool.W008"):
        assert check in result.stderr


def test_an_open_metrics_endpoint_is_a_deploy_warning_only():
    env = {**PRODUCTION_ENV, "KVPOOL_METRICS_TOKEN": ""}
    result = _manage("check", "--deploy", "--fail-level", "WARNING", **env)
    assert result.returncode == 1 and "kvpool.W008" in result.stderr and "KVPOOL_METRICS_TOKEN" in result.stderr
    assert "kvpool.W008" not in _manage("check", **env).stderr  # plain check (runserver, migrate): quiet
    assert "kvpool.W008" not in _manage("check", "--deploy", DJANGO_DEBUG="true").stderr


@pytest.mark.parametrize("key", [None, "", "   ", DEV_SECRET_KEY])
def test_no_start_without_a_real_secret_key_outside_debug(key):
    env = {} if key is None else {"DJANGO_SECRET_KEY": key}
    result = _manage("check", **env)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert result.stderr.startswith("Error: improperly configured: DJANGO_SECRET_KEY ")
    assert "secrets.token_urlsafe(50)" in result.stderr


@pytest.mark.parametrize("module", ["dashboard.wsgi", "dashboard.celery"])
def test_the_server_and_the_workers_refuse_too(module):
    result = _run([sys.executable, "-c", f"import {module}; from django.conf import settings; settings.SECRET_KEY"])
    assert result.returncode == 2
    assert result.stderr.startswith("Error: improperly configured: DJANGO_SECRET_KEY is not set")
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_the_celery_worker_command_stops_with_one_line():
    """``celery -A dashboard.celery worker`` as README runs it: the app's import stops it before any broker."""
    result = _run([str(Path(sys.executable).with_name("celery")), "-A", "dashboard.celery", "worker", "--pool",
                   "solo", "-Q", "dashboard.ingest,dashboard.control"])
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("Error: improperly configured: DJANGO_SECRET_KEY is not set")
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_debug_runs_with_the_development_key():
    result = _manage("check", DJANGO_DEBUG="true")
    assert result.returncode == 0, result.stderr


def test_env_secret_key(monkeypatch):
    monkeypatch.setenv("K", f"  {PRODUCTION_KEY} ")
    assert env_secret_key("K", debug=False) == PRODUCTION_KEY
    monkeypatch.setenv("K", DEV_SECRET_KEY)
    assert env_secret_key("K", debug=True) == DEV_SECRET_KEY
    with pytest.raises(ImproperlyConfiguredValue, match="K is the development key"):
        env_secret_key("K", debug=False)
    monkeypatch.delenv("K")
    assert env_secret_key("K", debug=True) == DEV_SECRET_KEY
    with pytest.raises(ImproperlyConfiguredValue, match="K is not set"):
        env_secret_key("K", debug=False)


@pytest.mark.parametrize(("raw", "parsed"), [
    ("", None),
    ("X-Forwarded-Proto: https", ("HTTP_X_FORWARDED_PROTO", "https")),
    ("x-forwarded-ssl:on", ("HTTP_X_FORWARDED_SSL", "on")),
])
def test_env_proxy_ssl_header(monkeypatch, raw, parsed):
    monkeypatch.setenv("H", raw)
    assert env_proxy_ssl_header("H") == parsed


@pytest.mark.parametrize("raw", ["X-Forwarded-Proto", "X-Forwarded-Proto:", ": https", "X Forwarded: https",
                                 "X-Forwarded-Proto: a b", "Ünïcode: https"])
def test_env_proxy_ssl_header_refuses_malformed_values(monkeypatch, raw):
    monkeypatch.setenv("H", raw)
    with pytest.raises(ImproperlyConfiguredValue, match="is not 'Header-Name: value'"):
        env_proxy_ssl_header("H")


def test_https_settings_come_from_the_environment():
    code = ("from django.conf import settings as s; print(s.SECURE_SSL_REDIRECT, s.SECURE_HSTS_SECONDS, "
            "s.SECURE_HSTS_INCLUDE_SUBDOMAINS, s.SECURE_HSTS_PRELOAD, s.SESSION_COOKIE_SECURE, s.CSRF_COOKIE_SECURE, "
            "s.SECURE_PROXY_SSL_HEADER, s.CSRF_TRUSTED_ORIGINS)")
    production = _run([sys.executable, "-c", code], **PRODUCTION_ENV)
    assert production.stdout.split("\n")[0] == ("True 31536000 True True True True ('HTTP_X_FORWARDED_PROTO', "
                                                "'https') ['https://kvpool.example.com']")
    default = _run([sys.executable, "-c", code], DJANGO_SECRET_KEY=PRODUCTION_KEY)
    assert default.stdout.split("\n")[0] == "False 0 False False False False None []"


def test_a_malformed_https_variable_is_one_line():
    result = _manage("check", DJANGO_SECRET_KEY=PRODUCTION_KEY, DJANGO_SECURE_HSTS_SECONDS="1y")
    assert result.returncode == 2
    assert result.stderr.strip() == "Error: improperly configured: DJANGO_SECURE_HSTS_SECONDS='1y' is not an integer"
