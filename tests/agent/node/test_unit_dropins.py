"""The systemd drop-ins naming each engine instance's account (``agent.node.unit_dropins``) and the agent writing
them with its instance directories (``NodeEngines(unit_dir=...)``, ``kvpool-agent run --engine-unit-dir``)."""
from __future__ import annotations

import grp
import logging
import stat
from pathlib import Path

from agent.datapath.ledger import Ledger
from agent.node.accounts import Account, AccountError
from agent.node.engines import NodeEngines
from agent.node.unit_dropins import DROPIN_NAME, dropin_path, unit_name, write_account_dropins
from tests.agent.node.test_engines import document, spec
from tests.support.accounts import THROWAWAY_ACCOUNT_RULES

ENGINE = Account(name="kvpool-t3", uid=4003, gid=4003)


def _dropin(unit_dir: Path, instance_id: str) -> Path:
    return unit_dir / f"kvpool-engine@{instance_id}.service.d" / DROPIN_NAME


def _group(gid: int) -> str:
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return str(gid)


def test_an_instance_with_an_account_of_its_own_gets_user_and_group(tmp_path):
    changed = write_account_dropins(tmp_path, {"7": ENGINE})
    path = _dropin(tmp_path, "7")
    assert changed == ["7"] and path == dropin_path(tmp_path, "7")
    lines = path.read_text().splitlines()
    assert lines[-3:] == ["[Service]", "User=kvpool-t3", f"Group={_group(4003)}"]
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    assert write_account_dropins(tmp_path, {"7": ENGINE}) == []  # unchanged: not rewritten, no reload needed


def test_no_dropin_for_the_agents_own_account_root_or_a_missing_account(tmp_path, caplog):
    """Without a drop-in the template refuses to start the instance: never User=root, never the agent's account."""
    accounts = {
        "1": Account(name="root", uid=0, gid=0, fallback=True),        # a single-user agent running as root
        "2": Account(name="dev", uid=1000, gid=1000, fallback=True),   # an unprivileged agent
        "3": AccountError("account 'kvpool-t9' does not exist on this node"),
        "4": Account(name="toor", uid=0, gid=0),                        # resolve_account refuses it; still not here
        "5": Account(name="bad%name", uid=4005, gid=4005),              # would be expanded as a specifier
    }
    with caplog.at_level(logging.WARNING, logger="kvpool.agent.unit_dropins"):
        assert write_account_dropins(tmp_path, accounts) == []
    assert list(tmp_path.iterdir()) == []
    assert "is root" in caplog.text and "'bad%name'" in caplog.text


def test_instance_ids_that_need_escaping_get_no_unit_name():
    assert unit_name("7") == "kvpool-engine@7.service"
    for bad in ("a b", "x/y", "-7", "", "ü", "a\nb"):
        assert unit_name(bad) is None


def test_dropins_of_instances_that_left_go_and_the_operators_own_files_stay(tmp_path):
    write_account_dropins(tmp_path, {"7": ENGINE, "8": ENGINE, "9": ENGINE})
    operator = tmp_path / "kvpool-engine@8.service.d" / "gpu.conf"
    operator.write_text("[Service]\nEnvironment=CUDA_VISIBLE_DEVICES=1\n")
    (tmp_path / "other.service.d").mkdir()
    (tmp_path / "other.service.d" / DROPIN_NAME).write_text("[Service]\n")
    changed = write_account_dropins(tmp_path, {"7": ENGINE, "9": AccountError("gone from this node")})
    assert sorted(changed) == ["8", "9"]
    assert _dropin(tmp_path, "7").is_file()
    assert not _dropin(tmp_path, "8").exists() and operator.is_file()
    assert not (tmp_path / "kvpool-engine@9.service.d").exists()
    assert (tmp_path / "other.service.d" / DROPIN_NAME).is_file()  # not one of ours


def test_a_changed_account_rewrites_the_dropin(tmp_path):
    write_account_dropins(tmp_path, {"7": ENGINE})
    assert write_account_dropins(tmp_path, {"7": Account(name="kvpool-t4", uid=4004, gid=4004)}) == ["7"]
    assert "User=kvpool-t4\n" in _dropin(tmp_path, "7").read_text()


def test_the_agent_writes_dropins_with_the_instance_directories(tmp_path, local_account):
    """As root (privileged agent): applying a document gives the directory to the instance's account and names that
    account in the instance's drop-in; a document without the instance removes both."""
    account = local_account()
    unit_dir = tmp_path / "units"
    instance = spec("7").model_copy(update={"launch": spec("7").launch.model_copy(update={"user": account.name})})
    engines = NodeEngines("node-a", Ledger(), tmp_path / "instances", state_dir=tmp_path, observe=False,
                          is_privileged=True, account_rules=THROWAWAY_ACCOUNT_RULES, unit_dir=unit_dir)
    try:
        engines.on_apply(document([instance], 0, settings=None))
        assert (tmp_path / "instances" / "7").stat().st_uid == account.uid
        assert f"User={account.name}\n" in _dropin(unit_dir, "7").read_text()
        assert "unit_dropins" not in engines.errors
        engines.on_apply(document([], 0, version=2, settings=None))
        assert not (tmp_path / "instances" / "7").exists() and not _dropin(unit_dir, "7").exists()
    finally:
        engines.close()


def test_an_unwritable_unit_dir_is_reported_and_the_directories_still_written(tmp_path, local_account):
    account = local_account()
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    instance = spec("7").model_copy(update={"launch": spec("7").launch.model_copy(update={"user": account.name})})
    engines = NodeEngines("node-a", Ledger(), tmp_path / "instances", state_dir=tmp_path, observe=False,
                          is_privileged=True, account_rules=THROWAWAY_ACCOUNT_RULES, unit_dir=blocker / "units")
    try:
        engines.on_apply(document([instance], 0, settings=None))
        assert "engine unit drop-ins" in engines.errors["unit_dropins"]
        assert (tmp_path / "instances" / "7").stat().st_uid == account.uid
    finally:
        engines.close()
