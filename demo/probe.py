"""``python -m demo.probe INPUT.json``: check on the real Store that cache scopes never share blocks.

Input (written by the demo): ``store`` (the config document's store endpoints), ``instances`` (the config
document's instance specs, whose key spaces the probe rebuilds exactly as the agents do, with
``agent.datapath.keyspace.keyspaces_for_instance``), ``requests`` (per cache scope, the trace requests routed to
it) and ``sample`` (requests per scope to probe on the Store).

Checks, for every pair of scopes of one tenant (different release namespace or request group):

1. **key sets disjoint** — the object keys of every block of every request of one scope and those of the
   other never meet (computed; no Store call);
2. **zero cross hits** — for a sample of a scope's requests, the blocks only it requested (prefix ids the
   other scope never saw) are looked up under the *other* scope's keys on the Store: 0 found, while
   under the scope's own keys some are found (its blocks are really there);

and across tenants: the keys one tenant holds are invisible through the other tenant's client (Mooncake
multi-tenant isolation). Store clients mount no segment (``global_segment_size`` 0). Prints one JSON object as
the last stdout line; exit status 0 when every check passed, 1 otherwise.
"""
from __future__ import annotations

import argparse
import json
import sys
from itertools import combinations
from typing import Any


def _exists(client: Any, keys: list[str]) -> list[int]:
    out: list[int] = []
    for start in range(0, len(keys), 2048):
        out.extend(client.exists(keys[start:start + 2048]))
    return out


def run(data: dict[str, Any]) -> dict[str, Any]:
    """Run the checks on ``data`` (see the module docstring); returns the findings."""
    from agent.contract.messages import InstanceSpec, StoreEndpoints
    from agent.datapath.keyspace import keyspaces_for_instance
    from agent.datapath.store import open_store

    keyspaces = {}
    for raw in data["instances"]:
        for ks in keyspaces_for_instance(InstanceSpec.model_validate(raw)).values():
            keyspaces[ks.scope] = ks
    requests = {tuple(json.loads(key)): reqs for key, reqs in data["requests"].items()}
    unknown = [key for key in requests if key not in keyspaces]
    if unknown:
        raise ValueError(f"requests for cache scopes no instance serves: {unknown}")
    ids = {key: {block for req in reqs for block in req} for key, reqs in requests.items()}
    keysets = {key: {k for req in reqs for k in keyspaces[key].keys(keyspaces[key].trace_hashes(req))}
               for key, reqs in requests.items()}
    findings: dict[str, Any] = {"scopes": len(requests), "pairs": 0, "keys_compared": 0, "shared_keys": 0,
                                "probed_blocks": 0, "own_found": 0, "cross_found": 0, "cross_tenant_found": 0,
                                "problems": []}
    for a, b in combinations(sorted(requests), 2):
        if a[0] != b[0]:
            continue
        findings["pairs"] += 1
        findings["keys_compared"] += len(keysets[a]) + len(keysets[b])
        shared = keysets[a] & keysets[b]
        if shared:
            findings["shared_keys"] += len(shared)
            findings["problems"].append(f"{'/'.join(a)} and {'/'.join(b)} share {len(shared)} key(s), e.g. "
                                        f"{next(iter(shared))}")
    store = data["store"]
    endpoints = StoreEndpoints.model_validate({**store, "global_segment_size": 0})
    tenants = sorted({key[0] for key in requests})
    clients = {tenant: open_store(endpoints, tenant) for tenant in tenants}
    try:
        sample = int(data.get("sample", 40))
        for key in sorted(requests):
            ks = keyspaces[key]
            client = clients[key[0]]
            own_keys: list[str] = []
            for req in requests[key][-sample:]:
                own_keys.extend(ks.keys(ks.trace_hashes(req)))
            own = _exists(client, own_keys)
            findings["own_found"] += sum(1 for c in own if c == 1)
            present = [k for k, c in zip(own_keys, own) if c == 1]
            for other_key in sorted(requests):
                if other_key == key or other_key[0] != key[0]:
                    continue
                other = keyspaces[other_key]
                probe: list[str] = []
                for req in requests[key][-sample:]:
                    hashes = other.trace_hashes(req)
                    probe.extend(k for i, h in enumerate(hashes) if req[i] not in ids[other_key]
                                 for k in other.keys_for(h))
                found = sum(1 for c in _exists(client, probe) if c == 1)
                findings["probed_blocks"] += len(probe)
                findings["cross_found"] += found
                if found:
                    findings["problems"].append(f"{found} block(s) only {'/'.join(key)} requested were found "
                                                f"under {'/'.join(other_key)}'s keys")
            for tenant, other_client in clients.items():
                if tenant == key[0] or not present:
                    continue
                seen = sum(1 for c in _exists(other_client, present) if c == 1)
                findings["cross_tenant_found"] += seen
                if seen:
                    findings["problems"].append(f"tenant {tenant} sees {seen} object(s) of {'/'.join(key)}")
    finally:
        for client in clients.values():
            client.close()
    if not findings["own_found"]:
        findings["problems"].append("no probed block was found under its own scope's keys: nothing to compare")
    findings["ok"] = not findings["problems"]
    return findings


def main(argv: list[str] | None = None) -> int:
    """Entry point: read the input file, print the findings as JSON."""
    parser = argparse.ArgumentParser(prog="python -m demo.probe")
    parser.add_argument("input", help="JSON file written by the demo")
    args = parser.parse_args(argv)
    with open(args.input, encoding="utf-8") as handle:
        data = json.load(handle)
    findings = run(data)
    print(json.dumps(findings), flush=True)
    return 0 if findings["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
