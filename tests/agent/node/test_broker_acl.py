"""Each agent's Redis user may read only its own queue and push only to the dashboard's (issue 16, item 3): a real
``redis-server`` with ACL users (``agent.contract.broker.agent_acl_rules``), the real agent command line consuming
``agent.node-a`` under its restricted user, applying a sealed document and acking it on ``dashboard.ingest``;
node-b's credentials can read neither node-a's queue nor the ingest queue, and cannot write into node-a's queue."""
from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
import redis

from agent.contract import signing
from agent.contract.broker import agent_acl_rules
from agent.contract.messages import APPLY_CONFIG_TASK, node_queue
from agent.contract.sealing import seal
from tests.support.messages import document
from tests.support.paths import ROOT
from tests.support.telemetry import RedisServer
from tests.support.waiting import wait_for

SECRETS = {"node-a": "secret-of-a", "node-b": "secret-of-b"}


@pytest.fixture
def broker(tmp_path) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path)
    server.start()
    admin = server.client()
    for node in SECRETS:
        admin.execute_command("ACL", "SETUSER", f"agent-{node}", "on", f">pw-{node}", *agent_acl_rules(node))
    try:
        yield server
    finally:
        server.stop()


def _user(server: RedisServer, node: str) -> redis.Redis:
    return redis.Redis(port=server.port, username=f"agent-{node}", password=f"pw-{node}")


def _push(server: RedisServer, node: str, version: int) -> None:
    """What the dashboard publishes (full-access user): a sealed, signed, freshly stamped document."""
    from agent.node.celery_app import make_app

    app = make_app("dashboard", server.url)
    raw = document(node, version, secret=SECRETS[node], sent_at=datetime.now(UTC))
    app.send_task(APPLY_CONFIG_TASK, args=[seal(raw, SECRETS[node], node=node)], queue=node_queue(node),
                  declare=[], argsrepr="[<config document>]")


def test_another_node_s_credentials_cannot_read_or_write_this_node_s_queue(broker, tmp_path):
    _push(broker, "node-a", 1)
    mallory = _user(broker, "node-b")
    for attempt in (lambda: mallory.lrange("agent.node-a", 0, -1), lambda: mallory.rpop("agent.node-a"),
                    lambda: mallory.brpop(["agent.node-a"], timeout=1), lambda: mallory.lpush("agent.node-a", "x"),
                    lambda: mallory.lrange("dashboard.ingest", 0, -1), lambda: mallory.keys("*"),
                    lambda: mallory.execute_command("MONITOR"), lambda: mallory.publish("x", "y")):
        with pytest.raises(redis.exceptions.NoPermissionError):
            attempt()
    assert broker.client().llen("agent.node-a") == 1  # untouched

    secret_file = tmp_path / "node-a.secret"
    secret_file.write_text(SECRETS["node-a"])
    secret_file.chmod(0o600)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KVPOOL_", "PYTEST", "CELERY_"))}
    env["PYTHONPATH"] = str(ROOT)
    url = f"redis://agent-node-a:pw-node-a@127.0.0.1:{broker.port}/0"
    log = tmp_path / "agent.log"
    with open(log, "wb") as out:
        agent = subprocess.Popen([sys.executable, "-m", "agent", "run", "--node", "node-a", "--broker", url,
                                  "--secret-file", str(secret_file), "--state-dir", str(tmp_path / "state"),
                                  "--report-interval", "1", "--heartbeat-interval", "1"],
                                 cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        admin = broker.client()

        def acked() -> bool:
            for raw in admin.lrange("dashboard.ingest", 0, -1):
                [messages], _, _ = json.loads(base64.b64decode(json.loads(raw)["body"]))
                if any(m["kind"] == "ack" and m["status"] == "applied" and m["version"] == 1 for m in messages):
                    return True
            return False

        wait_for(acked, 60, "node-a's ack on dashboard.ingest (see the agent log)")
        assert admin.llen("agent.node-a") == 0  # consumed under the restricted user
        text = log.read_text()
        assert "NoPermission" not in text and "no permissions" not in text, text[-2000:]
        assert json.loads((tmp_path / "state" / "applied.json").read_text())["version"] == 1
        signing.verify(json.loads((tmp_path / "state" / "applied.json").read_text()), SECRETS["node-a"])
    finally:
        agent.terminate()
        try:
            agent.wait(20)
        except subprocess.TimeoutExpired:
            agent.kill()
            agent.wait()
