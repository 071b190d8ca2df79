"""The node's Store segment in ``standalone-store`` mode: run and supervise one ``mooncake_client``.

On a ``standalone-store`` node (registry ``Node.store_mode``) no engine mounts memory (their
``MOONCAKE_CONFIG_PATH`` says ``global_segment_size: 0``); the node agent runs one ``mooncake_client``
(Mooncake 0.3.13.post1, ``tenants.rendering.render_store_client`` renders its flags) that mounts the node's
``store_segment_bytes`` into the pool, so stored blocks outlive engine restarts. One client serves every tenant:
writes are charged to the writing engine's tenant (checked with a multi-tenant master).

:class:`SegmentSupervisor` starts it, restarts it with exponential backoff when it exits (1 s doubling up to
30 s; back to 1 s after it ran 30 s), and stops it (SIGTERM, then SIGKILL). The client dies with the agent
(``PR_SET_PDEATHSIG``). When a client dies, the master drops its segment and the objects in it after its
``client_ttl`` (about 10 s here), so a restart mounts an empty segment. No Django here.

Usage::

    config = SegmentConfig.from_argv(rendered_argv)       # or SegmentConfig(master_server_address=..., ...)
    with SegmentSupervisor(config, log_path=Path("/var/log/kvpool/mooncake_client.log")) as seg:
        seg.wait_ready(30)
        ...
"""
from __future__ import annotations

import ctypes
import importlib.util
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger("kvpool.agent.segment")

#: Binary name (``argv[0]`` of ``render_store_client``).
CLIENT_BINARY = "mooncake_client"
#: Line the client logs once its segment is mounted and it serves (0.3.13.post1 ``real_client_main.cpp``).
READY_MARK = "Starting real client service on"
_PR_SET_PDEATHSIG = 1


class SegmentError(RuntimeError):
    """The client could not be found or started, or did not become ready (the message carries the log tail)."""


def find_client_binary() -> str:
    """Path of the ``mooncake_client`` binary.

    Looks in the Mooncake wheel's package directory (``mooncake/mooncake_client``, the real binary; found
    without importing the package), then next to ``sys.executable`` (the venv's ``bin``), then on ``PATH``.

    Raises:
        SegmentError: none has it (install ``mooncake-transfer-engine-non-cuda`` or the CUDA wheel).
    """
    try:
        spec = importlib.util.find_spec("mooncake")
    except (ImportError, ValueError):
        spec = None
    for location in (spec.submodule_search_locations or []) if spec is not None else []:
        candidate = Path(location) / CLIENT_BINARY
        if candidate.is_file():
            if not os.access(candidate, os.X_OK):  # the wheel's own launcher does the same
                try:
                    candidate.chmod(candidate.stat().st_mode | 0o111)
                except OSError:
                    continue
            return str(candidate)
    beside = Path(sys.executable).parent / CLIENT_BINARY
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    found = shutil.which(CLIENT_BINARY)
    if found:
        return found
    raise SegmentError("mooncake_client not found in the mooncake package, next to the Python interpreter or on "
                       "PATH; install mooncake-transfer-engine-non-cuda")


