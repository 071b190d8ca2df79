"""The agent's state at rest (issue 16, item 3): ``applied.json`` (every co-located tenant's seeds and salts), the
outbox, the ledger file and the lock are the agent's alone (0600 in a 0700 directory, 0711 when the instance root is
inside it); another local account reads none of them. Before this they were written with the process umask (0644 in
a 0755 directory)."""
from __future__ import annotations

import os
import stat

from agent.datapath.ledger import Ledger
from agent.node.accounts import secure_state_dir
from agent.node.daemon import Daemon
from agent.node.ledger_file import open_ledger_file
from tests.support.accounts import run_as
from tests.support.messages import document, instance


def _mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_state_files_are_the_agent_s_alone(tmp_path):
    state = tmp_path / "state"
    previous = os.umask(0o022)  # a permissive umask: the files must not depend on it
    try:
        daemon = Daemon("node-a", "s3cret", state, publish=lambda batch: None)
        ledger_file = open_ledger_file(Ledger(), state)
        assert daemon.handle_document(document(instances=[instance("1")]))["status"] == "applied"
        daemon.report_now()
        ledger_file.flush()
    finally:
        os.umask(previous)
    try:
        assert _mode(state) == 0o700
        files = sorted(p.name for p in state.iterdir())
        assert {"applied.json", "outbox.sqlite3", "ledger.sqlite3", "lock"} <= set(files)
        assert {name: _mode(state / name) for name in files} == {name: 0o600 for name in files}
        assert "salt-a" in (state / "applied.json").read_text()  # what must not leak
    finally:
        daemon.stop()
        ledger_file.close()


def test_secure_state_dir_narrows_an_existing_directory(tmp_path):
    state = tmp_path / "state"
    state.mkdir(mode=0o755)
    (state / "applied.json").write_text("{}")
    os.chmod(state / "applied.json", 0o644)
    (state / "instances").mkdir()
    secure_state_dir(state, traversable=True)
    assert _mode(state) == 0o711 and _mode(state / "applied.json") == 0o600
    secure_state_dir(state)
    assert _mode(state) == 0o700


def test_another_account_reads_nothing_of_the_agent_s_state(shared_tmp, local_account):
    other = local_account()
    state = shared_tmp / "state"
    daemon = Daemon("node-a", "s3cret", state, publish=lambda batch: None)
    try:
        daemon.handle_document(document(instances=[instance("1")]))
        daemon.report_now()
        secure_state_dir(state, traversable=True)  # engines may traverse it to reach the instance root
        for name in ("applied.json", "outbox.sqlite3", "lock"):
            denied = run_as(other, ["cat", str(state / name)])
            assert denied.returncode != 0 and "Permission denied" in denied.stderr, name
        assert run_as(other, ["ls", str(state)]).returncode != 0
    finally:
        daemon.stop()
