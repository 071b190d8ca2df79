"""Instance directories on the node: one ``<root>/<instance_id>/`` per engine instance of the applied document.

Each directory holds what starting the instance needs, rendered by the control plane
(``tenants.rendering.RenderedConfig.launch_spec()``, JSON form ``LaunchSpec.to_dict()``):

* the rendered files (vLLM: ``mooncake.json``, the ``MOONCAKE_CONFIG_PATH`` document),
* ``launch.json`` — ``{"instance_id", "argv", "env", "cwd", "user"}`` with every path variable resolved,
* ``env`` — the environment as a systemd ``EnvironmentFile`` (``NAME="value"``, double-quoted; ``\\``, ``"``,
  ``$`` and backquote escaped with a backslash, newlines kept), which a POSIX shell can also source,
* ``launch.sh`` — ``#!/bin/sh``, ``set -e``, ``umask 077``, the uid check, ``cd`` into the directory, one
  ``export NAME='value'`` per variable and ``exec`` of the
  command with every argument shell-quoted. An ``argv[0]`` of ``python`` (``ENGINE_PYTHON``) stands for the
  engine's interpreter and runs as ``"${KVPOOL_ENGINE_PYTHON:-python3}"``, so one rendered launch serves
  whatever venv the node installed the engine into.

Variables of ``file_env`` (``{"MOONCAKE_CONFIG_PATH": "mooncake.json"}``) get the absolute path of that file in
the final directory. Each directory is written into a temporary directory beside it (files and directory
fsynced), then swapped in with one ``renameat2(RENAME_EXCHANGE)`` where the kernel has it (else: old one renamed
aside, new one renamed in), so a reader sees the old or the new directory, never a half-written one. An
unchanged directory is left alone. Directories under ``root`` that hold a ``launch.json`` but whose instance is
no longer in the document are removed (nothing else under ``root`` is touched), as are temporaries left by a
crash.

Ownership and modes (README "Users and permissions on a node", ``agent.node.accounts``): the root is 0711 (engines
traverse it, nobody lists it); each instance directory is 0700 and, with its files, belongs to the instance's
account (``accounts``: chowned when the agent is privileged), ``launch.sh`` 0700, every other file 0600 — they hold
the release's ``PYTHONHASHSEED``, which lets whoever reads it forge the instance's block hashes. ``launch.sh``
sets ``umask 077``, refuses to run under any other uid than the account's, and changes into its directory, where
the engine binds its KV-event socket (``agent.contract.kv_events``); ``launch.json`` names that ``cwd`` and the
``user``. The socket an engine bound is carried into a rewritten directory, so a running engine stays reachable.
An instance whose account cannot be resolved gets a directory the agent keeps for itself and a ``launch.sh`` that
refuses to start, saying why.

No Django here (the node agent runs without it).
"""
from __future__ import annotations

import ctypes
import errno
import json
import os
import re
import shlex
import shutil
import stat
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from agent.node.accounts import INSTANCE_ROOT_MODE, Account, AccountError

#: ``argv[0]`` that stands for the engine environment's Python interpreter (``tenants.rendering.ENGINE_PYTHON``).
ENGINE_PYTHON = "python"
#: The interpreter ``launch.sh`` runs in place of ``ENGINE_PYTHON``: ``$KVPOOL_ENGINE_PYTHON``, else ``python3``.
ENGINE_PYTHON_SHELL = '"${KVPOOL_ENGINE_PYTHON:-python3}"'
#: Files this module writes in every instance directory (rendered files may not use these names).
LAUNCH_JSON, ENV_FILE, LAUNCH_SH = "launch.json", "env", "launch.sh"
_OWN_FILES = (LAUNCH_JSON, ENV_FILE, LAUNCH_SH)
_ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_TMP_MARK = ".kvpool-tmp-"
#: Modes inside an instance directory: the directory, ``launch.sh``, every other file.
DIR_MODE, SCRIPT_MODE, FILE_MODE = 0o700, 0o700, 0o600
_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


