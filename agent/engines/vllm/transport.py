"""How the node agent reaches one vLLM instance's KV events: a socket only the instance's account can have made.

Each instance's engine binds ``ipc://kv-events.sock`` in its instance directory (``agent.contract.kv_events``;
vLLM 0.32.0/0.33.0 ``ZmqEventPublisher`` binds ``ipc://`` endpoints). The agent connects one ZMQ SUB per instance,
and only once :func:`open_source` has shown that nobody but the instance's account (or root) could have put the
socket there:

* the directory holding it is a real directory (not a symlink), owned by that account or root, and not writable by
  group or others (nobody else can create, replace or rename an entry in it);
* the socket is a socket (not a symlink), owned by that account.

The check runs on a file descriptor of the directory, and the SUB connects through that descriptor
(``ipc:///proc/self/fd/<fd>/kv-events.sock``), so the directory that was checked is the one connected to, whatever
is renamed meanwhile (and a long instance path cannot exceed the 107 bytes of ``sun_path``). A process of another
account cannot create the socket there (EACCES), so it can neither publish as the instance nor receive its
prompts' tokens; and the engine binds rather than connects, so it never delivers to an endpoint someone else bound.

:class:`EventSource` says where an instance publishes and who must own it (``agent.node.engines`` builds one per
instance from its launch and its account); ``problem`` is set when it cannot be observed at all (a ``tcp://``
endpoint: any local process may bind or connect to it; no launch; an account the node lacks).
"""
from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

#: ``EventSource.status`` / ``Refused.status`` values (also ``InstanceStats.events_status``).
CONNECTED = "connected"   # connected to a socket that passed the ownership check
WAITING = "waiting"       # no socket yet (the engine has not started, or stopped): retried
REFUSED = "refused"       # a socket or directory someone else could have made: not connected, retried, flagged
INSECURE = "insecure"     # the instance publishes where the agent cannot prove who publishes (tcp): flagged
UNOBSERVED = "unobserved"  # nothing to connect to (no launch, no account): flagged


@dataclass(frozen=True)
class EventSource:
    """Where one instance's engine publishes its KV events.

    ``socket_path``: the ipc socket (absolute; None when there is none to connect to); ``owner_uid``: the uid that
    must own it (the instance's account; set whenever the account is known, even when there is no socket to
    observe: the observer also checks that the instance's ``/metrics`` listener belongs to it); ``endpoint``: what
    the instance's launch renders (for reports);
    ``status``/``problem``: set (``INSECURE``, ``UNOBSERVED``) when the instance cannot be observed, "" otherwise.
    """

    endpoint: str
    socket_path: Path | None = None
    owner_uid: int | None = None
    status: str = ""
    problem: str = ""


class Refused(Exception):
    """The socket cannot be connected to (yet); ``status`` is ``WAITING`` or ``REFUSED``."""

    def __init__(self, status: str, message: str) -> None:
        super().__init__(message)
        self.status = status


class OpenSource:
    """A checked instance directory, held open: :attr:`endpoint` is the ZMQ endpoint through its descriptor.

    :meth:`recheck` repeats the checks (and that the path still names the directory held); :meth:`close` releases
    the descriptor (after the SUB socket closed)."""

    def __init__(self, source: EventSource, dir_fd: int) -> None:
        self.source = source
        self.dir_fd = dir_fd
        assert source.socket_path is not None
        self.endpoint = f"ipc:///proc/self/fd/{dir_fd}/{source.socket_path.name}"
        info = os.fstat(dir_fd)
        self._dir_id = (info.st_dev, info.st_ino)

    def replay_endpoint(self) -> str | None:
        """The ZMQ endpoint of the instance's replay socket (``agent.contract.kv_events.KV_EVENTS_REPLAY_SOCKET``)
        through the checked directory, when one is there and passes the same ownership check; None otherwise (an
        engine rendered without one, or not yet bound)."""
        from agent.contract.kv_events import KV_EVENTS_REPLAY_SOCKET

        path = self.source.socket_path
        assert path is not None
        try:
            check_socket(self.dir_fd, path.with_name(KV_EVENTS_REPLAY_SOCKET), self.source.owner_uid)
        except Refused:
            return None
        return f"ipc:///proc/self/fd/{self.dir_fd}/{KV_EVENTS_REPLAY_SOCKET}"

    def recheck(self) -> None:
        """Raise :class:`Refused` when the directory path names another directory now (rewritten: reconnect), or
        the directory or the socket fail the ownership checks."""
        path = self.source.socket_path
        assert path is not None
        try:
            info = os.stat(path.parent, follow_symlinks=False)
        except OSError as exc:
            raise Refused(WAITING, f"instance directory {path.parent}: {exc.strerror or exc}") from None
        if (info.st_dev, info.st_ino) != self._dir_id:
            raise Refused(WAITING, f"instance directory {path.parent} was replaced")
        check_socket(self.dir_fd, path, self.source.owner_uid)

    def close(self) -> None:
        """Release the directory descriptor (idempotent)."""
        if self.dir_fd >= 0:
            os.close(self.dir_fd)
            self.dir_fd = -1


