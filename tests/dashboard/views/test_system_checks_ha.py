"""System checks of the HA master settings (``kvpool.E016``, ``kvpool.W009``, ``dashboard.checks.check_master_ha``)."""
from __future__ import annotations

import pytest
from django.core import checks
from django.test import override_settings

from dashboard.checks import TAG

HA = {"KVPOOL_MASTER_HA_ETCD_ENDPOINTS": "10.0.0.1:2379", "KVPOOL_MASTER_HA_ADDRESSES": ["a:1", "b:1"],
      "KVPOOL_MASTER_HA_ADMIN_URLS": ["http://a:2", "http://b:2"], "KVPOOL_METADATA_SERVER": "etcd://10.0.0.1:2379"}


def _messages(**overrides) -> list[checks.CheckMessage]:
    with override_settings(**{**HA, **overrides}):
        return [m for m in checks.run_checks(tags=[TAG]) if m.id in ("kvpool.E016", "kvpool.W009")]


def test_a_complete_ha_set_passes():
    assert _messages() == []
    assert _messages(KVPOOL_METADATA_SERVER="P2PHANDSHAKE") == []


@pytest.mark.parametrize(("overrides", "text"), [
    ({"KVPOOL_MASTER_HA_ADMIN_URLS": ["http://a:2"]}, "2 master RPC address(es) but 1 admin URL"),
    ({"KVPOOL_MASTER_HA_ADDRESSES": ["a:1", "b"]}, "HA master 1"),
    ({"KVPOOL_MASTER_HA_ETCD_ENDPOINTS": "etcd-without-port"}, "KVPOOL_MASTER_HA_ETCD_ENDPOINTS"),
    ({"KVPOOL_MASTER_HA_ETCD_ENDPOINTS": 2379}, "must be a string"),
])
def test_e016_a_broken_ha_set(overrides, text):
    (message,) = _messages(**overrides)
    assert message.id == "kvpool.E016" and message.level == checks.ERROR and text in message.msg
    assert "docs/ha.md" in message.hint


def test_w009_one_master_or_http_metadata_in_ha_mode():
    (alone,) = _messages(KVPOOL_MASTER_HA_ADDRESSES=["a:1"], KVPOOL_MASTER_HA_ADMIN_URLS=["http://a:2"])
    assert alone.id == "kvpool.W009" and "nothing takes over" in alone.msg
    (http,) = _messages(KVPOOL_METADATA_SERVER="http://a:8080/metadata")
    assert http.id == "kvpool.W009" and "etcd://10.0.0.1:2379" in http.hint


def test_no_ha_settings_no_ha_checks():
    assert _messages(KVPOOL_MASTER_HA_ETCD_ENDPOINTS="", KVPOOL_MASTER_HA_ADDRESSES=["bad"]) == []
