"""The demo deletes its broker keys from a Redis it did not start, at start and at shutdown (real redis-server).

Only the demo's own database is touched: keys of another database, and keys in its database that are not a
queue or kombu binding, stay.
"""
from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

from demo import cli
from tests.support.telemetry import RedisServer

pytestmark = pytest.mark.integration

#: What a session leaves in database 11: node queues (also of nodes added by hand), dashboard queues, bindings.
LEFT_BEHIND = ["agent.node-a", "agent.probe-n", "agent.probe-weird", "dashboard.ingest", "dashboard.control",
               "_kombu.binding.agent.probe-n", "_kombu.binding_permanent.agent.probe-n",
               "_kombu.binding.dashboard.ingest", "_kombu.binding_deadlines", "unacked", "unacked_index"]


@pytest.fixture
def server(tmp_path) -> Iterator[RedisServer]:
    process = RedisServer(tmp_path)
    process.start()
    yield process
    process.stop()


def _fill(client: redis.Redis) -> None:
    for key in LEFT_BEHIND:
        if key.startswith("_kombu"):
            client.sadd(key, "agent.x\x06\x16\x06\x16agent.x")
        else:
            client.rpush(key, "{}")
    client.set("someone.else", "keep")


def _demo(tmp_path, url: str, *, owns_db: bool) -> cli.Demo:
    demo = cli.Demo(cli.parse_args(["--var-dir", str(tmp_path / "var"), "--redis-url", url]))
    demo._owns_redis_db = owns_db  # as when the demo picked database 11 of 127.0.0.1:6379 itself
    demo.prepare_var()
    demo.start_redis()
    return demo


def test_shutdown_deletes_every_demo_queue_of_its_own_database_only(tmp_path, server):
    own = redis.Redis(port=server.port, db=cli.SHARED_REDIS_DB)
    other = redis.Redis(port=server.port, db=0)
    _fill(other)
    demo = _demo(tmp_path, f"redis://127.0.0.1:{server.port}/{cli.SHARED_REDIS_DB}", owns_db=True)
    _fill(own)  # what agents, the dashboard and hand-made nodes leave during the session
    demo.shutdown()
    assert sorted(k.decode() for k in own.keys("*")) == ["someone.else"]
    assert sorted(k.decode() for k in other.keys("*")) == sorted(LEFT_BEHIND + ["someone.else"])


def test_start_deletes_the_previous_sessions_queues(tmp_path, server):
    own = redis.Redis(port=server.port, db=cli.SHARED_REDIS_DB)
    _fill(own)
    demo = _demo(tmp_path, f"redis://127.0.0.1:{server.port}/{cli.SHARED_REDIS_DB}", owns_db=True)
    try:
        assert [k.decode() for k in own.keys("*")] == ["someone.else"]
    finally:
        demo.shutdown()


def test_on_a_given_redis_url_only_the_fixed_demo_queues_are_deleted(tmp_path, server):
    given = redis.Redis(port=server.port, db=3)
    demo = _demo(tmp_path, f"redis://127.0.0.1:{server.port}/3", owns_db=False)
    _fill(given)
    demo.shutdown()
    left = {k.decode() for k in given.keys("*")}
    assert not left & set(cli.DEMO_KEYS)
    assert left == set(LEFT_BEHIND) - set(cli.DEMO_KEYS) | {"someone.else"}