class InstanceDirError(ValueError):
    """A launch that cannot be written as an instance directory (bad id, name, value); says which and why."""


class LaunchLike(Protocol):
    """What :func:`write_instance_dirs` needs of an instance (``tenants.rendering.LaunchSpec`` has it);
    ``file_env`` is optional."""

    @property
    def instance_id(self) -> str: ...

    @property
    def argv(self) -> Sequence[str]: ...

    @property
    def env(self) -> Mapping[str, str]: ...

    @property
    def files(self) -> Mapping[str, str]: ...


@dataclass(frozen=True)
class InstanceLaunch:
    """The agent's copy of a rendered launch (the JSON form of ``tenants.rendering.LaunchSpec``).

    ``instance_id`` names the directory; ``argv`` (``argv[0] == "python"`` = the engine interpreter); ``env``
    (plain values); ``file_env`` (variable -> name of one of ``files``, resolved to its absolute path);
    ``files`` (file name -> text); ``user`` (the account it runs as, "" = none named). :meth:`from_value` checks
    everything :func:`write_instance_dirs` relies on.
    """

    instance_id: str
    argv: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    file_env: Mapping[str, str] = field(default_factory=dict)
    files: Mapping[str, str] = field(default_factory=dict)
    user: str = ""

    @classmethod
    def from_value(cls, value: LaunchLike | Mapping[str, Any]) -> InstanceLaunch:
        """From a ``LaunchSpec``-like object or its dict form.

        Raises:
            InstanceDirError: a missing member, an unsafe id or file name, a bad variable name, a value with a
                NUL byte, a ``file_env`` entry naming no file.
        """
        get = value.get if isinstance(value, Mapping) else (lambda name, default=None: getattr(value, name, default))
        instance_id = get("instance_id")
        argv = get("argv")
        if not isinstance(instance_id, str) or not instance_id or instance_id.startswith(".") or "/" in instance_id \
                or "\0" in instance_id:
            raise InstanceDirError(f"instance id {instance_id!r}: must be a non-empty name without '/', not "
                                   "starting with '.'")
        if argv is None or isinstance(argv, (str, bytes)) or not list(argv):
            raise InstanceDirError(f"instance {instance_id}: argv must be a non-empty list of strings")
        argv = tuple(argv)
        env = dict(get("env", None) or {})
        file_env = dict(get("file_env", None) or {})
        files = dict(get("files", None) or {})
        for arg in argv:
            if not isinstance(arg, str) or "\0" in arg:
                raise InstanceDirError(f"instance {instance_id}: argument {arg!r} is not a string without NUL")
        for name, text in {**env, **file_env}.items():
            if not isinstance(name, str) or not _ENV_NAME_RE.fullmatch(name):
                raise InstanceDirError(f"instance {instance_id}: invalid environment variable name {name!r}")
            if not isinstance(text, str) or "\0" in text:
                raise InstanceDirError(f"instance {instance_id}: {name} must be a string without NUL")
        for name, content in files.items():
            if (not isinstance(name, str) or not name or name.startswith(".") or "/" in name or "\0" in name
                    or name in _OWN_FILES):
                raise InstanceDirError(f"instance {instance_id}: invalid file name {name!r} (no '/', not hidden, "
                                       f"not one of {', '.join(_OWN_FILES)})")
            if not isinstance(content, str):
                raise InstanceDirError(f"instance {instance_id}: content of {name} must be text")
        for var, name in file_env.items():
            if name not in files:
                raise InstanceDirError(f"instance {instance_id}: {var} names {name!r}, which is not one of its files")
        user = get("user", "") or ""
        if not isinstance(user, str) or "\0" in user or "/" in user:
            raise InstanceDirError(f"instance {instance_id}: user {user!r} is not an account name")
        return cls(instance_id=instance_id, argv=argv, env=env, file_env=file_env, files=files, user=user)

    def resolved_env(self, directory: Path) -> dict[str, str]:
        """``PRIVATE_ENV``, then ``env``, plus each ``file_env`` variable set to the absolute path of its file in
        ``directory``."""
        directory = Path(os.path.abspath(directory))
        return {**PRIVATE_ENV, **self.env, **{var: str(directory / name) for var, name in self.file_env.items()}}


