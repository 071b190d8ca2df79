"""Check the project's vLLM hashing and key grammar against the recorded vLLM 0.32.0 captures in this folder.

Run from the repo root with the project's venv: ``.venv/bin/python tests/data/vllm/verify_keys.py``.
For every ``*.meta.json`` beside this file it recomputes, with ``agent`` hashing (compiled and pure-Python
paths) and ``agent`` keys, the store key of every full block of every request, and checks:

* the keys equal, byte for byte, the keys the Mooncake master held after the run (``store_keys``);
* every ``BlockStored`` event in ``*.frames.jsonl`` names a computed block: int hashes are the low 64 bits
  (big-endian) of the full digest, byte hashes are the full digest; parents and token ids agree;
* ``agent`` keys' ``parse`` / ``format`` round-trips each key.

Prints one line per run and exits non-zero on any mismatch.
"""

from __future__ import annotations

import base64
import json
import sys
from pathlib import Path

import msgpack

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[2]))

try:  # the agent package is being restructured: accept both layouts
    from agent.datapath import hashing
except ImportError:  # pragma: no cover
    from agent import hashing  # type: ignore[no-redef]
try:
    from agent.contract import keys
except ImportError:  # pragma: no cover
    from agent import keys  # type: ignore[no-redef]

LOW64 = (1 << 64) - 1


def decode_frames(path: Path) -> list[tuple[bytes, int, list]]:
    """``(topic, seq, payload)`` of every recorded message; payload = msgpack ``[ts, [event, ...], dp_rank]``."""
    out = []
    for line in path.read_text().splitlines():
        topic, seq, payload = (base64.b64decode(f) for f in json.loads(line))
        out.append((topic, int.from_bytes(seq, "big"), msgpack.unpackb(payload, raw=False)))
    return out


def check_run(meta_path: Path) -> list[str]:
    """Mismatches of one run (empty when everything agrees)."""
    meta = json.loads(meta_path.read_text())
    errors: list[str] = []
    bs = meta["block_size"]
    model = keys.vllm_model_name(meta["model_arg"])
    if model != meta["model_dir_name"]:
        errors.append(f"model name {model!r} != {meta['model_dir_name']!r}")
    blocks: dict[bytes, tuple[bytes | None, list[int]]] = {}  # digest -> (parent digest, tokens)
    computed: list[str] = []
    for req in meta["requests"]:
        toks = req["token_ids"]
        chains = []
        for native in (None, False):
            hasher = hashing.VllmBlockHasher(meta["hash_algo"], block_size=bs, seed=meta["PYTHONHASHSEED"],
                                             cache_salt=req["cache_salt"], native=native)
            chains.append(hasher.block_hashes(toks))
        if chains[0] != chains[1]:
            errors.append(f"request {req['id']}: compiled and pure-Python chains differ")
        parent = None
        for i, digest in enumerate(chains[1]):
            blocks[digest] = (parent, toks[i * bs:(i + 1) * bs])
            parent = digest
            key = keys.vllm_key(model, digest, cache_prefix=meta["cache_prefix"] or None)
            if keys.format(keys.parse(key)) != key:
                errors.append(f"parse/format round trip changed {key}")
            computed.append(key)
    held = meta["store_keys"]["keys_present"]
    if sorted(set(computed)) != sorted(held):
        errors.append(f"keys differ: computed-only {sorted(set(computed) - set(held))}, "
                      f"held-only {sorted(set(held) - set(computed))}")
    listed = meta["store_keys"]["get_all_keys"]
    if listed and sorted(listed) != sorted(held):
        errors.append("get_all_keys differs from keys_present")
    if meta["store_keys"]["master_key_count"] != len(held):
        errors.append(f"master_key_count {meta['store_keys']['master_key_count']} != {len(held)} keys found")

    by_low64 = {int.from_bytes(d, "big") & LOW64: d for d in blocks}
    as_int = meta["VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES"] == 1
    stored_cpu: set[bytes] = set()

    def resolve(h):
        if h is None:
            return None
        if as_int:
            if not isinstance(h, int):
                errors.append(f"expected an int hash, got {type(h).__name__}")
            return by_low64.get(h)
        return h if h in blocks else None

    for _topic, seq, (_ts, events, *_rest) in decode_frames(meta_path.with_name(meta["run"] + ".frames.jsonl")):
        for ev in events:
            if ev.get("type") != "BlockStored":
                errors.append(f"seq {seq}: unexpected event {ev.get('type')}")
                continue
            digests = [resolve(h) for h in ev["block_hashes"]]
            if None in digests:
                errors.append(f"seq {seq}: unknown block hash in {ev['block_hashes']}")
                continue
            parent = resolve(ev["parent_block_hash"])
            if (parent is None) != (ev["parent_block_hash"] is None) or blocks[digests[0]][0] != parent:
                errors.append(f"seq {seq}: parent {ev['parent_block_hash']} does not match the chain")
            toks = [t for d in digests for t in blocks[d][1]]
            if ev["token_ids"] != toks:
                errors.append(f"seq {seq}: token_ids differ from the computed blocks")
            if ev["medium"] == "cpu":
                stored_cpu.update(digests)
    held_digests = {bytes.fromhex(k.rsplit("@", 1)[1]) for k in held}
    if stored_cpu != held_digests:
        errors.append(f"store (medium 'cpu') events name {len(stored_cpu)} blocks, the master held {len(held_digests)}")
    print(f"{meta['run']}: {len(held)} keys, {len(stored_cpu)} store events' blocks, "
          f"{'int' if as_int else 'bytes'} hashes, seed={meta['PYTHONHASHSEED']!r}: "
          f"{'OK' if not errors else 'MISMATCH'}")
    return errors


def main() -> int:
    """Check every recorded run; print mismatches."""
    bad = 0
    for meta_path in sorted(HERE.glob("*.meta.json")):
        for err in check_run(meta_path):
            print("  " + err)
            bad += 1
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
