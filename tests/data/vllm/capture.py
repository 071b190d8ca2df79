"""Record the vLLM 0.32.0 (CPU) + MooncakeStoreConnector captures in this folder (KV events, Store keys, metrics).

    bash scripts/engine_env.sh && var/vllm-venv/bin/python scripts/tiny_model.py var/tiny-llama
    var/vllm-venv/bin/python tests/data/vllm/capture.py embedded-int      # or embedded-full, standalone-store

Starts ``mooncake_master`` (and, for standalone-store, ``mooncake_client``) and the vLLM API server on free
loopback ports, binds a ZMQ SUB socket the engine's KV-event publisher connects to, sends requests (a)-(d),
then writes ``RUN.frames.jsonl`` and ``RUN.meta.json`` here and stops everything it started. Logs and configs go
to ``var/capture/RUN/``. Takes about a minute per run on 2 cores (3.4 GB RSS).
"""
from __future__ import annotations

import base64
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import psutil
import zmq

REPO = Path(__file__).resolve().parents[3]
VENV = REPO / "var/vllm-venv"
PY = VENV / "bin/python"
MASTER_BIN = VENV / "bin/mooncake_master"
CLIENT_BIN = VENV / "bin/mooncake_client"
MODEL = "var/tiny-llama"          # --model value (relative to repo root, cwd = repo root)
OUT = Path(__file__).resolve().parent
BLOCK = 32
CACHE_PREFIX = "production-2026-07"
MODEL_NAME = "tiny-llama"

RUNS = {
    # multi-tenant master, engine tenant-a (embedded), 64-bit int hashes in events
    "embedded-int": dict(multi=True, tenant="tenant-a", int_hashes=True, seed=None, mode="embedded",
                         requests="abcd"),
    # single-tenant master (so /get_all_keys lists the keys), full 32-byte hashes in events
    "embedded-full": dict(multi=False, tenant="default", int_hashes=False, seed=None, mode="embedded",
                          requests="abcd"),
    # multi-tenant master; external mooncake_client (tenant-a) owns the segment; engine is tenant-b;
    # PYTHONHASHSEED set to check the seeded NONE_HASH
    "standalone-store": dict(multi=True, tenant="tenant-b", int_hashes=True, seed="42", mode="standalone-store",
                             requests="ac", client_tenant="tenant-a"),
}


def prompts() -> dict[str, dict]:
    """The request bodies (a)-(d), deterministic."""
    rng = random.Random(2026)
    a = [rng.randrange(1020) for _ in range(150)]
    b = a[:96] + [rng.randrange(1020) for _ in range(64)]
    while b[96] == a[96]:
        b[96] = rng.randrange(1020)
    d = [rng.randrange(1020) for _ in range(300)]
    return {
        # (a) sent as text: checks the WordLevel tokenizer gives exactly these ids (no BOS)
        "a": {"token_ids": a, "salt": None, "body": {"prompt": " ".join(f"t{i}" for i in a)}},
        "b": {"token_ids": b, "salt": None, "body": {"prompt": b}},
        "c": {"token_ids": a, "salt": "groupA-salt", "body": {"prompt": a, "cache_salt": "groupA-salt"}},
        "d": {"token_ids": d, "salt": None, "body": {"prompt": d}},
    }


def free_ports(n: int) -> list[int]:
    socks = []
    for _ in range(n):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        socks.append(s)
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def http(url: str, body: dict | None = None, timeout: float = 60) -> bytes:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return r.read()


def wait_for(pred, timeout: float, what: str, proc: subprocess.Popen | None = None, log: Path | None = None):
    t0 = time.time()
    while time.time() - t0 < timeout:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{what}: process exited rc={proc.returncode}\n" +
                               (log.read_text()[-3000:] if log else ""))
        try:
            if pred():
                return time.time() - t0
        except Exception:
            pass
        time.sleep(0.5)
    raise TimeoutError(what + ("\n" + log.read_text()[-3000:] if log else ""))


def tree_rss(pid: int) -> int:
    p = psutil.Process(pid)
    return sum(q.memory_info().rss for q in [p] + p.children(recursive=True))


class Subscriber(threading.Thread):
    """Binds a SUB socket (the engine's ZMQ publisher connects to tcp://127.0.0.1:PORT) and keeps every message."""

    def __init__(self, port: int):
        super().__init__(daemon=True)
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.SUB)
        self.sock.setsockopt(zmq.SUBSCRIBE, b"")
        self.sock.bind(f"tcp://127.0.0.1:{port}")
        self.frames: list[list[bytes]] = []
        self.last = time.time()
        self.stop = False

    def run(self):
        while not self.stop:
            if self.sock.poll(100):
                self.frames.append(self.sock.recv_multipart())
                self.last = time.time()

    def quiet(self, secs: float, timeout: float = 30):
        t0 = time.time()
        while time.time() - t0 < timeout and time.time() - self.last < secs:
            time.sleep(0.2)