#: Set in every instance's environment (a rendered ``env`` may override it). vLLM 0.32.0/0.33.0 puts its ZMQ ``ipc://``
#: sockets under ``VLLM_RPC_BASE_PATH`` (default the system temp directory), among them the MooncakeStoreConnector's
#: lookup socket ``lookup_rpc_port_<n>_host_<hostname>_dp_rank<r>``, which is the same path for every instance of a
#: host: two instances then answered each other's Store lookups (seen here: every hit of one loaded 0 tokens while
#: another engine ran), across tenants too. ``.`` is the instance directory (``launch.sh`` changes into it; its
#: processes inherit it), private to the instance's account, and keeps the socket paths short (a unix socket path
#: holds at most 107 bytes).
PRIVATE_ENV = {"VLLM_RPC_BASE_PATH": "."}


def env_file_line(name: str, value: str) -> str:
    """``NAME="value"`` as systemd's ``EnvironmentFile`` and a POSIX shell both read it back exactly."""
    escaped = re.sub(r'([\\"$`])', r"\\\1", value)
    return f'{name}="{escaped}"'


def env_file(env: Mapping[str, str]) -> str:
    """The ``env`` file: one :func:`env_file_line` per variable, sorted by name."""
    return "".join(env_file_line(name, value) + "\n" for name, value in sorted(env.items()))


def exec_line(argv: Sequence[str]) -> str:
    """``exec`` of ``argv`` with every argument shell-quoted; ``argv[0] == "python"`` runs the engine
    interpreter ``"${KVPOOL_ENGINE_PYTHON:-python3}"``."""
    head = ENGINE_PYTHON_SHELL if argv[0] == ENGINE_PYTHON else shlex.quote(argv[0])
    return " ".join(["exec", head, *(shlex.quote(arg) for arg in argv[1:])])


def launch_script(launch: InstanceLaunch, directory: Path, account: Account | AccountError | None = None) -> str:
    """``launch.sh`` of ``launch`` for the instance directory ``directory`` (its final path): ``umask 077``, a check
    that it runs as ``account``'s uid, ``cd`` into ``directory`` (the engine binds its KV-event socket there), the
    environment, ``exec``. With an ``AccountError`` it only says why the instance cannot start and exits 1."""
    head = ["#!/bin/sh", f"# kvpool instance {launch.instance_id}: written by agent.node.instance_dirs; "
            "KVPOOL_ENGINE_PYTHON picks the engine interpreter", "set -e", "umask 077"]
    if isinstance(account, AccountError):
        why = f"kvpool: instance {launch.instance_id} cannot start on this node: {account}"
        return "\n".join([*head, f"echo {shlex.quote(why)} >&2", "exit 1"]) + "\n"
    lines = list(head)
    if account is not None:
        why = (f"kvpool: instance {launch.instance_id} runs as {account.name or account.uid} (uid {account.uid}), "
               "not as uid $(id -u)")
        lines.append(f'[ "$(id -u)" = {account.uid} ] || {{ echo "{why}" >&2; exit 1; }}')
    lines.append(f"cd {shlex.quote(str(directory))}")
    lines += [f"export {name}={shlex.quote(value)}" for name, value in sorted(launch.resolved_env(directory).items())]
    lines.append(exec_line(launch.argv))
    return "\n".join(lines) + "\n"


