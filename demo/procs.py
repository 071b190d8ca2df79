"""Child processes of the demo: each in its own process group, logged to a file, stopped as a group.

Every service the demo starts (Redis, the Django server, the Celery worker, the agents) is a
:class:`Service`: started with ``start_new_session=True`` (its own process group, so a Ctrl-C in the terminal
reaches the demo alone and the demo decides the order of shutdown) and with ``PR_SET_PDEATHSIG`` = SIGTERM on
Linux, so a demo that dies without cleaning up (SIGKILL) still takes its children with it. :meth:`Service.stop`
sends SIGTERM to the whole group, waits, then SIGKILLs what is left of the child's session and waits until it is
gone (:func:`end_session`): no orphans, also of children that left the group (``setpgrp``, as vLLM's DP supervisor's
API servers do) but not the session. :meth:`Supervisor.stop_all` signals the agents, the Celery worker and the web
server together and then waits for each (the broker and the Store master stop after them, alone).

A service started with ``restart=True`` (the agents) is restarted by :meth:`Supervisor.check_all` when it dies, as
an init system would (at most ``MAX_RESTARTS`` times within ``RESTART_WINDOW_S``; then the demo stops with its log
tail). An agent resumes from its state directory: its outbox still holds every report it had not delivered.
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
#: A restartable service that dies more than this often within ``RESTART_WINDOW_S`` stops the demo.
MAX_RESTARTS = 5
RESTART_WINDOW_S = 300.0


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
        restart: :meth:`Supervisor.check_all` restarts it when it exits (instead of failing the demo).
    """

    def __init__(self, name: str, argv: Sequence[str], env: Mapping[str, str], log_path: Path,
                 cwd: Path = ROOT, *, restart: bool = False) -> None:
        self.name = name
        self.restart = restart
        self.restarts: list[float] = []  # time.monotonic() of each restart
        self.argv = list(argv)
        self.env = dict(env)
        self.log_path = Path(log_path)
        self.cwd = cwd
        self.proc: subprocess.Popen[bytes] | None = None
        self._stop_deadline: float | None = None  # set by begin_stop: when finish_stop escalates to SIGKILL

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
        """SIGTERM the process group, wait up to ``grace`` seconds, then SIGKILL the group; then SIGKILL what is left
        of the session and wait until it is gone (:func:`end_session`)."""
        self.begin_stop(grace)
        self.finish_stop()

    def begin_stop(self, grace: float = 15.0) -> None:
        """First half of :meth:`stop`: SIGTERM the process group (when it runs) and start its ``grace`` seconds; it
        does not wait, so :meth:`Supervisor.stop_all` signals several services before waiting for any."""
        proc = self.proc
        self._stop_deadline = time.monotonic() + grace
        if proc is not None and proc.poll() is None:
            _signal_group(proc.pid, signal.SIGTERM)

    def finish_stop(self) -> None:
        """Second half of :meth:`stop`: wait until the grace started by :meth:`begin_stop` ends, then SIGKILL the
        group; then end what is left of the session. Raises ``subprocess.TimeoutExpired`` when the process
        outlives SIGKILL by 10 s."""
        proc = self.proc
        if proc is None:
            return
        pgid = proc.pid  # start_new_session: the child leads its own group
        if self._stop_deadline is None:  # without begin_stop: the whole of stop()
            self.begin_stop()
        deadline, self._stop_deadline = self._stop_deadline or time.monotonic(), None
        if proc.poll() is None:
            try:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _signal_group(pgid, signal.SIGKILL)
                proc.wait(timeout=10)
        end_session(pgid, term_wait=0)  # anything the leader left behind in its session


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def session_members(sid: int, proc_root: str | os.PathLike[str] = "/proc") -> list[int]:
    """Pids of the live processes of session ``sid`` (``/proc/<pid>/stat`` field 6); zombies are left out (they
    hold no memory and go when reaped). A child started with ``start_new_session=True`` leads the session whose id
    is its pid; its descendants stay in it unless they call ``setsid`` (a new process group is not enough)."""
    members = []
    try:
        entries = os.scandir(proc_root)
    except OSError:
        return []
    with entries:
        for entry in entries:
            if not entry.name.isdigit():
                continue
            try:
                with open(os.path.join(entry.path, "stat"), "rb") as handle:
                    stat = handle.read()
            except OSError:  # gone meanwhile
                continue
            fields = stat[stat.rfind(b")") + 2:].split()  # the command name may hold spaces and parentheses
            if len(fields) > 3 and fields[0] != b"Z" and int(fields[3]) == sid:
                members.append(int(entry.name))
    return members