@dataclass(frozen=True)
class SegmentConfig:
    """Flags of the node's ``mooncake_client``.

    ``segment_bytes`` (``--global_segment_size``, >= 16 MiB), ``host`` (its transfer engine's address, the node's
    hostname), ``port`` (``--port``, the client's service port), ``master_server_address``, ``metadata_server``,
    ``protocol``, ``device_name`` (``--device_names``, RDMA), ``tenant_id`` (``--tenant_id`` when not empty; not
    needed: writes are charged to the writer).
    """

    master_server_address: str
    metadata_server: str
    segment_bytes: int
    host: str = "127.0.0.1"
    port: int = 50052
    protocol: str = "tcp"
    device_name: str = ""
    tenant_id: str = ""

    def __post_init__(self) -> None:
        if isinstance(self.segment_bytes, bool) or not isinstance(self.segment_bytes, int) \
                or self.segment_bytes < 16 << 20:
            raise ValueError(f"segment_bytes must be an integer >= 16 MiB, got {self.segment_bytes!r}")
        if not 1 <= int(self.port) <= 65535:
            raise ValueError(f"port must be 1..65535, got {self.port!r}")
        if not self.master_server_address or not self.metadata_server:
            raise ValueError("master_server_address and metadata_server are required")

    def argv(self, binary: str = CLIENT_BINARY) -> list[str]:
        """The command line (the same flags as ``tenants.rendering.render_store_client``)."""
        args = [binary, f"--host={self.host}", f"--port={self.port}",
                f"--master_server_address={self.master_server_address}",
                f"--metadata_server={self.metadata_server}", f"--protocol={self.protocol}",
                f"--global_segment_size={self.segment_bytes}"]
        if self.device_name:
            args.append(f"--device_names={self.device_name}")
        if self.tenant_id:
            args.append(f"--tenant_id={self.tenant_id}")
        return args

    @classmethod
    def from_argv(cls, argv: Sequence[str]) -> SegmentConfig:
        """From a rendered ``mooncake_client --flag=value ...`` line (``argv[0]`` ignored).

        Raises:
            ValueError: an unknown or malformed flag, or a missing required one.
        """
        names = {"host": "host", "port": "port", "master_server_address": "master_server_address",
                 "metadata_server": "metadata_server", "protocol": "protocol",
                 "global_segment_size": "segment_bytes", "device_names": "device_name", "tenant_id": "tenant_id"}
        values: dict[str, Any] = {}
        for arg in argv[1:]:
            flag, sep, value = arg.lstrip("-").partition("=")
            if not arg.startswith("-") or not sep or flag not in names:
                raise ValueError(f"unexpected mooncake_client argument {arg!r}")
            values[names[flag]] = value
        for key in ("port", "segment_bytes"):
            if key in values:
                if not values[key].isdigit():
                    raise ValueError(f"{key} must be a number of bytes/a port, got {values[key]!r}")
                values[key] = int(values[key])
        return cls(**values)


def _die_with_parent() -> None:  # in the child, between fork and exec
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
        except OSError:
            pass