def _contents(launch: InstanceLaunch, directory: Path,
              account: Account | AccountError | None = None) -> dict[str, tuple[str, int]]:
    """File name -> (text, mode) of the instance directory."""
    env = launch.resolved_env(directory)
    document = {"instance_id": launch.instance_id, "argv": list(launch.argv), "env": env,
                "cwd": str(directory), "user": launch.user}
    out = {name: (text, FILE_MODE) for name, text in launch.files.items()}
    out[LAUNCH_JSON] = (json.dumps(document, indent=2, sort_keys=True, ensure_ascii=False) + "\n", FILE_MODE)
    out[ENV_FILE] = (env_file(env), FILE_MODE)
    out[LAUNCH_SH] = (launch_script(launch, directory, account), SCRIPT_MODE)
    return out


def _owner(account: Account | AccountError | None) -> tuple[int, int]:
    """``(uid, gid)`` the instance directory and its files get: the account's; the agent's own without one."""
    if isinstance(account, Account):
        return account.uid, account.gid
    return os.geteuid(), os.getegid()


def _sockets(directory: Path) -> list[str]:
    """Names of the sockets directly in ``directory`` (an engine's KV-event socket)."""
    try:
        return sorted(entry.name for entry in os.scandir(directory)
                      if stat.S_ISSOCK(entry.stat(follow_symlinks=False).st_mode))
    except OSError:
        return []


def _unchanged(directory: Path, contents: Mapping[str, tuple[str, int]], owner: tuple[int, int]) -> bool:
    try:
        info = os.lstat(directory)
        if not stat.S_ISDIR(info.st_mode) or stat.S_IMODE(info.st_mode) != DIR_MODE \
                or (info.st_uid, info.st_gid) != owner:
            return False
        sockets = set(_sockets(directory))
        if sorted(p.name for p in directory.iterdir() if p.name not in sockets) != sorted(contents):
            return False
        for name, (text, mode) in contents.items():
            path = directory / name
            entry = os.lstat(path)
            if (not stat.S_ISREG(entry.st_mode) or stat.S_IMODE(entry.st_mode) != mode
                    or (entry.st_uid, entry.st_gid) != owner or path.read_text(encoding="utf-8") != text):
                return False
        return True
    except (OSError, UnicodeDecodeError):
        return False


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_file(path: Path, text: str, mode: int, owner: tuple[int, int] | None = None) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", closefd=False) as handle:
            handle.write(text)
            handle.flush()
        if owner is not None and owner != (os.geteuid(), os.getegid()):
            os.fchown(fd, *owner)
        os.fchmod(fd, mode)  # not narrowed by the umask (after fchown, which may clear set-id bits)
        os.fsync(fd)
    finally:
        os.close(fd)


_renameat2: Any = None


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths atomically with ``renameat2(RENAME_EXCHANGE)``; False where the system lacks it."""
    global _renameat2
    if _renameat2 is None:
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            func = libc.renameat2
            func.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
            func.restype = ctypes.c_int
            _renameat2 = func
        except (OSError, AttributeError):
            _renameat2 = False
    if _renameat2 is False:
        return False
    if _renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP):
        return False
    raise OSError(err, os.strerror(err), str(b))


def _swap_in(tmp: Path, final: Path) -> None:
    """Make ``tmp`` become ``final`` (replacing an existing directory); the old one is removed."""
    if final.is_dir() and not final.is_symlink():
        if _exchange(tmp, final):
            shutil.rmtree(tmp, ignore_errors=True)  # tmp now holds the old directory
            return
        aside = Path(tempfile.mkdtemp(prefix=f"{_TMP_MARK}old-{final.name}-", dir=final.parent))
        os.rmdir(aside)
        os.rename(final, aside)
        os.rename(tmp, final)
        shutil.rmtree(aside, ignore_errors=True)
        return
    if final.exists() or final.is_symlink():
        if final.is_dir() and not final.is_symlink():
            shutil.rmtree(final)
        else:
            final.unlink()
    os.rename(tmp, final)


def _carry_sockets(old: Path, new: Path) -> None:
    """Move the sockets an engine bound in ``old`` (its KV-event socket) into ``new``: a bound Unix socket stays
    reachable under whatever name its inode has, so the running engine's events keep flowing."""
    if not old.is_dir() or old.is_symlink():
        return
    for name in _sockets(old):
        try:
            os.rename(old / name, new / name)
        except OSError:  # gone meanwhile (the engine stopped)
            continue


