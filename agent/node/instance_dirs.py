"""Instance directories on the node: one ``<root>/<instance_id>/`` per engine instance of the applied document.

Each directory holds what starting the instance needs, rendered by the control plane
(``tenants.rendering.RenderedConfig.launch_spec()``, JSON form ``LaunchSpec.to_dict()``):

* the rendered files (vLLM: ``mooncake.json``, the ``MOONCAKE_CONFIG_PATH`` document),
* ``launch.json`` — ``{"instance_id", "argv", "env"}`` with every path variable resolved,
* ``env`` — the environment as a systemd ``EnvironmentFile`` (``NAME="value"``, double-quoted; ``\\``, ``"``,
  ``$`` and backquote escaped with a backslash, newlines kept), which a POSIX shell can also source,
* ``launch.sh`` — ``#!/bin/sh``, ``set -e``, one ``export NAME='value'`` per variable and ``exec`` of the
  command with every argument shell-quoted. An ``argv[0]`` of ``python`` (``ENGINE_PYTHON``) stands for the
  engine's interpreter and runs as ``"${KVPOOL_ENGINE_PYTHON:-python3}"``, so one rendered launch serves
  whatever venv the node installed the engine into.

Variables of ``file_env`` (``{"MOONCAKE_CONFIG_PATH": "mooncake.json"}``) get the absolute path of that file in
the final directory. Each directory is written into a temporary directory beside it (files and directory
fsynced), then swapped in with one ``renameat2(RENAME_EXCHANGE)`` where the kernel has it (else: old one renamed
aside, new one renamed in), so a reader sees the old or the new directory, never a half-written one. An
unchanged directory is left alone. Directories under ``root`` that hold a ``launch.json`` but whose instance is
no longer in the document are removed (nothing else under ``root`` is touched), as are temporaries left by a
crash. Modes: directories and ``launch.sh`` 0755, other files 0644.

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
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

#: ``argv[0]`` that stands for the engine environment's Python interpreter (``tenants.rendering.ENGINE_PYTHON``).
ENGINE_PYTHON = "python"
#: The interpreter ``launch.sh`` runs in place of ``ENGINE_PYTHON``: ``$KVPOOL_ENGINE_PYTHON``, else ``python3``.
ENGINE_PYTHON_SHELL = '"${KVPOOL_ENGINE_PYTHON:-python3}"'
#: Files this module writes in every instance directory (rendered files may not use these names).
LAUNCH_JSON, ENV_FILE, LAUNCH_SH = "launch.json", "env", "launch.sh"
_OWN_FILES = (LAUNCH_JSON, ENV_FILE, LAUNCH_SH)
_ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_TMP_MARK = ".kvpool-tmp-"
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
    ``files`` (file name -> text). :meth:`from_value` checks everything :func:`write_instance_dirs` relies on.
    """

    instance_id: str
    argv: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    file_env: Mapping[str, str] = field(default_factory=dict)
    files: Mapping[str, str] = field(default_factory=dict)

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
        return cls(instance_id=instance_id, argv=argv, env=env, file_env=file_env, files=files)

    def resolved_env(self, directory: Path) -> dict[str, str]:
        """``env`` plus each ``file_env`` variable set to the absolute path of its file in ``directory``."""
        directory = Path(os.path.abspath(directory))
        return {**self.env, **{var: str(directory / name) for var, name in self.file_env.items()}}


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


def launch_script(launch: InstanceLaunch, directory: Path) -> str:
    """``launch.sh`` of ``launch`` for the instance directory ``directory`` (its final path)."""
    lines = ["#!/bin/sh", f"# kvpool instance {launch.instance_id}: written by agent.node.instance_dirs; "
             "KVPOOL_ENGINE_PYTHON picks the engine interpreter", "set -e"]
    lines += [f"export {name}={shlex.quote(value)}" for name, value in sorted(launch.resolved_env(directory).items())]
    lines.append(exec_line(launch.argv))
    return "\n".join(lines) + "\n"


def _contents(launch: InstanceLaunch, directory: Path) -> dict[str, tuple[str, int]]:
    """File name -> (text, mode) of the instance directory."""
    env = launch.resolved_env(directory)
    document = {"instance_id": launch.instance_id, "argv": list(launch.argv), "env": env}
    out = {name: (text, 0o644) for name, text in launch.files.items()}
    out[LAUNCH_JSON] = (json.dumps(document, indent=2, sort_keys=True, ensure_ascii=False) + "\n", 0o644)
    out[ENV_FILE] = (env_file(env), 0o644)
    out[LAUNCH_SH] = (launch_script(launch, directory), 0o755)
    return out


def _unchanged(directory: Path, contents: Mapping[str, tuple[str, int]]) -> bool:
    try:
        if not directory.is_dir() or directory.is_symlink():
            return False
        if sorted(p.name for p in directory.iterdir()) != sorted(contents):
            return False
        for name, (text, mode) in contents.items():
            path = directory / name
            if (path.stat().st_mode & 0o7777) != mode or path.read_text(encoding="utf-8") != text:
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


def _write_file(path: Path, text: str, mode: int) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", closefd=False) as handle:
            handle.write(text)
            handle.flush()
        os.fchmod(fd, mode)  # not narrowed by the umask
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


def write_instance_dir(root: Path, launch: LaunchLike | Mapping[str, Any]) -> Path:
    """Write (or leave, when unchanged) the directory of one instance under ``root``; returns its path."""
    spec = launch if isinstance(launch, InstanceLaunch) else InstanceLaunch.from_value(launch)
    root = Path(os.path.abspath(root))
    final = root / spec.instance_id
    contents = _contents(spec, final)
    if _unchanged(final, contents):
        return final
    tmp = Path(tempfile.mkdtemp(prefix=f"{_TMP_MARK}{spec.instance_id}-", dir=root))
    try:
        os.chmod(tmp, 0o755)
        for name, (text, mode) in contents.items():
            _write_file(tmp / name, text, mode)
        _fsync_dir(tmp)
        _swap_in(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


def write_instance_dirs(root: Path, instances: Iterable[LaunchLike | Mapping[str, Any]]) -> list[Path]:
    """Make ``root`` hold exactly the instance directories of ``instances``; returns their paths in order.

    Every launch is checked before anything is written (one bad launch writes nothing). ``root`` is created
    (0755) when missing. Instance directories of instances not in ``instances`` (directories with a
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
    root.mkdir(mode=0o755, parents=True, exist_ok=True)
    paths = [write_instance_dir(root, spec) for spec in specs]
    for entry in root.iterdir():
        if entry.name.startswith(_TMP_MARK) and entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        elif (entry.name not in seen and entry.is_dir() and not entry.is_symlink()
              and (entry / LAUNCH_JSON).is_file()):
            shutil.rmtree(entry)
    _fsync_dir(root)
    return paths


def read_launch(directory: Path) -> dict[str, Any]:
    """``launch.json`` of an instance directory: ``{"instance_id", "argv", "env"}``."""
    return json.loads((Path(directory) / LAUNCH_JSON).read_text(encoding="utf-8"))