def check_socket(dir_fd: int, path: Path, owner_uid: int | None) -> None:
    """The ownership proof on an open directory ``dir_fd`` (module docstring). Raises :class:`Refused`
    (``WAITING``: no socket there yet; ``REFUSED``: someone else's socket or a directory others can write)."""
    if owner_uid is None:
        raise Refused(REFUSED, "no account to expect as the socket's owner")
    info = os.fstat(dir_fd)
    if not stat.S_ISDIR(info.st_mode):
        raise Refused(REFUSED, f"{path.parent} is not a directory")
    if info.st_uid not in (owner_uid, 0):
        raise Refused(REFUSED, f"directory {path.parent} belongs to uid {info.st_uid}, not to the instance's "
                               f"account (uid {owner_uid}) or root")
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise Refused(REFUSED, f"directory {path.parent} is writable by group or others (mode "
                               f"{stat.S_IMODE(info.st_mode):04o}): anyone could put a socket there")
    try:
        sock = os.stat(path.name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        raise Refused(WAITING, f"no socket {path} yet (the engine has not bound it)") from None
    except OSError as exc:
        raise Refused(REFUSED, f"socket {path}: {exc.strerror or exc}") from None
    if not stat.S_ISSOCK(sock.st_mode):
        raise Refused(REFUSED, f"{path} is not a socket")
    if sock.st_uid != owner_uid:
        raise Refused(REFUSED, f"socket {path} belongs to uid {sock.st_uid}, not to the instance's account "
                               f"(uid {owner_uid}): another process bound it")


def open_source(source: EventSource) -> OpenSource:
    """Open and check the directory of ``source``'s socket; the caller connects to ``.endpoint`` and closes it.

    Raises:
        Refused: ``WAITING`` (no directory or socket yet) or ``REFUSED`` (ownership, see :func:`check_socket`),
            or the source's own status when it names a problem (``INSECURE``, ``UNOBSERVED``).
    """
    if source.problem or source.socket_path is None:
        raise Refused(source.status or UNOBSERVED, source.problem or "no socket to connect to")
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        dir_fd = os.open(source.socket_path.parent, flags)
    except FileNotFoundError:
        raise Refused(WAITING, f"no instance directory {source.socket_path.parent} yet") from None
    except OSError as exc:
        raise Refused(REFUSED, f"instance directory {source.socket_path.parent}: {exc.strerror or exc}") from None
    try:
        check_socket(dir_fd, source.socket_path, source.owner_uid)
        return OpenSource(source, dir_fd)
    except BaseException:
        os.close(dir_fd)
        raise




def launch_source(instance: object, instance_dir: Path | None, owner_uid: int | None,
                  account_problem: str = "") -> EventSource:
    """The :class:`EventSource` of an ``InstanceSpec`` (duck-typed: ``.launch.argv``) whose directory is
    ``instance_dir`` and whose account has ``owner_uid`` (None with ``account_problem``: it has none here).

    ``ipc://<relative path>`` is taken relative to ``instance_dir`` (the engine's working directory),
    ``ipc:///absolute`` as it is; a ``tcp://`` endpoint is ``INSECURE`` (any local process can bind the port
    first, or connect and publish); no launch or no ``--kv-events-config`` is ``UNOBSERVED``.
    """
    from agent.contract.kv_events import launch_events_endpoint

    launch = getattr(instance, "launch", None)
    endpoint = launch_events_endpoint(launch.argv) if launch is not None else None
    uid = None if account_problem else owner_uid
    if endpoint is None:
        return EventSource("", owner_uid=uid, status=UNOBSERVED, problem="its launch renders no KV-event endpoint "
                                                                         "(no --kv-events-config): nothing to observe")
    if not endpoint.startswith("ipc://"):
        return EventSource(endpoint, owner_uid=uid, status=INSECURE, problem=(
            f"its launch publishes KV events at {endpoint}: any local process could bind that endpoint first "
            "and read every prompt's tokens, or publish as the instance; not observed (re-render the instance: "
            "the registry renders ipc://kv-events.sock in the instance directory)"))
    path = Path(endpoint[len("ipc://"):])
    if not path.is_absolute():
        if instance_dir is None:
            return EventSource(endpoint, owner_uid=uid, status=UNOBSERVED,
                               problem="no instance directory to find its socket in")
        path = Path(os.path.abspath(instance_dir / path))
    if account_problem:
        return EventSource(endpoint, path, None, status=UNOBSERVED, problem=account_problem)
    return EventSource(endpoint, path, owner_uid)


__all__ = ["CONNECTED", "INSECURE", "REFUSED", "UNOBSERVED", "WAITING", "EventSource", "OpenSource", "Refused",
           "check_socket", "launch_source", "open_source"]
