"""Child processes of the demo: each in its own process group, logged to a file, stopped as a group.

Every service the demo starts (Redis, the Django server, the Celery worker, the agents) is a
:class:`Service`: started with ``start_new_session=True`` (its own process group, so a Ctrl-C in the terminal
reaches the demo alone and the demo decides the order of shutdown) and with ``PR_SET_PDEATHSIG`` = SIGTERM on
Linux, so a demo that dies without cleaning up (SIGKILL) still takes its children with it. :meth:`Service.stop`
sends SIGTERM to the whole group, waits, then SIGKILLs the group: no orphans.
"""
from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
_PR_SET_PDEATHSIG = 1


class DemoError(RuntimeError):
    """A step of the demo failed; the message says which and why (with a log tail where one helps)."""


def _die_with_parent() -> None:  # runs in the child between fork and exec
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
        except OSError:
            pass


class Service:
    """One child process (and its process group).

    Args:
        name: label used in messages (``"celery"``, ``"agent node-a"``).
        argv: the command.
        env: its complete environment.
        log_path: file receiving its stdout and stderr (appended).
        cwd: working directory (the repository root by default).
    """

    def __init__(self, name: str, argv: Sequence[str], env: Mapping[str, str], log_path: Path,
                 cwd: Path = ROOT) -> None:
        self.name = name
        self.argv = list(argv)
        self.env = dict(env)
        self.log_path = Path(log_path)
        self.cwd = cwd
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Service:
        """Start the process in a new session (process group).

        Raises:
            DemoError: the executable could not be started.
        """
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as handle:
            try:
                self.proc = subprocess.Popen(self.argv, cwd=self.cwd, env=self.env, stdout=handle,
                                             stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                             start_new_session=True, preexec_fn=_die_with_parent)
            except OSError as exc:
                raise DemoError(f"{self.name}: cannot start {self.argv[0]}: {exc}") from None
        return self

    @property
    def pid(self) -> int | None:
        """Process id (None before start)."""
        return self.proc.pid if self.proc else None

    @property
    def alive(self) -> bool:
        """Whether the process runs."""
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self, lines: int = 20) -> str:
        """The last ``lines`` lines of the log."""
        if not self.log_path.exists():
            return ""
        text = self.log_path.read_text(errors="replace").splitlines()
        return "\n".join(text[-lines:])

    def log_text(self) -> str:
        """The whole log ("" before the first line)."""
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def check(self) -> None:
        """Raise :class:`DemoError` (with the log tail) when the process has exited."""
        if self.proc is not None and self.proc.poll() is not None:
            raise DemoError(f"{self.name} exited with status {self.proc.returncode}; last lines of "
                            f"{self.log_path}:\n{self.log_tail()}")

    def wait_until(self, predicate: Callable[[], object], timeout: float, what: str, interval: float = 0.2) -> object:
        """Poll ``predicate`` until truthy, failing early when this process exits.

        Raises:
            DemoError: the process exited or ``timeout`` seconds passed.
        """
        deadline = time.monotonic() + timeout
        while True:
            value = predicate()
            if value:
                return value
            self.check()
            if time.monotonic() > deadline:
                raise DemoError(f"{self.name}: timed out after {timeout:.0f}s waiting for {what}; last lines of "
                                f"{self.log_path}:\n{self.log_tail()}")
            time.sleep(interval)

    def stop(self, grace: float = 15.0) -> None:
        """SIGTERM the process group, wait up to ``grace`` seconds, then SIGKILL the group."""
        proc = self.proc
        if proc is None:
            return
        pgid = proc.pid  # start_new_session: the child leads its own group
        if proc.poll() is None:
            _signal_group(pgid, signal.SIGTERM)
            try:
                proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                _signal_group(pgid, signal.SIGKILL)
                proc.wait(timeout=10)
        _signal_group(pgid, signal.SIGKILL)  # anything the leader left behind in its group


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


class Supervisor:
    """The services of one demo run, stopped in reverse start order."""

    def __init__(self) -> None:
        self.services: list[Service] = []
        self._stoppers: list[tuple[str, Callable[[], None]]] = []

    def start(self, service: Service) -> Service:
        """Start ``service`` and remember it for :meth:`stop_all`."""
        self.services.append(service)
        self._stoppers.append((service.name, service.stop))
        return service.start()

    def on_stop(self, name: str, stop: Callable[[], None]) -> None:
        """Also run ``stop`` at :meth:`stop_all` (for things that are not a :class:`Service`, e.g. the master)."""
        self._stoppers.append((name, stop))

    def check_all(self) -> None:
        """Raise :class:`DemoError` for the first service that exited."""
        for service in self.services:
            service.check()

    def stop_all(self, report: Callable[[str], None] = lambda _: None) -> list[str]:
        """Stop everything, newest first; returns the names whose stop raised (each is still attempted)."""
        failed: list[str] = []
        while self._stoppers:
            name, stop = self._stoppers.pop()
            report(name)
            try:
                stop()
            except Exception as exc:  # keep stopping the rest
                failed.append(f"{name}: {type(exc).__name__}: {exc}")
        self.services.clear()
        return failed
