"""Who may publish as an instance (issue 16, items 2 and 5): the agent connects one SUB per vLLM instance to the
socket the instance's engine binds in its own directory, and only after proving that nobody but the instance's
account could have made it. Real ZMQ, recorded vLLM 0.32.0 frames; the tests with other accounts run as root
(CI) with throwaway system accounts (``tests.support.accounts``).

Before this, the agent bound one ``tcp://127.0.0.1:<kv_events_port>`` SUB for every engine of the node and trusted
the topic: any local process could publish forged ``BlockStored`` events as any instance, or bind the port first
and receive every engine's prompt tokens.
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import zmq

from agent.contract.messages import LaunchSpec
from agent.datapath.ledger import Ledger
from agent.node.engines import NodeEngines
from agent.sim.master import free_ports
from tests.agent.node.test_engines import RUN, Stores, document, present_keys, spec, store_of
from tests.support.accounts import THROWAWAY_ACCOUNT_RULES, python_for, run_as
from tests.support.captures import frames, meta, retopic
from tests.support.engines import ENGINE_SCRIPT, bind_publisher, events_flag, send_when_joined
from tests.support.waiting import wait_for


def _engines(root: Path, *, privileged: bool) -> NodeEngines:
    return NodeEngines("node-a", Ledger(), root, state_dir=root.parent, interval=0, metrics_interval=0,
                       store_opener=Stores(), is_privileged=privileged, account_rules=THROWAWAY_ACCOUNT_RULES,
                       observer_options={"poll_ms": 20, "retry_initial": 0.02, "retry_max": 0.1,
                                         "recheck_interval": 0.1})


@pytest.fixture
def engines(tmp_path: Path) -> Iterator[NodeEngines]:
    ne = _engines(tmp_path / "instances", privileged=False)
    try:
        yield ne
    finally:
        ne.close()


def test_a_socket_in_a_directory_others_can_write_is_refused_flagged_and_retried(engines, tmp_path):
    (port,) = free_ports(1)
    engines.on_apply(document([spec("7")], port))
    directory = tmp_path / "instances" / "7"
    os.chmod(directory, 0o777)  # anyone could have put the socket there
    ctx = zmq.Context()
    pub = bind_publisher(ctx, directory)
    try:
        observer = engines.observer
        wait_for(lambda: observer.status("7")[0] == "refused", what="the socket refused")
        wait_for(lambda: observer.snapshot()["instances"]["7"]["events_refusals"] >= 3, what="retries")
        (stats,) = engines.instance_stats()
        assert stats.events_status == "refused" and "writable by group or others" in stats.events_problem
        assert observer.received == 0
        os.chmod(directory, 0o700)  # fixed: the next retry connects
        wait_for(lambda: observer.status("7")[0] == "connected", what="the retry to connect")
        send_when_joined(pub.send_multipart, lambda: observer.received, retopic(frames(RUN), "7"))
        wait_for(lambda: observer.attributor("7").snapshot()["attributed"] == 19, what="attribution")
        assert engines.instance_stats()[0].events_problem == ""
    finally:
        pub.close()
        ctx.term()


def test_a_tcp_endpoint_is_flagged_insecure_and_never_bound_or_connected(engines):
    (port, events_port) = free_ports(2)
    tcp = f"tcp://127.0.0.1:{events_port}"
    old = spec("7").model_copy(update={"launch": LaunchSpec(
        instance_id="7", argv=("python", "-m", "vllm.entrypoints.openai.api_server", *events_flag("7", tcp)))})
    engines.on_apply(document([old], port))
    (stats,) = engines.instance_stats()
    assert stats.events_status == "insecure" and tcp in stats.events_problem
    with zmq.Context() as ctx, ctx.socket(zmq.PUB) as squatter:
        squatter.bind(tcp)  # the agent holds no tcp port: nothing of it to squat, nothing delivered to a squatter
    assert engines.status()["observer"] == []


def _engine(account, directory: Path, messages: list[list[bytes]], tmp: Path) -> subprocess.Popen[str]:
    """ENGINE_SCRIPT as ``account`` with ``directory`` as working directory (as launch.sh runs an engine)."""
    python, env = python_for(account)
    data = tmp / f"msgs-{account.uid}-{len(list(tmp.iterdir()))}.json"
    data.write_text(json.dumps([[f.hex() for f in m] for m in messages]))
    os.chmod(data, 0o644)
    cmd = ["setpriv", f"--reuid={account.uid}", f"--regid={account.gid}", "--clear-groups", "--", *python, "-c",
           ENGINE_SCRIPT, str(data)]
    proc = subprocess.Popen(cmd, cwd=directory, env={**os.environ, **env}, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return proc


def _line(proc: subprocess.Popen[str]) -> str:
    assert proc.stdout is not None
    return proc.stdout.readline().strip()


def _finish(proc: subprocess.Popen[str]) -> None:
    try:
        if proc.poll() is None and proc.stdin is not None:
            proc.stdin.write("\n\n")
            proc.stdin.flush()
        proc.wait(10)
    except (OSError, subprocess.TimeoutExpired):
        proc.kill()
        proc.wait()


def _launch_as(instance_id: str, user: str) -> LaunchSpec:
    return LaunchSpec(instance_id=instance_id, argv=("python", "-m", "vllm.entrypoints.openai.api_server",
                                                     *events_flag(instance_id)), user=user)


def test_another_account_cannot_publish_as_an_instance_nor_read_its_events(shared_tmp, local_account):
    alice, mallory = local_account(), local_account()
    root = shared_tmp / "instances"
    engines = _engines(root, privileged=True)
    procs: list[subprocess.Popen[str]] = []
    try:
        (port,) = free_ports(1)
        seven = spec("7").model_copy(update={"launch": _launch_as("7", alice.name)})
        eight = spec("8", port=8001).model_copy(update={"launch": _launch_as("8", mallory.name)})
        engines.on_apply(document([seven, eight], port))
        observer = engines.observer
        assert (root / "7").stat().st_uid == alice.uid and (root / "8").stat().st_uid == mallory.uid
        # mallory cannot bind instance 7's socket in 7's directory ...
        squat = _engine(mallory, root / "7", [], shared_tmp)
        procs.append(squat)
        assert _line(squat).startswith("bind failed") and squat.wait(10) == 3
        # ... alice's engine binds it and its writes are attributed to instance 7
        engine = _engine(alice, root / "7", retopic(frames(RUN), "7"), shared_tmp)
        procs.append(engine)
        assert _line(engine) == "bound"
        wait_for(lambda: observer.status("7")[0] == "connected", what="instance 7 connected")
        wait_for(lambda: observer.snapshot()["instances"]["7"]["topic_mismatch"] > 0, what="probes on 7's socket")
        engine.stdin.write("\n")
        engine.stdin.flush()
        assert _line(engine) == "sent"
        wait_for(lambda: observer.attributor("7").snapshot()["attributed"] == 19, what="19 blocks of 7")
        store_of(engines)  # the Store holds what alice's engine wrote: the confirmation books it
        engines.confirm_writes()
        keys = present_keys(engines.ledger)
        # mallory can neither read 7's socket (its directory is alice's, 0700) nor its seed
        python, env = python_for(mallory)
        peek = run_as(mallory, [*python, "-c", "import socket, sys; s = socket.socket(socket.AF_UNIX); "
                                "s.connect(sys.argv[1])", str(root / "7" / "kv-events.sock")],
                      env={**os.environ, **env}, cwd="/")
        assert peek.returncode != 0 and "PermissionError" in peek.stderr
        assert run_as(mallory, ["cat", str(root / "7" / "env")]).returncode != 0
        # mallory's own engine publishes forged events under 7's topic: they arrive on 8's socket, 8's topic is
        # "8", so they are dropped and counted, and nothing of them reaches 7 or the ledger
        forged = _engine(mallory, root / "8", retopic(frames(RUN), "7"), shared_tmp)
        procs.append(forged)
        assert _line(forged) == "bound"
        wait_for(lambda: observer.status("8")[0] == "connected", what="instance 8 connected")
        wait_for(lambda: observer.snapshot()["instances"]["8"]["topic_mismatch"] > 0, what="probes on 8's socket")
        # counted before the forged messages go out: the observer may drop all of them before "sent" is read
        before = observer.snapshot()["instances"]["8"]["topic_mismatch"]
        forged.stdin.write("\n")
        forged.stdin.flush()
        assert _line(forged) == "sent"
        wait_for(lambda: observer.snapshot()["instances"]["8"]["topic_mismatch"] >= before + len(frames(RUN)),
                 what="the forged messages counted")
        seven_stats, eight_stats = engines.instance_stats()
        assert seven_stats.attributed == 19 and seven_stats.blocks_seen == 19
        assert eight_stats.blocks_seen == 0 and present_keys(engines.ledger) == keys
        assert keys == set(meta(RUN)["store_keys"]["keys_present"])
    finally:
        for proc in procs:
            _finish(proc)
        engines.close()


def test_a_squatted_socket_is_refused_until_the_instance_s_engine_takes_its_place(shared_tmp, local_account):
    alice, squatter = local_account(), local_account()
    root = shared_tmp / "instances"
    engines = _engines(root, privileged=True)
    procs: list[subprocess.Popen[str]] = []
    try:
        (port,) = free_ports(1)
        engines.on_apply(document([spec("7").model_copy(update={"launch": _launch_as("7", alice.name)})], port))
        observer = engines.observer
        os.chmod(root / "7", 0o777)  # a misconfigured directory: the squatter gets in first
        squat = _engine(squatter, root / "7", [], shared_tmp)
        procs.append(squat)
        assert _line(squat) == "bound"
        wait_for(lambda: observer.status("7")[0] == "refused", what="the squatter refused")
        assert "writable by group or others" in observer.status("7")[1]
        os.chmod(root / "7", 0o700)  # directory fixed: the socket is still the squatter's
        wait_for(lambda: "belongs to uid" in observer.status("7")[1], what="the socket's owner refused")
        (stats,) = engines.instance_stats()
        assert stats.events_status == "refused" and stats.events_refusals >= 2 and observer.received == 0
        engine = _engine(alice, root / "7", retopic(frames(RUN), "7"), shared_tmp)  # binds over the squatter's
        procs.append(engine)
        assert _line(engine) == "bound"
        wait_for(lambda: observer.status("7")[0] == "connected", what="the retry to connect to alice's engine")
        assert (root / "7" / "kv-events.sock").stat().st_uid == alice.uid
        wait_for(lambda: observer.snapshot()["instances"]["7"]["topic_mismatch"] > 0, what="probes")
        engine.stdin.write("\n")
        engine.stdin.flush()
        assert _line(engine) == "sent"
        wait_for(lambda: observer.attributor("7").snapshot()["attributed"] == 19, what="attribution")
        with socket.socket(socket.AF_UNIX) as probe:  # the squatter's socket is gone from the path
            probe.connect(str(root / "7" / "kv-events.sock"))
    finally:
        for proc in procs:
            _finish(proc)
        engines.close()
