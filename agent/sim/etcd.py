"""Run a real single-member ``etcd`` (Debian's ``etcd-server``, 3.4) on loopback: the leader election (and the
metadata replication, ``--enable_oplog``) of HA ``mooncake_master`` sets in tests, benchmarks and the demo.

:class:`EtcdProcess` starts ``etcd`` on free client and peer ports with its data in a temporary directory (removed on
stop), waits until it answers ``/health``, and stops it.
"""
from __future__ import annotations

import atexit
import json
import shutil
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from agent.sim.master import MasterError, free_ports, log_tail, stop_process

_LIVE: set[EtcdProcess] = set()


def find_etcd_binary() -> str:
    """Path of ``etcd`` on ``PATH`` (Debian: ``/usr/bin/etcd``).

    Raises:
        FileNotFoundError: not installed (``apt-get install etcd-server``; ``scripts/bootstrap.sh`` does).
    """
    found = shutil.which("etcd")
    if found:
        return found
    raise FileNotFoundError("etcd not found on PATH; install Debian's etcd-server (scripts/bootstrap.sh does)")


class EtcdProcess:
    """A one-member ``etcd`` child process on ``host`` (loopback).

    Args:
        host: address to bind.
        workdir: data directory parent (a temporary one, removed on stop, when None).
        startup_timeout: seconds to wait for ``/health``.

    Use as a context manager, or :meth:`start` / :meth:`stop`. :attr:`endpoint` is ``host:client_port``, what
    ``mooncake_master --etcd_endpoints`` and ``etcd://`` master addresses take.
    """

    def __init__(self, *, host: str = "127.0.0.1", workdir: str | Path | None = None,
                 startup_timeout: float = 30.0) -> None:
        self.host = host
        self.binary = find_etcd_binary()
        self.startup_timeout = startup_timeout
        self._own_workdir = workdir is None
        self._workdir_arg = workdir
        self.workdir: Path | None = None
        self.client_port = self.peer_port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self._log: Any = None

    @property
    def endpoint(self) -> str:
        """``host:client_port``."""
        return f"{self.host}:{self.client_port}"

    @property
    def running(self) -> bool:
        """Whether the child process is alive."""
        return self.proc is not None and self.proc.poll() is None

    @property
    def log_path(self) -> Path:
        """etcd's combined stdout/stderr log."""
        assert self.workdir is not None, "etcd not started"
        return self.workdir / "etcd.log"

    def command(self) -> list[str]:
        """etcd's argv for the current ports and data directory."""
        assert self.workdir is not None
        client, peer = f"http://{self.host}:{self.client_port}", f"http://{self.host}:{self.peer_port}"
        return [self.binary, "--name", "kvpool", "--data-dir", str(self.workdir / "data"),
                "--listen-client-urls", client, "--advertise-client-urls", client,
                "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                "--initial-cluster", f"kvpool={peer}", "--initial-cluster-state", "new",
                "--log-level", "warn"]

    def start(self, attempts: int = 3) -> EtcdProcess:
        """Start etcd and wait until ``/health`` says healthy; retries on fresh ports when one was taken meanwhile.

        Raises:
            MasterError: it exited or did not become healthy in ``startup_timeout`` seconds (log tail attached).
        """
        if self.running:
            return self
        if self.workdir is None:
            self.workdir = (Path(tempfile.mkdtemp(prefix="kvpool-etcd-")) if self._own_workdir
                            else Path(self._workdir_arg))  # type: ignore[arg-type]
            self.workdir.mkdir(parents=True, exist_ok=True)
        last = ""
        for _ in range(attempts):
            self.client_port, self.peer_port = free_ports(2, self.host)
            shutil.rmtree(self.workdir / "data", ignore_errors=True)
            self._log = open(self.log_path, "ab")  # noqa: SIM115 (etcd's stdout; closed by stop())
            self.proc = subprocess.Popen(self.command(), stdout=self._log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True)
            _LIVE.add(self)
            deadline = time.monotonic() + self.startup_timeout
            while self.proc.poll() is None and time.monotonic() < deadline:
                if self.healthy():
                    return self
                time.sleep(0.1)
            last = self.log_tail()
            self._terminate()
        raise MasterError(f"etcd did not become healthy after {attempts} attempt(s): {last}")

    def healthy(self) -> bool:
        """``GET /health`` answers ``{"health": "true"}``."""
        try:
            with urllib.request.urlopen(f"http://{self.endpoint}/health", timeout=1) as response:
                return json.loads(response.read(4096) or b"{}").get("health") == "true"
        except (OSError, ValueError):
            return False

    def log_tail(self, lines: int = 15) -> str:
        """The last ``lines`` lines of etcd's log ("" before start)."""
        return log_tail(self.log_path if self.workdir is not None else None, lines)

    def _terminate(self) -> None:
        proc, self.proc = self.proc, None
        stop_process(proc, grace=10)
        if self._log is not None:
            self._log.close()
            self._log = None

    def stop(self) -> None:
        """Stop etcd (SIGTERM, then SIGKILL after 10 s) and remove a temporary workdir."""
        self._terminate()
        _LIVE.discard(self)
        if self._own_workdir and self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)
            self.workdir = None

    def __enter__(self) -> EtcdProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@atexit.register
def _stop_all() -> None:
    for etcd in list(_LIVE):
        etcd.stop()
