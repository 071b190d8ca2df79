"""``python -m demo.store_probe INPUT.json``: which of a list of keys a tenant's Store holds.

Input: ``{"store": <config document's store endpoints>, "tenant_id": "acme", "keys": ["...", ...]}``. Opens one
Store client of the tenant that mounts nothing (``global_segment_size`` 0) and asks ``batch_is_exist`` in
batches of 2048. Prints ``{"exists": [1, 0, ...]}`` (one entry per key, in order: 1 present, 0 absent,
negative on error) as the last stdout line. A subprocess because the Mooncake client logs (glog) to stderr.

On a multi-tenant master the admin API lists only the ``default`` tenant's keys (Mooncake 0.3.13.post1), so
the demo asks about the keys it predicts from the prompts it sent and compares their count with the master's
``master_key_count``.
"""
from __future__ import annotations

import json
import sys
from typing import Any


def exists(data: dict[str, Any]) -> list[int]:
    """``batch_is_exist`` of ``data["keys"]`` for tenant ``data["tenant_id"]`` (see the module docstring)."""
    from agent.contract.messages import StoreEndpoints
    from agent.datapath.store import open_store

    endpoints = StoreEndpoints.model_validate({**data["store"], "global_segment_size": 0})
    keys = list(data["keys"])
    client = open_store(endpoints, data["tenant_id"])
    try:
        out: list[int] = []
        for start in range(0, len(keys), 2048):
            out.extend(int(c) for c in client.exists(keys[start:start + 2048]))
        return out
    finally:
        client.close()


def main(argv: list[str] | None = None) -> int:
    """Entry point: read the input file, print the answer."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m demo.store_probe INPUT.json", file=sys.stderr)
        return 2
    with open(args[0]) as handle:
        data = json.load(handle)
    print(json.dumps({"exists": exists(data)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
