"""``manage.py`` and ``render_config`` report bad settings as one clean line, not a traceback."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
from django.core.management import CommandError, call_command

from dashboard.settings import BASE_DIR


def _manage(*args: str, **env: str) -> subprocess.CompletedProcess:
    environ = {**os.environ, "DJANGO_SETTINGS_MODULE": "dashboard.settings", **env}
    return subprocess.run([sys.executable, str(BASE_DIR / "manage.py"), *args], env=environ, cwd=BASE_DIR,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("variable, value, message", [
    ("DJANGO_DEBUG", "maybe", "DJANGO_DEBUG='maybe' is not a boolean"),
    ("KVPOOL_GLOBAL_SEGMENT_SIZE", "4GB", "KVPOOL_GLOBAL_SEGMENT_SIZE='4GB' is not an integer"),
    ("DATABASE_URL", "garbage", "DATABASE_URL is not a database URL Django can use"),
    ("DATABASE_URL", "postgres://root@127.0.0.1:notaport/root", "DATABASE_URL is not a database URL"),
    ("CELERY_BROKER_URL", "http://x", "CELERY_BROKER_URL: 'http://x' is not a supported broker URL"),
    ("CELERY_BROKER_URL", "redis://127.0.0.1:6379/abc", "the Redis database 'abc' is not a number"),
])
def test_malformed_setting_exits_2_with_one_line(variable, value, message):
    result = _manage("render_config", "--master", **{variable: value})
    assert result.returncode == 2
    assert "Traceback" not in result.stderr and message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


@pytest.mark.django_db
def test_render_config_master_with_a_bad_address_is_a_command_error(settings):
    settings.KVPOOL_MASTER_ADDRESS = "nohost"
    with pytest.raises(CommandError, match="master_server_address 'nohost' must be 'host:port'"):
        call_command("render_config", "--master")
