"""Who owns what on a node: the agent's privileges and the accounts engine instances run as (README "Users and
permissions on a node").

* The agent runs as root, or with ``CAP_CHOWN``, ``CAP_DAC_OVERRIDE`` and ``CAP_FOWNER`` (:func:`privileged`). Its
  state directory is 0700 (0711 when the instance root lies inside it, so engines can reach their directories), its
  files 0600, its umask 077 (:func:`restrict_umask`).
* Each engine instance runs as the unprivileged account its launch names (``LaunchSpec.user``: the tenant's
  engine account in the registry). The agent chowns the instance's directory to that account (0700; files 0600,
  ``launch.sh`` 0700), and accepts KV events only from a socket that account made there
  (``agent.engines.vllm.transport``).
* Only a regular account may be an engine account (:func:`resolve_account`, :class:`EngineAccountRules`): not root,
  not a system account (uid outside ``UID_MIN``..``UID_MAX`` of ``/etc/login.defs``, or the agent's
  ``--min-engine-uid``/``--max-engine-uid``), not the agent's own account and not an account of the control plane
  (``CONTROL_PLANE_ACCOUNTS``: the users of ``deploy/systemd``), by name or by uid. An instance whose launch names
  another is given to no account and not observed; the agent's ``errors`` and the instance's ``events_problem``
  say why.
* An agent that is not privileged (tests, demos, a developer's machine) cannot give files away: every instance's
  account is then the agent's own (:func:`resolve_account` answers with ``fallback=True``; the agent logs it once
  and reports ``single_user`` in its heartbeats). The checks still hold everyone else out, but instances no longer
  hold each other out.

No Django here.
"""
from __future__ import annotations

import logging
import os
import pwd
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("kvpool.agent.accounts")

#: Capability bits (``linux/capability.h``) a non-root agent needs: give files away, read and replace engines' files.
CAP_CHOWN, CAP_DAC_OVERRIDE, CAP_FOWNER = 0, 1, 3
#: umask of the agent process: nothing it creates is readable by group or others.
AGENT_UMASK = 0o077
#: Mode of the state directory (``STATE_DIR_TRAVERSABLE`` when the instance root is inside it).
STATE_DIR_MODE = 0o700
STATE_DIR_TRAVERSABLE = 0o711
#: Mode of the instance root: engines may traverse it to reach their own directory, nobody may list it.
INSTANCE_ROOT_MODE = 0o711


#: Accounts of the control plane (the ``User=`` of ``deploy/systemd``: dashboard, worker, beat and migrate run as
#: ``kvpool``, the master as ``kvpool-master``; ``kvpool-engine-unassigned`` is the engine template's placeholder).
#: No engine runs as one of them, nor as an account sharing a uid with one.
CONTROL_PLANE_ACCOUNTS = ("kvpool", "kvpool-master", "kvpool-engine-unassigned")
#: Where the lowest and highest uid of a regular account are read (``UID_MIN``, ``UID_MAX``).
LOGIN_DEFS = Path("/etc/login.defs")
#: ``UID_MIN`` and ``UID_MAX`` when ``/etc/login.defs`` does not say (shadow-utils' defaults).
DEFAULT_UID_MIN, DEFAULT_UID_MAX = 1000, 60000


def login_defs_uid_range(path: Path = LOGIN_DEFS) -> tuple[int, int]:
    """``(UID_MIN, UID_MAX)`` of ``path`` (login.defs syntax: ``NAME value`` lines, ``#`` comments), each
    ``DEFAULT_UID_MIN``/``DEFAULT_UID_MAX`` when the file is unreadable or does not set it to a number."""
    values = {"UID_MIN": DEFAULT_UID_MIN, "UID_MAX": DEFAULT_UID_MAX}
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return DEFAULT_UID_MIN, DEFAULT_UID_MAX
    for line in lines:
        parts = line.split()
        if len(parts) >= 2 and parts[0] in values and parts[1].isdigit():
            values[parts[0]] = int(parts[1])
    return values["UID_MIN"], values["UID_MAX"]


@dataclass(frozen=True)
class EngineAccountRules:
    """Which accounts may be an engine account: uids ``min_uid``..``max_uid`` (None: ``UID_MIN``/``UID_MAX`` of
    ``/etc/login.defs``, read when checked), never uid 0, the agent's own uid, nor a name of ``refused_names`` or a
    uid one of them has on this node."""

    min_uid: int | None = None
    max_uid: int | None = None
    refused_names: tuple[str, ...] = CONTROL_PLANE_ACCOUNTS

    def uid_range(self) -> tuple[int, int]:
        """``(lowest, highest)`` uid an engine account may have: ``min_uid``/``max_uid``, else login.defs'."""
        if self.min_uid is not None and self.max_uid is not None:
            return self.min_uid, self.max_uid
        low, high = login_defs_uid_range()
        return (low if self.min_uid is None else self.min_uid), (high if self.max_uid is None else self.max_uid)

    def problem(self, name: str, uid: int) -> str | None:
        """Why the account ``name`` (uid ``uid``) must not be an engine account, else None."""
        if uid == 0:
            return f"account {name!r} is root: engines must run unprivileged"
        if uid == os.geteuid():
            return (f"account {name!r} is the agent's own account (uid {uid}): an engine running as it could "
                    "read the agent's state and every instance's files")
        for other in self.refused_names:
            if name == other or uid == _uid_of(other):
                return (f"account {name!r} is {'' if name == other else f'(by uid {uid}) '}the control plane's "
                        f"account {other!r}: engines must not run as it")
        low, high = self.uid_range()
        if not low <= uid <= high:
            return (f"account {name!r} is a system account (uid {uid} outside {low}..{high}: UID_MIN..UID_MAX of "
                    "/etc/login.defs, or the agent's --min-engine-uid/--max-engine-uid): engines run as a regular "
                    "account of their tenant")
        return None


