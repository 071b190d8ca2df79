"""``manage.py render_config --node NAME``: a standalone-store node's ``mooncake_client`` command line (printed or
written as a launch script); embedded-store and unknown nodes are refused. KV events go over one ipc socket per
instance: the old per-node event port is named nowhere as if it were used."""
from __future__ import annotations

import os
import shlex
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from tenants.rendering import RenderTarget, render_store_client
from tests.support.factories import make_node

pytestmark = pytest.mark.django_db


def _run(*args: str) -> str:
    out = StringIO()
    call_command("render_config", *args, stdout=out)
    return out.getvalue()


@pytest.fixture
def standalone():
    return make_node("node-s", "10.0.0.7", store_mode="standalone-store", store_segment_bytes=8 << 30,
                     store_client_port=50077, kv_events_port=5599)


def test_prints_the_store_client_line_and_the_event_port(standalone):
    text = _run("--node", "node-s")
    comment, line = text.strip().splitlines()
    assert "ipc://kv-events.sock" in comment and "5599" not in comment
    argv = shlex.split(line)
    assert argv == list(render_store_client(standalone, RenderTarget.from_settings()).argv)
    assert "--host=10.0.0.7" in argv and "--port=50077" in argv and f"--global_segment_size={8 << 30}" in argv


def test_writes_a_launch_script(standalone, tmp_path):
    text = _run("--node", "node-s", "--out", str(tmp_path))
    script = tmp_path / "store-client" / "launch.sh"
    assert f"wrote {script}" in text and os.access(script, os.X_OK)
    body = script.read_text()
    assert "ipc://kv-events.sock" in body and "5599" not in body and "--global_segment_size=8589934592" in body
    assert body.splitlines()[-1].startswith("exec ") and "mooncake_client" in body.splitlines()[-1]


def test_embedded_and_unknown_nodes_are_refused(standalone):
    make_node("node-e", "10.0.0.8", kv_events_port=5601)
    with pytest.raises(CommandError, match="embedded-store node.*runs no mooncake_client"):
        _run("--node", "node-e")
    with pytest.raises(CommandError, match="no node named 'nope' \\(nodes: node-e, node-s\\)"):
        _run("--node", "nope")
    with pytest.raises(CommandError, match="--assignment applies to --release"):
        _run("--node", "node-s", "--assignment", "1")