class SegmentSupervisor:
    """Runs one ``mooncake_client`` and keeps it running until :meth:`stop`.

    Args:
        config: the client's flags.
        binary: path of ``mooncake_client`` (:func:`find_client_binary` when None).
        log_path: file receiving the client's output (appended; a temporary file when None).
        backoff_initial / backoff_max: seconds before the first restart / the longest wait between restarts.
        stable_after: a run at least this long resets the backoff.
        poll_interval: how often the monitor thread checks the process.

    Attributes: ``restarts`` (count), ``last_exit`` (return code of the last exit, None before), ``pid``.
    """

    def __init__(self, config: SegmentConfig, *, binary: str | None = None, log_path: Path | None = None,
                 backoff_initial: float = 1.0, backoff_max: float = 30.0, stable_after: float = 30.0,
                 poll_interval: float = 0.2) -> None:
        self.config = config
        self.binary = binary or find_client_binary()
        if log_path is None:
            import tempfile

            handle, name = tempfile.mkstemp(prefix="mooncake-client-", suffix=".log")
            os.close(handle)
            log_path = Path(name)
        self.log_path = Path(log_path)
        self.backoff_initial = backoff_initial
        self.backoff_max = backoff_max
        self.stable_after = stable_after
        self.poll_interval = poll_interval
        self.restarts = 0
        self.last_exit: int | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._started_at = 0.0
        self._log_offset = 0
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    # --- state --------------------------------------------------------------------------------------------

    @property
    def pid(self) -> int | None:
        """Process id of the running client (None when none runs)."""
        proc = self._proc
        return proc.pid if proc is not None and proc.poll() is None else None

    @property
    def running(self) -> bool:
        """Whether a client process is alive right now."""
        return self.pid is not None

    @property
    def supervising(self) -> bool:
        """Whether :meth:`start` ran and :meth:`stop` has not."""
        return self._thread is not None and self._thread.is_alive()

    def log_tail(self, lines: int = 20) -> str:
        """The last ``lines`` lines of the client's log."""
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    # --- lifecycle ----------------------------------------------------------------------------------------

    def _spawn(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log_offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        argv = self.config.argv(self.binary)
        with open(self.log_path, "ab") as handle:
            try:
                self._proc = subprocess.Popen(argv, stdout=handle, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                              start_new_session=True, preexec_fn=_die_with_parent)
            except OSError as exc:
                raise SegmentError(f"cannot start {argv[0]}: {exc}") from None
        self._started_at = time.monotonic()
        log.info("mooncake_client started (pid %s): %d bytes on %s:%s, master %s", self._proc.pid,
                 self.config.segment_bytes, self.config.host, self.config.port, self.config.master_server_address)

    def start(self) -> SegmentSupervisor:
        """Start the client and the monitor thread that restarts it (no-op when already supervising).

        Raises:
            SegmentError: the binary could not be executed.
        """
        with self._lock:
            if self.supervising:
                return self
            self._stopping.clear()
            self._spawn()
            self._thread = threading.Thread(target=self._monitor, name="mooncake-client-supervisor", daemon=True)
            self._thread.start()
        return self

    def _monitor(self) -> None:
        backoff = self.backoff_initial
        while not self._stopping.is_set():
            proc = self._proc
            if proc is not None and proc.poll() is None:
                self._stopping.wait(self.poll_interval)
                continue
            if proc is not None:
                self.last_exit = proc.returncode
                ran = time.monotonic() - self._started_at
                if ran >= self.stable_after:
                    backoff = self.backoff_initial
                log.warning("mooncake_client (pid %s) exited with %s after %.1f s; restarting in %.1f s; log %s:\n%s",
                            proc.pid, proc.returncode, ran, backoff, self.log_path, self.log_tail(5))
                self._proc = None
            if self._stopping.wait(backoff):
                break
            backoff = min(backoff * 2, self.backoff_max)
            with self._lock:
                if self._stopping.is_set():
                    break
                try:
                    self._spawn()
                    self.restarts += 1
                except SegmentError as exc:
                    log.error("mooncake_client restart failed: %s", exc)

    def wait_ready(self, timeout: float = 30.0) -> None:
        """Block until the current client says it serves (its segment is mounted).

        Raises:
            SegmentError: not ready within ``timeout`` seconds, or not supervising (log tail attached).
        """
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.supervising:
                break
            if self.running and self._ready_logged():
                return
            time.sleep(0.05)
        raise SegmentError(f"mooncake_client not ready after {timeout:.0f}s (last exit {self.last_exit}); "
                           f"{self.log_path}:\n{self.log_tail()}")

    def _ready_logged(self) -> bool:
        try:
            with open(self.log_path, "rb") as handle:
                handle.seek(self._log_offset)
                return READY_MARK.encode() in handle.read()
        except OSError:
            return False

    def update(self, config: SegmentConfig) -> bool:
        """Apply new flags: restart the client when they differ (the old segment and its objects go).
        Returns whether it restarted."""
        if config == self.config:
            return False
        supervising = self.supervising
        self.stop()
        self.config = config
        if supervising:
            self.start()
        return True

    def stop(self, grace: float = 10.0) -> None:
        """Stop supervising and stop the client: SIGTERM, wait ``grace`` seconds, then SIGKILL."""
        self._stopping.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(timeout=grace + 5)
        with self._lock:
            proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
        self.last_exit = proc.returncode
        log.info("mooncake_client (pid %s) stopped (%s)", proc.pid, proc.returncode)

    def __enter__(self) -> SegmentSupervisor:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def supervisor_for(config: SegmentConfig | None, current: SegmentSupervisor | None, **kwargs: Any
                   ) -> SegmentSupervisor | None:
    """What a newly applied document asks for: ``config`` None (embedded mode) stops ``current``; otherwise
    ``current`` updated to ``config`` (restarted only when it changed) or a new started supervisor."""
    if config is None:
        if current is not None:
            current.stop()
        return None
    if current is None:
        return SegmentSupervisor(config, **kwargs).start()
    current.update(config)
    if not current.supervising:
        current.start()
    return current


__all__ = ["SegmentConfig", "SegmentError", "SegmentSupervisor", "find_client_binary", "supervisor_for"]
