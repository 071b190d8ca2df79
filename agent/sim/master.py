"""Run a real ``mooncake_master`` (Mooncake 0.3.13.post1) on loopback: for tests, benchmarks and the demo.

:class:`MasterProcess` starts the master in multi-tenant mode with a file quota policy
(``tenant_quotas.yaml``: ``version: 1`` and ``tenants: [{name, quota}]``, quotas in bytes), on free ports, waits
until it serves, and stops it. It exposes the addresses a client needs (:meth:`MasterProcess.endpoints`), the
admin API (``/api/v1/tenant_quotas`` on the metrics port) and the Prometheus metrics.

Notes on this master build: ``--rpc_port=0`` does not pick a free port (it falls back to 50051), so ports are
chosen here; an empty policy file is refused (it must be a YAML map with ``version``); client segments below
16 MiB are refused at ``setup()``.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from agent.contract.messages import StoreEndpoints

_LIVE: set[MasterProcess] = set()


def find_master_binary() -> str:
    """Path of ``mooncake_master``: next to ``sys.executable`` (the venv's ``bin``), else on ``PATH``.

    Raises:
        FileNotFoundError: neither place has it (install ``mooncake-transfer-engine-non-cuda``).
    """
    beside = Path(sys.executable).parent / "mooncake_master"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    found = shutil.which("mooncake_master")
    if found:
        return found
    raise FileNotFoundError("mooncake_master not found next to the Python interpreter or on PATH; "
                            "install mooncake-transfer-engine-non-cuda")


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """``count`` distinct TCP ports that were free on ``host`` a moment ago (bound to port 0, then released)."""
    socks: list[socket.socket] = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((host, 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _check_tenant(name: str, quota: int) -> None:
    if not isinstance(name, str) or not name or name.startswith("_") or any(ord(c) < 32 or ord(c) == 127
                                                                             for c in name):
        raise ValueError(f"tenant name {name!r}: must be non-empty, not start with '_', no control characters")
    if isinstance(quota, bool) or not isinstance(quota, int) or not 1 <= quota <= 2**63 - 1:
        raise ValueError(f"tenant {name!r}: quota must be an integer number of bytes in [1, 2**63-1], got {quota!r}")


def render_quota_policy(tenants: Mapping[str, int]) -> str:
    """The ``tenant_quotas.yaml`` text of Mooncake 0.3.13.post1 for ``tenant -> quota bytes``.

    Raises:
        ValueError: a tenant name or quota the master would refuse.
    """
    for name, quota in tenants.items():
        _check_tenant(name, quota)
    doc = {"version": 1, "tenants": [{"name": n, "quota": int(q)} for n, q in tenants.items()]}
    return yaml.safe_dump(doc, sort_keys=False)


class MasterError(RuntimeError):
    """The master did not start, or an admin call failed (the message carries the log tail or HTTP body)."""


def stop_process(proc: subprocess.Popen | None, grace: float) -> None:
    """SIGTERM ``proc`` (if it still runs), SIGKILL after ``grace`` seconds; waits for it either way."""
    if proc is None or proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=5)


def log_tail(path: Path | None, lines: int = 15) -> str:
    """The last ``lines`` lines of the log file at ``path`` ("" when there is none yet)."""
    if path is None or not path.exists():
        return ""
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


class MasterProcess:
    """A ``mooncake_master`` child process in multi-tenant mode on loopback.

    Args:
        tenants: tenant_id -> quota bytes written to the policy file.
        eviction_high_watermark_ratio: ``--eviction_high_watermark_ratio`` (memory use that triggers eviction).
        eviction_ratio: ``--eviction_ratio`` (share of objects evicted per round).
        default_kv_lease_ttl: ``--default_kv_lease_ttl`` in milliseconds (int) or a duration string ("50ms");
            objects inside their lease are neither evicted nor removable without force.
        client_ttl: ``--client_ttl`` seconds before a silent client's segments are unmounted.
        extra_args: further ``--flag=value`` arguments.
        host: loopback address to bind (``127.0.0.1``).
        workdir: directory for the policy file and log (a temporary one, removed on stop, when None).
        binary: path of ``mooncake_master`` (found by :func:`find_master_binary` when None).
        startup_timeout: seconds to wait for readiness.
        etcd_endpoint: HA mode (``--enable_ha=true --ha_backend_type=etcd``) with this etcd (``host:port``, e.g.
            :class:`agent.sim.etcd.EtcdProcess`'s); no embedded HTTP metadata server then: clients use the etcd as
            their metadata server too (:attr:`metadata_server` is ``etcd://host:port``) and find the leader through
            it (:attr:`client_address`).
        enable_oplog: HA mode: ``--enable_oplog=true`` (standbys replay the leader's metadata from etcd).

    Use as a context manager, or :meth:`start` / :meth:`stop`.
    """

    def __init__(self, tenants: Mapping[str, int] | None = None, *,
                 eviction_high_watermark_ratio: float | None = None, eviction_ratio: float | None = None,
                 default_kv_lease_ttl: int | str | None = None, client_ttl: int | None = None,
                 extra_args: Sequence[str] = (), host: str = "127.0.0.1", workdir: str | os.PathLike | None = None,
                 binary: str | None = None, startup_timeout: float = 20.0, etcd_endpoint: str | None = None,
                 enable_oplog: bool = True) -> None:
        self.tenants = dict(tenants or {})
        self.etcd_endpoint = etcd_endpoint
        self.enable_oplog = enable_oplog
        self._policy_text = render_quota_policy(self.tenants)
        self.eviction_high_watermark_ratio = eviction_high_watermark_ratio
        self.eviction_ratio = eviction_ratio
        self.default_kv_lease_ttl = default_kv_lease_ttl
        self.client_ttl = client_ttl
        self.extra_args = list(extra_args)
        self.host = host
        self.binary = binary or find_master_binary()
        self.startup_timeout = startup_timeout
        self._own_workdir = workdir is None
        self._workdir_arg = workdir
        self.workdir: Path | None = None
        self.proc: subprocess.Popen[bytes] | None = None
        self.rpc_port = self.metadata_port = self.metrics_port = 0
        self._log_file: Any = None

    # --- addresses ------------------------------------------------------------------------------------------

    @property
    def rpc_address(self) -> str:
        """``host:rpc_port`` (the client's ``master_server_addr``)."""
        return f"{self.host}:{self.rpc_port}"

    @property
    def ha(self) -> bool:
        """Whether this master runs in HA mode (one of a set electing its leader in etcd)."""
        return self.etcd_endpoint is not None

    @property
    def client_address(self) -> str:
        """What clients take as ``master_server_address``: :attr:`rpc_address`, or ``etcd://<etcd>`` in HA mode."""
        return f"etcd://{self.etcd_endpoint}" if self.ha else self.rpc_address

    @property
    def metadata_server(self) -> str:
        """``http://host:port/metadata`` (the client's ``metadata_server``); ``etcd://<etcd>`` in HA mode."""
        if self.ha:
            return f"etcd://{self.etcd_endpoint}"
        return f"http://{self.host}:{self.metadata_port}/metadata"

    @property
    def admin_url(self) -> str:
        """Base URL of the admin/metrics HTTP server (``/api/v1/tenant_quotas``, ``/metrics``, ``/health``)."""
        return f"http://{self.host}:{self.metrics_port}"

    @property
    def metrics_url(self) -> str:
        """Prometheus text endpoint."""
        return f"{self.admin_url}/metrics"

    @property
    def quota_file(self) -> Path:
        """The ``tenant_quotas.yaml`` policy file the master reads (and rewrites after admin changes)."""
        assert self.workdir is not None, "master not started"
        return self.workdir / "tenant_quotas.yaml"

    @property
    def log_path(self) -> Path:
        """The master's combined stdout/stderr log."""
        assert self.workdir is not None, "master not started"
        return self.workdir / "mooncake_master.log"

    @property
    def running(self) -> bool:
        """Whether the child process is alive."""
        return self.proc is not None and self.proc.poll() is None

    def endpoints(self, **overrides: Any) -> StoreEndpoints:
        """Client endpoints for this master: a 64 MiB segment and a 16 MiB buffer unless ``overrides`` say
        otherwise (sizes as bytes or strings like ``"32MB"``). Clients listen on :attr:`host` too
        (``open_store``'s default ``local_hostname``)."""
        fields: dict[str, Any] = {"master_server_address": self.client_address, "metadata_server": self.metadata_server,
                                  "global_segment_size": 64 << 20, "local_buffer_size": 16 << 20}
        return StoreEndpoints.from_mooncake_config(fields, **overrides)

    # --- lifecycle ------------------------------------------------------------------------------------------

    def command(self) -> list[str]:
        """The master's argv for the current ports and policy file."""
        args = [self.binary, f"--rpc_port={self.rpc_port}", f"--rpc_address={self.host}"]
        if self.ha:
            args += ["--enable_ha=true", "--ha_backend_type=etcd", f"--etcd_endpoints={self.etcd_endpoint}"]
            if self.enable_oplog:
                args.append("--enable_oplog=true")
        else:
            args += ["--enable_http_metadata_server=true", f"--http_metadata_server_host={self.host}",
                     f"--http_metadata_server_port={self.metadata_port}"]
        args += [
            f"--metrics_port={self.metrics_port}", f"--metrics_host={self.host}",
            "--enable_multi_tenants=true", "--tenant_quota_connector_type=file",
            f"--tenant_quota_connector_uri={self.quota_file}",
        ]
        if self.eviction_high_watermark_ratio is not None:
            args.append(f"--eviction_high_watermark_ratio={self.eviction_high_watermark_ratio}")
        if self.eviction_ratio is not None:
            args.append(f"--eviction_ratio={self.eviction_ratio}")
        if self.default_kv_lease_ttl is not None:
            args.append(f"--default_kv_lease_ttl={self.default_kv_lease_ttl}")
        if self.client_ttl is not None:
            args.append(f"--client_ttl={self.client_ttl}")
        return args + self.extra_args

    def start(self, attempts: int = 3, *, keep_ports: bool = False) -> MasterProcess:
        """Start the master and wait until it serves; retries on fresh ports when a port was taken meanwhile.

        ``keep_ports``: start on the ports of the previous run (a restart the clients can find again; no retry on
        other ports).

        Raises:
            MasterError: it exited or did not become ready in ``startup_timeout`` seconds (log tail attached).
        """
        if self.running:
            return self
        if self.workdir is None:
            self.workdir = (Path(tempfile.mkdtemp(prefix="mooncake-master-")) if self._own_workdir
                            else Path(self._workdir_arg))  # type: ignore[arg-type]
            self.workdir.mkdir(parents=True, exist_ok=True)
        if not (keep_ports and self.quota_file.exists()):  # a restarted master reloads the policy it persisted
            self.quota_file.write_text(self._policy_text)
        last: Exception | None = None
        reuse = keep_ports and bool(self.rpc_port)
        for _ in range(1 if reuse else attempts):
            if not reuse:
                self.rpc_port, self.metadata_port, self.metrics_port = free_ports(3, self.host)
            self._log_file = open(self.log_path, "ab")  # noqa: SIM115 (the master's stdout; closed by stop())
            self.proc = subprocess.Popen(self.command(), stdout=self._log_file, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True)
            _LIVE.add(self)
            try:
                self.wait_ready(self.startup_timeout)
                return self
            except MasterError as exc:
                last = exc
                self._terminate()
        raise MasterError(f"mooncake_master did not start after {attempts} attempt(s): {last}")

    def wait_ready(self, timeout: float) -> None:
        """Block until ``/health`` says ``service_ready``, the metadata server answers and the RPC port accepts (HA
        mode: until it serves as leader or answers as a standby, see :meth:`health`).

        Raises:
            MasterError: the process exited or ``timeout`` seconds passed.
        """
        deadline = time.monotonic() + timeout
        while True:
            if self.proc is None or self.proc.poll() is not None:
                raise MasterError(f"mooncake_master exited (rc={self.proc.returncode if self.proc else None}): "
                                  f"{self.log_tail()}")
            if self._ready():
                return
            if time.monotonic() > deadline:
                raise MasterError(f"mooncake_master not ready after {timeout:.0f}s: {self.log_tail()}")
            time.sleep(0.05)

    def health(self) -> dict[str, Any]:
        """``GET /health``: ``role`` (leader/standby), ``ha_state``, ``service_ready``, ``leader_address``,
        ``view_version`` (raises ``OSError`` or ``ValueError`` when it does not answer with JSON)."""
        with urllib.request.urlopen(f"{self.admin_url}/health", timeout=1) as resp:
            return dict(json.loads(resp.read() or b"{}"))

    @property
    def serving(self) -> bool:
        """Whether it answers ``/health`` with ``service_ready`` (in HA mode: it leads and serves)."""
        try:
            return bool(self.running and self.health().get("service_ready"))
        except (OSError, ValueError):
            return False

    def _ready(self) -> bool:
        try:
            health = self.health()
            if self.ha:  # a standby waits in "standby"/"candidate" with no RPC port open
                return bool(health.get("service_ready")) or health.get("role") == "standby"
            if not health.get("service_ready"):
                return False
            try:
                urllib.request.urlopen(f"{self.metadata_server}?key=readiness-probe", timeout=1).close()
            except urllib.error.HTTPError:
                pass  # a 404 for the probe key means the metadata server answers
            with socket.create_connection((self.host, self.rpc_port), timeout=1):
                pass
            return True
        except (OSError, ValueError):
            return False

    def log_tail(self, lines: int = 15) -> str:
        """The last ``lines`` lines of the master's log ("" before start)."""
        return log_tail(self.log_path if self.workdir is not None else None, lines)

    def _terminate(self) -> None:
        proc, self.proc = self.proc, None
        stop_process(proc, grace=5)
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None

    def kill(self) -> None:
        """SIGKILL the master (a crash: no cleanup); the workdir and ports stay for ``start(keep_ports=True)``."""
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(timeout=5)
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None

    def restart(self, *, kill: bool = True) -> MasterProcess:
        """Kill (or stop) the master and start a new, empty one on the same ports; waits until it serves."""
        self.kill() if kill else self._terminate()
        return self.start(keep_ports=True)

    def stop(self) -> None:
        """Stop the master (SIGTERM, then SIGKILL after 5 s) and remove a temporary workdir."""
        self._terminate()
        _LIVE.discard(self)
        if self._own_workdir and self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)
            self.workdir = None

    def __enter__(self) -> MasterProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- admin API and metrics ------------------------------------------------------------------------------

    def _admin(self, method: str, path: str, body: Mapping[str, Any] | None = None) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(f"{self.admin_url}{path}", data=data, method=method,
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=5) as resp:
                payload = json.loads(resp.read() or b"null")
        except urllib.error.HTTPError as exc:
            raise MasterError(f"{method} {path} -> HTTP {exc.code}: {exc.read().decode(errors='replace')}") from None
        if isinstance(payload, dict) and payload.get("success") is False:
            raise MasterError(f"{method} {path} failed: {payload}")
        return payload.get("data") if isinstance(payload, dict) else payload

    def tenant_quotas(self) -> list[dict[str, Any]]:
        """``GET /api/v1/tenant_quotas``: one snapshot dict per tenant (requested/effective/charged bytes, ...)."""
        return list(self._admin("GET", "/api/v1/tenant_quotas") or [])

    def tenant_quota(self, tenant_id: str) -> dict[str, Any]:
        """The quota snapshot of one tenant (``requested_quota_bytes``, ``charged_bytes``, ...)."""
        from urllib.parse import quote

        return self._admin("GET", f"/api/v1/tenant_quotas?tenant_id={quote(tenant_id)}")

    def set_tenant_quota(self, tenant_id: str, quota_bytes: int) -> dict[str, Any]:
        """``PUT /api/v1/tenant_quotas?tenant_id=`` with ``requested_quota_bytes``; returns the new snapshot."""
        from urllib.parse import quote

        _check_tenant(tenant_id, quota_bytes)
        return self._admin("PUT", f"/api/v1/tenant_quotas?tenant_id={quote(tenant_id)}",
                           {"requested_quota_bytes": quota_bytes})

    def metrics(self) -> dict[str, float]:
        """Prometheus samples by name, labels kept in the name
        (``mooncake_tenant_quota_charged_bytes{tenant_id="a"}``)."""
        with urllib.request.urlopen(self.metrics_url, timeout=5) as resp:
            return sample_values(resp.read().decode(errors="replace"))


def sample_values(text: str) -> dict[str, float]:
    """Prometheus text exposition -> ``{sample name with its labels as written: value}``.

    For tests, demos and benchmarks that compare a handful of samples (``master_key_count``,
    ``vllm:external_prefix_cache_hits_total{engine="0",…}``); lines that are comments or not numbers are skipped.
    """
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name, _, value = line.rpartition(" ")
        try:
            out[name] = float(value)
        except ValueError:
            continue
    return out


@atexit.register
def _stop_all() -> None:
    for master in list(_LIVE):
        master.stop()
