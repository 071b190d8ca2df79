"""Which accounts an engine instance may run as (security review F1 c): never root, a system account (uid outside
login.defs' UID_MIN..UID_MAX, or the agent's --min-engine-uid/--max-engine-uid), the agent's own account or an
account of the control plane (deploy/systemd). Such an instance is given to no account and not observed; the
agent's errors and the instance's events_problem say why."""
from __future__ import annotations

import pwd
from pathlib import Path

import pytest

from agent.contract.messages import LaunchSpec
from agent.datapath.ledger import Ledger
from agent.node import accounts
from agent.node.accounts import AccountError, EngineAccountRules, login_defs_uid_range, resolve_account
from agent.node.engines import NodeEngines
from agent.sim.master import free_ports
from tests.agent.node.test_engines import Stores, document, spec
from tests.support.accounts import THROWAWAY_ACCOUNT_RULES
from tests.support.engines import events_flag


def _system_account() -> pwd.struct_passwd:
    """An account of this machine with a uid from 1 to 999 (``daemon``, ``bin`` ...)."""
    for entry in pwd.getpwall():
        if 0 < entry.pw_uid < 1000 and entry.pw_name not in accounts.CONTROL_PLANE_ACCOUNTS:
            return entry
    pytest.skip("no system account on this machine")


def test_login_defs_uid_range(tmp_path):
    defs = tmp_path / "login.defs"
    defs.write_text("# comment\nUID_MIN\t\t 2000\nUID_MAX   50000\nSYS_UID_MIN 100\nUID_MIN bogus\n")
    assert login_defs_uid_range(defs) == (2000, 50000)
    assert login_defs_uid_range(tmp_path / "missing") == (1000, 60000)


def test_a_system_account_is_refused_by_default_and_allowed_with_a_lower_minimum():
    """Before: only uid 0 was refused, so 'daemon', 'nobody', 'www-data' ... could run a tenant's engines."""
    entry = _system_account()
    rules = EngineAccountRules(min_uid=1000, max_uid=60000)
    with pytest.raises(AccountError, match=rf"account '{entry.pw_name}' is a system account \(uid {entry.pw_uid} "
                                           r"outside 1000\.\.60000"):
        resolve_account(entry.pw_name, is_privileged=True, rules=rules)
    with pytest.raises(AccountError, match="system account"):
        resolve_account(entry.pw_name, is_privileged=True, rules=EngineAccountRules(min_uid=entry.pw_uid + 1))
    allowed = resolve_account(entry.pw_name, is_privileged=True, rules=EngineAccountRules(min_uid=1))
    assert allowed.uid == entry.pw_uid and not allowed.fallback


def test_an_account_above_the_range_is_refused():
    entry = _system_account()
    with pytest.raises(AccountError, match="system account"):
        resolve_account(entry.pw_name, is_privileged=True, rules=EngineAccountRules(min_uid=0, max_uid=0))


def test_root_is_refused_whatever_the_range():
    with pytest.raises(AccountError, match="is root"):
        resolve_account("root", is_privileged=True, rules=EngineAccountRules(min_uid=0))


def test_the_control_plane_accounts_are_refused_by_name_and_by_uid():
    entry = _system_account()
    rules = EngineAccountRules(min_uid=1, refused_names=(entry.pw_name,))
    with pytest.raises(AccountError, match=f"account '{entry.pw_name}' is the control plane's account"):
        resolve_account(entry.pw_name, is_privileged=True, rules=rules)
    assert set(accounts.CONTROL_PLANE_ACCOUNTS) >= {"kvpool", "kvpool-master"}
    assert accounts.EngineAccountRules().refused_names == accounts.CONTROL_PLANE_ACCOUNTS


def test_an_alias_of_a_control_plane_account_is_refused_by_uid(monkeypatch):
    entry = _system_account()
    real = pwd.getpwnam

    def getpwnam(name: str) -> pwd.struct_passwd:
        return real(entry.pw_name) if name == "alias" else real(name)

    monkeypatch.setattr(accounts.pwd, "getpwnam", getpwnam)
    rules = EngineAccountRules(min_uid=1, refused_names=(entry.pw_name,))
    with pytest.raises(AccountError, match=rf"'alias' is \(by uid {entry.pw_uid}\) the control plane's account"):
        resolve_account("alias", is_privileged=True, rules=rules)


def test_the_agent_s_own_account_is_refused(monkeypatch):
    entry = _system_account()
    monkeypatch.setattr(accounts.os, "geteuid", lambda: entry.pw_uid)
    with pytest.raises(AccountError, match="the agent's own account"):
        resolve_account(entry.pw_name, is_privileged=True, rules=EngineAccountRules(min_uid=1))


def test_an_instance_of_a_refused_account_is_not_observed_and_says_why(tmp_path: Path):
    entry = _system_account()
    engines = NodeEngines("node-a", Ledger(), tmp_path / "instances", state_dir=tmp_path, interval=0,
                          metrics_interval=0, store_opener=Stores(), is_privileged=True,
                          account_rules=EngineAccountRules(min_uid=1000, max_uid=60000),
                          observer_options={"poll_ms": 20, "retry_initial": 0.02, "retry_max": 0.1})
    try:
        (port,) = free_ports(1)
        launch = LaunchSpec(instance_id="7", argv=("python", "-m", "vllm.entrypoints.openai.api_server",
                                                   *events_flag("7")), user=entry.pw_name)
        engines.on_apply(document([spec("7").model_copy(update={"launch": launch})], port))
        assert "system account" in engines.errors["account:7"]
        (stats,) = engines.instance_stats()
        assert stats.events_status != "connected" and "system account" in (stats.events_problem or "")
    finally:
        engines.close()


def test_throwaway_test_accounts_are_allowed_by_their_own_rules():
    assert THROWAWAY_ACCOUNT_RULES.uid_range()[0] == 1


def test_the_control_plane_accounts_are_the_users_of_deploy_systemd_and_reserved_in_the_registry():
    """Every ``User=`` of ``deploy/systemd`` is refused by the agent and, by default, by the registry."""
    import re

    units = Path(__file__).resolve().parents[3] / "deploy" / "systemd"
    users = {match for unit in units.glob("*.service")
             for match in re.findall(r"^User=(\S+)$", unit.read_text(), flags=re.MULTILINE)}
    assert users and users <= set(accounts.CONTROL_PLANE_ACCOUNTS)
    settings_text = (units.parents[1] / "dashboard" / "settings.py").read_text()
    default = re.search(r'KVPOOL_RESERVED_ACCOUNTS = env_list\("KVPOOL_RESERVED_ACCOUNTS", \[(.*?)\]\)', settings_text,
                        flags=re.DOTALL)
    assert default and set(accounts.CONTROL_PLANE_ACCOUNTS) <= set(re.findall(r'"([^"]+)"', default.group(1)))
