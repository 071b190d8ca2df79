"""systemd drop-ins that name each engine instance's account: ``<unit-dir>/kvpool-engine@<instance_id>.service.d/
kvpool-account.conf`` with ``User=`` and ``Group=`` (``kvpool-agent run --engine-unit-dir DIR``).

``deploy/systemd/kvpool-engine@.service`` starts an instance from the directory the agent writes
(``agent.node.instance_dirs``). A template unit cannot take ``User=`` from a file, and the instance's account is
known only here: the registry renders the tenant's engine account (``Tenant.engine_user``, else ``kvpool-t<tenant
id>``, not derivable from the instance id) and the agent resolves it on this node (``agent.node.accounts``). Nothing
the instance's account can write may name it: ``launch.json``, ``env`` and ``launch.sh`` belong to that account, so
the agent, which chowned them, writes the drop-in (root's, 0644) from the account it resolved.

Only instances given to an account of their own get one: none for an ``AccountError`` (the node lacks the account)
nor for the agent's own account (single-user or unprivileged agent, possibly root). The template refuses to start
an instance without its drop-in (``AssertPathExists=``) and names a placeholder account otherwise, so a missing or
stale drop-in never runs ``launch.sh`` as root (a file its tenant could rewrite). Drop-ins of instances no longer
in the document are removed, with their ``.d`` directory when nothing else is in it (files an operator added stay).

systemd reads a changed drop-in of a loaded unit at the next ``systemctl daemon-reload``; a unit loaded first after
the write reads it anyway. Until then a changed account fails safe: the old account cannot enter the rewritten
instance directory, whose ``launch.sh`` checks the new uid. No Django here.
"""
from __future__ import annotations

import grp
import logging
import os
import re
from collections.abc import Mapping
from pathlib import Path

from agent.node.accounts import Account, AccountError

log = logging.getLogger("kvpool.agent.unit_dropins")

#: The template unit's name (``deploy/systemd/kvpool-engine@.service``).
ENGINE_TEMPLATE = "kvpool-engine"
#: File name of the drop-in in each ``kvpool-engine@<id>.service.d/``.
DROPIN_NAME = "kvpool-account.conf"
#: Mode of the drop-in: systemd reads it as root; nothing in it is secret.
DROPIN_MODE = 0o644
#: Instance ids usable as a unit's instance name without escaping (``systemd-escape`` leaves them unchanged).
_INSTANCE_RE = re.compile(r"[A-Za-z0-9_.:-]{1,200}")
#: POSIX-style user and group names (a name with ``%`` would be expanded as a specifier, whitespace would split).
_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,31}")
_DIR_RE = re.compile(rf"{re.escape(ENGINE_TEMPLATE)}@(.+)\.service\.d")


def unit_name(instance_id: str) -> str | None:
    """``kvpool-engine@<instance_id>.service``, or None when the id would need escaping in a unit name."""
    if not _INSTANCE_RE.fullmatch(instance_id) or instance_id.startswith(("-", ".")):
        return None
    return f"{ENGINE_TEMPLATE}@{instance_id}.service"


def dropin_path(unit_dir: Path, instance_id: str) -> Path | None:
    """Where the drop-in of ``instance_id`` goes (None: no unit name for it, :func:`unit_name`)."""
    name = unit_name(instance_id)
    return None if name is None else Path(unit_dir) / f"{name}.d" / DROPIN_NAME


def dropin_text(instance_id: str, account: Account) -> str:
    """The drop-in: ``User=`` the account's name, ``Group=`` its primary group's name (the number when the group
    has no name).

    Raises:
        ValueError: the account is root or names that cannot be written into a unit file.
    """
    if account.uid == 0:
        raise ValueError(f"instance {instance_id}: account {account.name!r} is root")
    try:
        group = grp.getgrgid(account.gid).gr_name
    except KeyError:
        group = str(account.gid)
    for what, name in (("account", account.name), ("group", group)):
        if not (_NAME_RE.fullmatch(name) or name.isdigit()):
            raise ValueError(f"instance {instance_id}: {what} name {name!r} cannot be written into a unit file")
    return (f"# Written by kvpool-agent (agent.node.unit_dropins): instance {instance_id} runs as its tenant's engine "
            "account.\n# Rewritten or removed with the instance; run `systemctl daemon-reload` after a change.\n"
            f"[Service]\nUser={account.name}\nGroup={group}\n")


def _write_if_changed(path: Path, text: str) -> bool:
    """Write ``path`` (0644) through a temporary file and a rename unless it already holds ``text``; True when
    written."""
    try:
        if path.read_text(encoding="utf-8") == text and (os.stat(path).st_mode & 0o777) == DROPIN_MODE:
            return False
    except (OSError, UnicodeDecodeError):
        pass
    path.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, DROPIN_MODE)
    try:
        os.write(fd, text.encode("utf-8"))
        os.fchmod(fd, DROPIN_MODE)  # not narrowed by the agent's umask 077
        os.fsync(fd)
    finally:
        os.close(fd)
    os.rename(tmp, path)
    return True


def write_account_dropins(unit_dir: Path, accounts: Mapping[str, Account | AccountError]) -> list[str]:
    """Make ``unit_dir`` hold exactly one account drop-in per instance of ``accounts`` that has an account of its
    own; returns the instance ids whose drop-in was written or removed (run ``systemctl daemon-reload`` then).

    ``accounts``: instance id -> its ``Account`` (``agent.node.accounts.resolve_account``), or the
    ``AccountError`` why it has none. Skipped, with a warning: ``fallback`` accounts (the agent's own), root, ids
    that are no unit instance name, names unfit for a unit file.

    Raises:
        OSError: ``unit_dir`` cannot be written.
    """
    unit_dir = Path(unit_dir)
    wanted: dict[str, str] = {}
    for instance_id, account in accounts.items():
        if not isinstance(account, Account) or account.fallback:
            continue
        if unit_name(instance_id) is None:
            log.warning("instance %r: no systemd unit name without escaping; no drop-in written", instance_id)
            continue
        try:
            wanted[instance_id] = dropin_text(instance_id, account)
        except ValueError as exc:
            log.warning("%s; no drop-in written (kvpool-engine@%s will not start)", exc, instance_id)
    changed = []
    for instance_id, text in sorted(wanted.items()):
        path = dropin_path(unit_dir, instance_id)
        if path is not None and _write_if_changed(path, text):
            changed.append(instance_id)
    try:
        entries = list(os.scandir(unit_dir))
    except FileNotFoundError:
        entries = []
    for entry in entries:
        match = _DIR_RE.fullmatch(entry.name)
        if match is None or match.group(1) in wanted or not entry.is_dir(follow_symlinks=False):
            continue
        stale = Path(entry.path) / DROPIN_NAME
        if not stale.is_file():
            continue
        stale.unlink()
        changed.append(match.group(1))
        try:
            os.rmdir(entry.path)
        except OSError:  # the operator's own drop-ins are in it
            pass
    if changed:
        log.info("engine unit drop-ins under %s changed for instance(s) %s: run `systemctl daemon-reload` before "
                 "(re)starting them", unit_dir, ", ".join(changed))
    return changed


__all__ = ["DROPIN_NAME", "ENGINE_TEMPLATE", "dropin_path", "dropin_text", "unit_name", "write_account_dropins"]