def start(argv, log: Path, env=None, cwd=REPO) -> subprocess.Popen:
    f = open(log, "wb")  # noqa: SIM115 (the child's stdout for its whole life)
    return subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT, env=env, cwd=cwd, start_new_session=True)


def stop(proc: subprocess.Popen | None, sig=signal.SIGTERM, timeout=30):
    if proc is None or proc.poll() is not None:
        return
    os.killpg(proc.pid, sig)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def candidate_keys(reqs, seed: str | None) -> list[tuple[str, str]]:
    """(request, key) for every full block, computed with vLLM's own functions (independent of the project)."""
    if seed is None:
        os.environ.pop("PYTHONHASHSEED", None)
    else:
        os.environ["PYTHONHASHSEED"] = seed
    from vllm.utils.hashing import sha256
    from vllm.v1.core import kv_cache_utils as kcu
    kcu.init_none_hash(sha256)
    out = []
    for name, r in reqs:
        parent = None
        toks = r["token_ids"]
        for i in range(len(toks) // BLOCK):
            extra = (("cache_salt", r["salt"]),) if (i == 0 and r["salt"]) else None
            h = kcu.hash_block_tokens(sha256, parent, toks[i * BLOCK:(i + 1) * BLOCK], extra)
            parent = h
            key = (f"{CACHE_PREFIX}@{MODEL_NAME}@tp_rank:0@pcp0@dcp0@pp_rank:0@group:0@{h.hex()}")
            out.append((name, key))
    return out


def probe_exist(master, tenant: str, keys: list[str]) -> list[int]:
    """batch_is_exist through a fresh client of ``tenant`` (segment 0, so it mounts nothing)."""
    code = (
        "import json,sys\nfrom mooncake.store import MooncakeDistributedStore as S\n"
        "a=json.loads(sys.argv[1]); s=S()\n"
        "kw={} if a['tenant']=='default' else {'tenant_id':a['tenant']}\n"
        "rc=s.setup('127.0.0.1',a['meta'],0,16*1024*1024,'tcp','',a['rpc'],**kw)\n"
        "print('RESULT',json.dumps([rc]+list(s.batch_is_exist(a['keys']) if a['keys'] else [])))\n")
    arg = json.dumps({"tenant": tenant, "meta": master["meta"], "rpc": master["rpc"], "keys": keys})
    for attempt in range(3):
        run = subprocess.run([str(PY), "-c", code, arg], capture_output=True, text=True, timeout=120)
        res = json.loads([ln for ln in run.stdout.splitlines() if ln.startswith("RESULT")][0][7:])
        if res[0] == 0:
            return res[1:]
        print(f"probe client setup failed (attempt {attempt + 1}): {res[:3]}\n{run.stderr[-2000:]}", file=sys.stderr)
        time.sleep(2)
    raise RuntimeError("probe client could not connect")


def main(name: str) -> None:
    cfg = RUNS[name]
    work = REPO / "var/capture" / name
    work.mkdir(parents=True, exist_ok=True)
    rpc, meta_p, metrics_p, api_p, ev_p, cl_p = free_ports(6)
    timings: dict = {}
    procs = {}
    master = {"rpc": f"127.0.0.1:{rpc}", "meta": f"http://127.0.0.1:{meta_p}/metadata",
              "admin": f"http://127.0.0.1:{metrics_p}"}
    quota_yaml = work / "tenant_quotas.yaml"
    quota_yaml.write_text("version: 1\ntenants:\n  - name: tenant-a\n    quota: 268435456\n"
                          "  - name: tenant-b\n    quota: 268435456\n")
    margv = [str(MASTER_BIN), f"--rpc_port={rpc}", "--rpc_address=127.0.0.1",
             "--enable_http_metadata_server=true", "--http_metadata_server_host=127.0.0.1",
             f"--http_metadata_server_port={meta_p}", f"--metrics_port={metrics_p}", "--metrics_host=127.0.0.1"]
    if cfg["multi"]:
        margv += ["--enable_multi_tenants=true", "--tenant_quota_connector_type=file",
                  f"--tenant_quota_connector_uri={quota_yaml}"]
    sub = None
    try:
        procs["master"] = start(margv, work / "master.log")
        wait_for(lambda: json.loads(http(master["admin"] + "/health"))["service_ready"], 30, "master",
                 procs["master"], work / "master.log")
        cargv = None
        if cfg["mode"] == "standalone-store":
            cargv = [str(CLIENT_BIN), "--host=127.0.0.1", f"--port={cl_p}",
                     f"--master_server_address={master['rpc']}", f"--metadata_server={master['meta']}",
                     "--protocol=tcp", "--global_segment_size=256MB", f"--tenant_id={cfg['client_tenant']}"]
            procs["client"] = start(cargv, work / "client.log")
            wait_for(lambda: http(master["admin"] + "/get_all_segments").strip() != b"", 30, "mooncake_client",
                     procs["client"], work / "client.log")
        mcfg = {"metadata_server": master["meta"], "master_server_address": master["rpc"], "protocol": "tcp",
                "device_name": "", "mode": cfg["mode"],
                "global_segment_size": "256MB" if cfg["mode"] == "embedded" else 0,
                "local_buffer_size": "64MB", "tenant_id": cfg["tenant"]}
        (work / "mooncake.json").write_text(json.dumps(mcfg, indent=1))
        kvt = {"kv_connector": "MooncakeStoreConnector", "kv_role": "kv_both",
               "kv_connector_extra_config": {"cache_prefix": CACHE_PREFIX}}
        kve = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": f"tcp://127.0.0.1:{ev_p}"}
        sub = Subscriber(ev_p)
        sub.start()
        env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="1", VLLM_HOST_IP="127.0.0.1",
                   MOONCAKE_REQUESTER_LOCAL_HOSTNAME="127.0.0.1", HF_HUB_OFFLINE="1",
                   MOONCAKE_CONFIG_PATH=str(work / "mooncake.json"))
        env.pop("PYTHONHASHSEED", None)
        if cfg["seed"] is not None:
            env["PYTHONHASHSEED"] = cfg["seed"]
        if not cfg["int_hashes"]:
            env["VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES"] = "0"
        vargv = [str(PY), "-m", "vllm.entrypoints.openai.api_server", "--model", MODEL, "--host", "127.0.0.1",
                 "--port", str(api_p), "--block-size", str(BLOCK), "--enforce-eager", "--max-model-len", "1024",
                 "--max-num-seqs", "4", "--enable-prefix-caching", "--kv-transfer-config", json.dumps(kvt),
                 "--kv-events-config", json.dumps(kve)]
        procs["vllm"] = start(vargv, work / "vllm.log", env=env)
        api = f"http://127.0.0.1:{api_p}"
        timings["time_to_ready_s"] = round(wait_for(lambda: http(api + "/health") is not None, 300, "vllm",
                                                    procs["vllm"], work / "vllm.log"), 1)
        timings["rss_ready_bytes"] = tree_rss(procs["vllm"].pid)
        log = (work / "vllm.log").read_text()
        for k, pat in (("log_loading_weights", r"Loading weights took [\d.]+ seconds"),
                       ("log_init_engine", r"init engine \(profile, create kv cache, warmup model\) took [\d.]+ s")):
            m = re.search(pat, log)
            timings[k] = m.group(0) if m else None
        reqs = prompts()
        sent = []
        responses = {}
        sub.quiet(2)
        for k in cfg["requests"]:
            r = reqs[k]
            body = dict(model=MODEL, max_tokens=4, temperature=0, **r["body"])
            tq = time.time()
            resp = json.loads(http(api + "/v1/completions", body))
            responses[k] = {"text": resp["choices"][0]["text"], "usage": resp.get("usage"),
                            "latency_s": round(time.time() - tq, 2)}
            sub.quiet(2.5)
            sent.append((k, r))
        timings["rss_after_bytes"] = tree_rss(procs["vllm"].pid)
        # tokenizer check through the server
        tok = json.loads(http(api + "/tokenize", {"model": MODEL, "prompt": reqs["a"]["body"]["prompt"]}))
        tokenize_ok = tok.get("tokens") == reqs["a"]["token_ids"]
        metrics = http(api + "/metrics").decode()
        mlines = [ln for ln in metrics.splitlines()
                  if re.match(r"vllm:[a-z_]*(prefix_cache|external|mooncake)", ln)
                  and not re.match(r"\S+_(bucket|created)\{", ln)]
        cands = candidate_keys(sent, cfg["seed"])
        uniq = list(dict.fromkeys(k for _, k in cands))
        exist = probe_exist(master, cfg["tenant"], uniq)
        other_tenant = {"tenant-a": "tenant-b", "tenant-b": "tenant-a"}.get(cfg["tenant"])
        exist_other = probe_exist(master, other_tenant, uniq) if (cfg["multi"] and other_tenant) else None
        all_keys = http(master["admin"] + "/get_all_keys").decode().split()
        mmetrics = http(master["admin"] + "/metrics").decode()
        key_count = int(float(re.search(r"^master_key_count (\S+)", mmetrics, re.M).group(1)))
        tq = json.loads(http(master["admin"] + "/api/v1/tenant_quotas")) if cfg["multi"] else None
        after_stop = None
        # stop the engine; with standalone-store the keys should survive in the client's segment
        t_stop = time.time()
        procs["vllm"].send_signal(signal.SIGINT)  # the API server only: it shuts its engine core down
        try:
            procs["vllm"].wait(60)
        except subprocess.TimeoutExpired:
            stop(procs["vllm"])
        timings["engine_stop_s"] = round(time.time() - t_stop, 1)
        sub.quiet(1, 5)
        if cfg["mode"] == "standalone-store":
            time.sleep(12)
            after_stop = {"exist_12s_after_engine_stop": probe_exist(master, cfg["tenant"], uniq),
                          "master_key_count": int(float(re.search(r"^master_key_count (\S+)",
                                                  http(master["admin"] + "/metrics").decode(), re.M).group(1)))}
        else:
            time.sleep(12)
            after_stop = {"master_key_count_12s_after_engine_stop": int(float(re.search(
                r"^master_key_count (\S+)", http(master["admin"] + "/metrics").decode(), re.M).group(1)))}
        sub.stop = True
        sub.join(2)
        OUT.mkdir(parents=True, exist_ok=True)
        with open(OUT / f"{name}.frames.jsonl", "w") as f:
            for fr in sub.frames:
                f.write(json.dumps([base64.b64encode(x).decode() for x in fr]) + "\n")
        meta = {
            "run": name,
            "format": "frames.jsonl: one line per ZMQ multipart message, a JSON list of its frames, base64",
            "vllm": "vllm-cpu 0.32.0", "mooncake": "mooncake-transfer-engine-non-cuda 0.3.13.post1",
            "model_dir_name": MODEL_NAME, "model_arg": MODEL, "block_size": BLOCK, "hash_algo": "sha256",
            "PYTHONHASHSEED": cfg["seed"], "VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES": 1 if cfg["int_hashes"] else 0,
            "cache_prefix": CACHE_PREFIX, "tenant_id": cfg["tenant"], "mode": cfg["mode"],
            "master_multi_tenant": cfg["multi"],
            "mooncake_client_tenant_id": cfg.get("client_tenant"),
            "kv_transfer_config": kvt, "kv_events_config": kve, "mooncake_config": mcfg,
            "vllm_argv": [str(Path(a).relative_to(REPO)) if a.startswith(str(REPO)) else a for a in vargv],
            "master_argv": [re.sub(str(REPO) + "/", "", a) for a in margv],
            "client_argv": [re.sub(str(REPO) + "/", "", a) for a in cargv] if cargv else None,
            "requests": [{"id": k, "token_ids": r["token_ids"], "cache_salt": r["salt"],
                          "sent_as": "text" if isinstance(r["body"]["prompt"], str) else "token_ids",
                          "response": responses[k]} for k, r in sent],
            "tokenize_endpoint_matches_ids": tokenize_ok,
            "store_keys": {
                "keys_present": [k for k, e in zip(uniq, exist) if e == 1],
                "candidates_absent": [k for k, e in zip(uniq, exist) if e != 1],
                "how": "candidate keys for every full block of every request (vLLM's own hash_block_tokens), "
                       "checked with batch_is_exist by a client of the run's tenant; master_key_count gives the "
                       "total, so present == total means nothing else was stored",
                "master_key_count": key_count,
                "get_all_keys": all_keys,
                "exist_for_other_tenant": exist_other,
                "tenant_quotas": tq,
            },
            "after_engine_stop": after_stop,
            "engine_metrics": mlines,
            "timings": timings,
            "num_messages": len(sub.frames),
        }
        (OUT / f"{name}.meta.json").write_text(json.dumps(meta, indent=1) + "\n")
        print(json.dumps({k: meta[k] for k in ("timings", "num_messages", "tokenize_endpoint_matches_ids")}))
        print("present", len(meta["store_keys"]["keys_present"]),
              "absent", len(meta["store_keys"]["candidates_absent"]),
              "master_key_count", key_count, "get_all_keys", len(all_keys), "other", exist_other, after_stop)
    finally:
        if sub is not None:
            sub.stop = True
        for n in ("vllm", "client", "master"):
            stop(procs.get(n))


if __name__ == "__main__":
    main(sys.argv[1])