def write_instance_dir(root: Path, launch: LaunchLike | Mapping[str, Any],
                       account: Account | AccountError | None = None) -> Path:
    """Write (or leave, when unchanged) the directory of one instance under ``root``; returns its path.

    ``account``: who the directory and its files belong to (None: the agent; an ``AccountError``: the agent, with
    a ``launch.sh`` that refuses to start)."""
    spec = launch if isinstance(launch, InstanceLaunch) else InstanceLaunch.from_value(launch)
    root = Path(os.path.abspath(root))
    final = root / spec.instance_id
    contents = _contents(spec, final, account)
    owner = _owner(account)
    if _unchanged(final, contents, owner):
        return final
    tmp = Path(tempfile.mkdtemp(prefix=f"{_TMP_MARK}{spec.instance_id}-", dir=root))
    try:
        os.chmod(tmp, DIR_MODE)
        for name, (text, mode) in contents.items():
            _write_file(tmp / name, text, mode, owner)
        if owner != (os.geteuid(), os.getegid()):
            os.chown(tmp, *owner)
        _fsync_dir(tmp)
        _carry_sockets(final, tmp)
        _swap_in(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


def write_instance_dirs(root: Path, instances: Iterable[LaunchLike | Mapping[str, Any]], *,
                        accounts: Mapping[str, Account | AccountError] | None = None) -> list[Path]:
    """Make ``root`` hold exactly the instance directories of ``instances``; returns their paths in order.

    ``accounts`` maps instance ids to the account each runs as (``agent.node.accounts.resolve_account``; an
    ``AccountError`` where it has none on this node); an instance without an entry belongs to the agent.
    Every launch is checked before anything is written (one bad launch writes nothing). ``root`` is created
    when missing and made 0711. Instance directories of instances not in ``instances`` (directories with a
    ``launch.json``) and temporaries of an interrupted write are removed; other entries are kept.

    Raises:
        InstanceDirError: a launch that cannot be written (bad id, file name, variable) or two with one id.
        OSError: the file system refused (permissions, space).
    """
    specs = [item if isinstance(item, InstanceLaunch) else InstanceLaunch.from_value(item) for item in instances]
    seen: set[str] = set()
    for spec in specs:
        if spec.instance_id in seen:
            raise InstanceDirError(f"instance id {spec.instance_id!r} appears twice")
        seen.add(spec.instance_id)
    root = Path(os.path.abspath(root))
    root.mkdir(mode=INSTANCE_ROOT_MODE, parents=True, exist_ok=True)
    if stat.S_IMODE(os.stat(root).st_mode) != INSTANCE_ROOT_MODE:
        os.chmod(root, INSTANCE_ROOT_MODE)
    accounts = accounts or {}
    paths = [write_instance_dir(root, spec, accounts.get(spec.instance_id)) for spec in specs]
    for entry in root.iterdir():
        if entry.name.startswith(_TMP_MARK) and entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        elif (entry.name not in seen and entry.is_dir() and not entry.is_symlink()
              and (entry / LAUNCH_JSON).is_file()):
            shutil.rmtree(entry)
    _fsync_dir(root)
    return paths


def read_launch(directory: Path) -> dict[str, Any]:
    """``launch.json`` of an instance directory: ``{"instance_id", "argv", "env", "cwd", "user"}``."""
    return json.loads((Path(directory) / LAUNCH_JSON).read_text(encoding="utf-8"))