def _uid_of(name: str) -> int | None:
    try:
        return pwd.getpwnam(name).pw_uid
    except KeyError:
        return None


class AccountError(ValueError):
    """An instance names an account this node does not have; the message says which."""


@dataclass(frozen=True)
class Account:
    """The account an instance runs as on this node: ``name`` as its launch names it (``""`` when it names none),
    ``uid``/``gid`` to chown to and to expect as the owner of its socket; ``fallback`` when the agent is not
    privileged and uses its own uid instead."""

    name: str
    uid: int
    gid: int
    fallback: bool = False


def _effective_caps() -> int | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("CapEff:"):
                return int(line.split()[1], 16)
    except (OSError, ValueError, IndexError):
        return None
    return None


def privileged() -> bool:
    """Whether this process can give instance directories to other accounts and read them back: root, or the
    capabilities ``CAP_CHOWN``, ``CAP_DAC_OVERRIDE`` and ``CAP_FOWNER`` (``/proc/self/status`` ``CapEff``)."""
    caps = _effective_caps()
    if caps is None:
        return os.geteuid() == 0
    need = (1 << CAP_CHOWN) | (1 << CAP_DAC_OVERRIDE) | (1 << CAP_FOWNER)
    return caps & need == need


def agent_account() -> Account:
    """The agent's own account (what every instance gets when the agent is not privileged)."""
    uid = os.geteuid()
    try:
        name = pwd.getpwuid(uid).pw_name
    except KeyError:
        name = str(uid)
    return Account(name=name, uid=uid, gid=os.getegid(), fallback=True)


def resolve_account(name: str, *, is_privileged: bool | None = None,
                    rules: EngineAccountRules | None = None) -> Account:
    """The account an instance whose launch names ``name`` runs as.

    Privileged agent: the named account of this node's password database (``pwd``), when ``rules`` (default
    :class:`EngineAccountRules`: login.defs range, ``CONTROL_PLANE_ACCOUNTS``) allow it; an empty name is refused
    too (an instance must not share root's or the agent's files). Unprivileged agent: the agent's own account,
    ``fallback=True``, whatever the launch names.

    Raises:
        AccountError: privileged, and ``name`` is empty, unknown on this node, or an account ``rules`` refuse
        (root, a system account, the agent's own, the control plane's); the message says which.
    """
    if not (privileged() if is_privileged is None else is_privileged):
        return agent_account()
    if not name:
        raise AccountError("its launch names no account to run as (the registry renders the tenant's engine "
                           "account; an older dashboard does not): not given to any account")
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        raise AccountError(f"account {name!r} does not exist on this node (create it: useradd --no-create-home "
                           f"--shell /usr/sbin/nologin {name})") from None
    problem = (rules or EngineAccountRules()).problem(name, entry.pw_uid)
    if problem:
        raise AccountError(problem)
    return Account(name=name, uid=entry.pw_uid, gid=entry.pw_gid)


def restrict_umask() -> int:
    """Set the process umask to ``AGENT_UMASK`` (077); returns the previous one."""
    return os.umask(AGENT_UMASK)


def secure_state_dir(path: Path, *, traversable: bool = False) -> None:
    """Make the state directory ``path`` the agent's alone: mode 0700 (0711 with ``traversable``: the instance root
    is inside it), and every regular file directly in it 0600.

    Raises:
        OSError: the directory cannot be changed (not the agent's).
    """
    os.chmod(path, STATE_DIR_TRAVERSABLE if traversable else STATE_DIR_MODE)
    for entry in os.scandir(path):
        if entry.is_file(follow_symlinks=False) and entry.stat(follow_symlinks=False).st_mode & 0o077:
            os.chmod(entry.path, 0o600)


def private_file(path: Path) -> None:
    """Create ``path`` (empty) when missing and make it 0600: the agent's alone. SQLite gives a database's ``-wal``
    and ``-shm`` files the database file's mode, so calling this before ``sqlite3.connect`` covers them too."""
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600))
    os.chmod(path, 0o600)


def secret_file_problem(path: Path) -> str | None:
    """Why the node's signing secret file ``path`` must not be used, else None: it is readable or writable by
    group or others (whoever reads it can sign documents for this node and read its encrypted queue), or it
    belongs to another account than the agent's or root (that account could replace it). ``chmod 600`` fixes
    the first."""
    info = os.stat(path)
    if info.st_mode & 0o077:
        return (f"{path} is readable or writable by group or others (mode {info.st_mode & 0o7777:04o}): "
                f"chmod 600 {path}")
    if info.st_uid not in (os.geteuid(), 0):
        return f"{path} belongs to uid {info.st_uid}, not to the agent (uid {os.geteuid()}) or root"
    return None


def inside(child: Path, parent: Path) -> bool:
    """Whether ``child`` is ``parent`` or below it (both made absolute, not resolved)."""
    child, parent = Path(os.path.abspath(child)), Path(os.path.abspath(parent))
    return child == parent or parent in child.parents


__all__ = ["AGENT_UMASK", "CONTROL_PLANE_ACCOUNTS", "INSTANCE_ROOT_MODE", "Account", "AccountError",
           "EngineAccountRules", "agent_account", "inside", "login_defs_uid_range", "private_file", "privileged",
           "resolve_account", "restrict_umask", "secret_file_problem", "secure_state_dir"]