def _signal_all(pids: Sequence[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def end_session(sid: int, *, term_wait: float = 10.0, kill_wait: float = 10.0, interval: float = 0.05) -> list[int]:
    """End every process left in session ``sid`` and wait until they are gone; returns the pids still there after
    ``kill_wait`` seconds more (empty: the whole tree is gone).

    With ``term_wait`` > 0 the members get SIGTERM first and up to ``term_wait`` seconds to leave (a vLLM engine
    core shuts down on it); then SIGKILL to each member, repeated until none is left. Safe against pid reuse: a pid
    that is still some process's session id is not given to a new process.
    """
    members = session_members(sid)
    if members and term_wait > 0:
        _signal_all(members, signal.SIGTERM)
        deadline = time.monotonic() + term_wait
        while members and time.monotonic() < deadline:
            time.sleep(interval)
            members = session_members(sid)
    deadline = time.monotonic() + kill_wait
    while members:
        _signal_all(members, signal.SIGKILL)
        if time.monotonic() >= deadline:
            break
        time.sleep(interval)
        members = session_members(sid)
    return members


class Supervisor:
    """The services of one demo run, stopped in reverse start order, each run of services stopped together.

    :meth:`stop_all` goes newest first. Consecutive services started without ``shared`` (the agents, the Celery
    worker, the web server: none needs another of them to stop) are stopped together: each gets SIGTERM, then each
    is waited for with its own grace and SIGKILL (:meth:`Service.begin_stop`, :meth:`Service.finish_stop`), so
    stopping takes as long as the slowest of them, not their sum. A ``shared`` service (the broker, which the
    agents' last outbox delivery needs) and an :meth:`on_stop` callable (the Store master, whose segments the
    agents' store clients unmount on the way out) are each stopped alone, after every newer one is gone.
    """

    def __init__(self) -> None:
        self.services: list[Service] = []
        # (name, stop, the service when it may be stopped together with its neighbours)
        self._stoppers: list[tuple[str, Callable[[], None], Service | None]] = []

    def start(self, service: Service, *, shared: bool = False) -> Service:
        """Start ``service`` and remember it for :meth:`stop_all`; ``shared``: services started later need it
        while they stop (it is stopped after them, alone)."""
        self.services.append(service)
        self._stoppers.append((service.name, service.stop, None if shared else service))
        return service.start()

    def on_stop(self, name: str, stop: Callable[[], None]) -> None:
        """Also run ``stop`` at :meth:`stop_all` (for things that are not a :class:`Service`, e.g. the master), after
        every service started later is gone."""
        self._stoppers.append((name, stop, None))

    def check_all(self, report: Callable[[str], None] = lambda line: print(f"supervisor: {line}", flush=True)) -> None:
        """Restart every exited ``restart=True`` service (``report`` gets one line each); raise
        :class:`DemoError` for the first other service that exited, or one that keeps dying (``MAX_RESTARTS``)."""
        for service in self.services:
            if service.restart and service.proc is not None and service.proc.poll() is not None:
                now = time.monotonic()
                service.restarts = [t for t in service.restarts if now - t < RESTART_WINDOW_S]
                if len(service.restarts) < MAX_RESTARTS:
                    status = service.proc.returncode
                    end_session(service.proc.pid, term_wait=0)  # whatever it left in its session
                    service.restarts.append(now)
                    service.start()
                    report(f"{service.name} exited with status {status}; restarted it (pid {service.pid}, "
                           f"{len(service.restarts)} restart(s) in {RESTART_WINDOW_S:.0f}s)")
                    continue
            service.check()

    def stop_all(self, report: Callable[[str], None] = lambda _: None) -> list[str]:
        """Stop everything, newest first, runs of non-``shared`` services together (see the class); ``report`` gets
        each name as its stop begins. Returns the names whose stop raised (each is still attempted)."""
        failed: list[str] = []
        while self._stoppers:
            group: list[tuple[str, Service]] = []
            while self._stoppers and self._stoppers[-1][2] is not None:
                name, _stop, service = self._stoppers.pop()
                group.append((name, service))  # type: ignore[arg-type]
            if not group:
                name, stop, _ = self._stoppers.pop()
                report(name)
                try:
                    stop()
                except Exception as exc:  # keep stopping the rest
                    failed.append(f"{name}: {type(exc).__name__}: {exc}")
                continue
            begun: list[tuple[str, Service]] = []
            for name, service in group:
                report(name)
                try:
                    service.begin_stop()
                    begun.append((name, service))
                except Exception as exc:
                    failed.append(f"{name}: {type(exc).__name__}: {exc}")
            for name, service in begun:
                try:
                    service.finish_stop()
                except Exception as exc:
                    failed.append(f"{name}: {type(exc).__name__}: {exc}")
        self.services.clear()
        return failed
