"""Why an unknown namespace cannot be named from the Store's keys alone (issue 18 item 3), pinned on a real
``mooncake_master`` 0.3.13.post1 (``--enable_multi_tenants=true``) so that a wheel that changes it fails here and the
agent can start listing (``docs/design.md``, "Unknown namespaces").

* The Python client (``mooncake.store.MooncakeDistributedStore``) has no call that lists keys: by exact key only
  (``batch_is_exist``, ``batch_get_replica_desc``), and by pattern only ``remove_by_regex``, which removes.
* The master's HTTP admin endpoints see only the ``default`` tenant: ``/get_all_keys`` lists none of a tenant's
  keys, with or without a ``tenant_id`` parameter, and ``/batch_query_keys`` does not find them.
* The master does serve a per-tenant pattern listing over its RPC port (``GetReplicaListByRegex``, counted in
  ``master_get_replica_list_by_regex_requests_total``), but nothing in the wheel's Python binding calls it.
"""
from __future__ import annotations

import ctypes
import json
import urllib.error
import urllib.parse
import urllib.request

import pytest

pytestmark = pytest.mark.integration

TENANT = "alpha"


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:  # noqa: S310 (loopback test master)
            return response.status, response.read(1 << 20).decode("utf-8", "replace")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read(1 << 16).decode("utf-8", "replace")


def test_the_python_client_lists_no_keys() -> None:
    from mooncake.store import MooncakeDistributedStore

    calls = {name for name in dir(MooncakeDistributedStore) if not name.startswith("_")}
    assert {"batch_is_exist", "batch_get_replica_desc", "remove_by_regex"} <= calls
    listing = {name for name in calls if "regex" in name or "list" in name or "all_keys" in name or
               name.endswith("_keys") or name == "keys"}
    assert listing == {"remove_by_regex"}, listing


def test_a_tenants_keys_are_not_listed_by_the_masters_http_endpoints(mooncake_master, store_client_factory,
                                                                      unique_name) -> None:
    store = store_client_factory(mooncake_master, TENANT)
    prefix = unique_name("mistyped")
    keys = [f"{prefix}@tiny-llama@tp_rank:0@pcp0@dcp0@pp_rank:0@group:0@{i:064x}" for i in range(3)]
    buffer = ctypes.create_string_buffer(4096)
    store.register(ctypes.addressof(buffer), 4096)
    try:
        assert store.put_from(keys, [ctypes.addressof(buffer)] * 3, [1024] * 3) == [0, 0, 0]
        assert store.exists(keys) == [1, 1, 1]  # the tenant's own client finds them
        admin = mooncake_master.admin_url
        for path in ("/get_all_keys", f"/get_all_keys?tenant_id={TENANT}"):
            status, body = _get(admin + path)
            assert status == 200 and prefix not in body, (path, body[:200])
        status, body = _get(f"{admin}/batch_query_keys?keys={urllib.parse.quote(keys[0])}&tenant_id={TENANT}")
        assert status == 200 and json.loads(body)["data"][keys[0]]["ok"] is False, body[:300]
        # the master has a per-tenant pattern listing on its RPC port, which the Python client cannot call
        status, body = _get(admin + "/metrics")
        assert status == 200 and "master_get_replica_list_by_regex_requests_total" in body
    finally:
        store.remove(keys, force=True)
        store.unregister(ctypes.addressof(buffer))
