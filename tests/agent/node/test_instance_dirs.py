"""Instance directories (agent.node.instance_dirs): exact files and modes, awkward values through a real shell
and systemd's EnvironmentFile grammar, atomic replacement, removal of instances that left the document."""
from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from agent.node import instance_dirs
from agent.node.instance_dirs import (
    InstanceDirError,
    InstanceLaunch,
    env_file,
    read_launch,
    write_instance_dirs,
)

AWKWARD = [
    "plain",
    "it's",
    'say "hi"',
    "$HOME and ${PATH} and $(id) and `id`",
    "back\\slash\\",
    "new\nline\n",
    "  spaces  ",
    "tab\there",
    "ü ∑ 😀",
    "semi;colon & amp | pipe > gt < lt * star ? q [a] ~tilde #hash",
    "",
    "-m",
    "--flag=value with space",
    '{"json": ["x", 1], "q": "\'"}',
    "\\\n",
    "'\"'\"'",
    "!bang",
]

FAKE_PYTHON = """#!{python}
import json, os, sys
print(json.dumps({{"argv": sys.argv[1:], "env": {{k: v for k, v in os.environ.items() if k.startswith("T_") or
                                                    k == "MOONCAKE_CONFIG_PATH"}}}}))
"""


def _launch(instance_id: str = "7", **overrides) -> dict:
    data = {
        "instance_id": instance_id,
        "argv": ["python", "-m", "vllm.entrypoints.openai.api_server", "--model", "/m/tiny-llama",
                 "--kv-events-config", '{"endpoint":"tcp://127.0.0.1:5557","topic":"7"}'],
        "env": {"PYTHONHASHSEED": "42", "T_A": "a"},
        "file_env": {"MOONCAKE_CONFIG_PATH": "mooncake.json"},
        "files": {"mooncake.json": '{"mode": "embedded"}\n'},
    }
    data.update(overrides)
    return data


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _fake_python(tmp_path: Path) -> Path:
    fake = tmp_path / "fake-python"
    fake.write_text(FAKE_PYTHON.format(python=sys.executable))
    fake.chmod(0o755)
    return fake


def systemd_env_file(text: str) -> dict[str, str]:
    """The subset of systemd's EnvironmentFile parser (src/basic/env-file.c) the writer relies on: ``NAME="..."``
    with ``\\`` escaping one of ``"\\`$`` (any other escaped character keeps its backslash), backslash-newline
    as a line continuation, literal newlines kept inside the quotes."""
    out: dict[str, str] = {}
    i = 0
    while i < len(text):
        if text[i] == "\n":
            i += 1
            continue
        eq = text.index("=", i)
        name = text[i:eq]
        assert text[eq + 1] == '"', "the writer always double-quotes"
        j = eq + 2
        value = []
        while text[j] != '"':
            if text[j] == "\\":
                nxt = text[j + 1]
                if nxt == "\n":
                    pass
                elif nxt in '"\\`$':
                    value.append(nxt)
                else:
                    value.extend(["\\", nxt])
                j += 2
            else:
                value.append(text[j])
                j += 1
        out[name] = "".join(value)
        i = j + 1
        assert i >= len(text) or text[i] == "\n"
    return out


def test_writes_the_expected_directory(tmp_path):
    root = tmp_path / "instances"
    (path,) = write_instance_dirs(root, [_launch()])
    assert path == root / "7"
    assert sorted(p.name for p in path.iterdir()) == ["env", "launch.json", "launch.sh", "mooncake.json"]
    # the seed (PYTHONHASHSEED) is in env, launch.json and launch.sh: readable by the instance's account alone
    assert _mode(root) == 0o711 and _mode(path) == 0o700 and _mode(path / "launch.sh") == 0o700
    assert all(_mode(path / name) == 0o600 for name in ("env", "launch.json", "mooncake.json"))
    assert (path / "mooncake.json").read_text() == '{"mode": "embedded"}\n'
    launch = read_launch(path)
    assert launch == {"instance_id": "7", "argv": _launch()["argv"], "cwd": str(path), "user": "",
                      "env": {"PYTHONHASHSEED": "42", "T_A": "a", "MOONCAKE_CONFIG_PATH": str(path / "mooncake.json"),
                              "VLLM_RPC_BASE_PATH": "."}}  # vLLM's ipc sockets in the private directory
    script = (path / "launch.sh").read_text()
    assert script.startswith("#!/bin/sh\n") and "\nset -e\numask 077\n" in script
    assert f"\ncd {path}\n" in script  # the engine binds its ipc:// KV-event socket in its instance directory
    assert f"export MOONCAKE_CONFIG_PATH={path}/mooncake.json\n" in script
    assert script.rstrip().endswith(
        """exec "${KVPOOL_ENGINE_PYTHON:-python3}" -m vllm.entrypoints.openai.api_server --model /m/tiny-llama """
        """--kv-events-config '{"endpoint":"tcp://127.0.0.1:5557","topic":"7"}'""")
    assert systemd_env_file((path / "env").read_text()) == launch["env"]


def test_awkward_values_survive_sh_and_systemd(tmp_path):
    env = {f"T_{i}": value for i, value in enumerate(AWKWARD)}
    argv = ["python", *AWKWARD]
    (path,) = write_instance_dirs(tmp_path / "root", [_launch(argv=argv, env=env)])
    subprocess.run(["sh", "-n", str(path / "launch.sh")], check=True)
    run_env = {"PATH": os.environ["PATH"], "KVPOOL_ENGINE_PYTHON": str(_fake_python(tmp_path)), "HOME": "/nonexistent"}
    result = subprocess.run([str(path / "launch.sh")], env=run_env, capture_output=True, text=True, check=True)
    seen = json.loads(result.stdout)
    assert seen["argv"] == AWKWARD
    assert seen["env"] == {**env, "MOONCAKE_CONFIG_PATH": str(path / "mooncake.json")}
    # the env file: systemd's grammar, and a POSIX shell sourcing it, give the same values back
    expected = read_launch(path)["env"]
    assert systemd_env_file((path / "env").read_text()) == expected
    dump = "import json, os; print(json.dumps({k: os.environ[k] for k in json.loads(os.environ['WANT'])}))"
    sourced = subprocess.run(["sh", "-c", f'set -a; . "$1"; exec "{sys.executable}" -c "$2"', "sh",
                              str(path / "env"), dump],
                             env={"PATH": os.environ["PATH"], "WANT": json.dumps(sorted(expected))},
                             capture_output=True, text=True, check=True)
    assert json.loads(sourced.stdout) == expected


def test_default_interpreter_and_plain_commands(tmp_path):
    (py,) = write_instance_dirs(tmp_path / "a", [_launch(argv=["python", "-c", "print('ok from python3')"],
                                                         file_env={}, files={})])
    out = subprocess.run([str(py / "launch.sh")], env={"PATH": os.environ["PATH"]}, capture_output=True, text=True,
                         check=True)
    assert out.stdout == "ok from python3\n"
    (echo,) = write_instance_dirs(tmp_path / "b", [_launch(argv=["/bin/echo", "a b", "$X"], file_env={}, files={})])
    assert (echo / "launch.sh").read_text().rstrip().endswith("exec /bin/echo 'a b' '$X'")
    out = subprocess.run([str(echo / "launch.sh")], capture_output=True, text=True, check=True)
    assert out.stdout == "a b $X\n"


@pytest.mark.parametrize("exchange", [True, False])
def test_replaces_changed_directories_and_keeps_unchanged_ones(tmp_path, monkeypatch, exchange):
    if not exchange:
        monkeypatch.setattr(instance_dirs, "_exchange", lambda a, b: False)
    root = tmp_path / "root"
    write_instance_dirs(root, [_launch(), _launch("8")])
    untouched_inode = (root / "8" / "launch.sh").stat().st_ino
    old_inode = (root / "7").stat().st_ino
    changed = _launch(files={"mooncake.json": "{}\n", "extra.txt": "x"}, env={"T_A": "b"})
    write_instance_dirs(root, [changed, _launch("8")])
    assert (root / "7").stat().st_ino != old_inode
    assert (root / "7" / "extra.txt").read_text() == "x" and read_launch(root / "7")["env"]["T_A"] == "b"
    assert (root / "8" / "launch.sh").stat().st_ino == untouched_inode  # unchanged: not rewritten
    # nothing left beside the instance directories
    assert sorted(p.name for p in root.iterdir()) == ["7", "8"]
    # a file dropped from the launch leaves the directory
    write_instance_dirs(root, [_launch(), _launch("8")])
    assert not (root / "7" / "extra.txt").exists()


def test_removes_instances_no_longer_in_the_document_only(tmp_path):
    root = tmp_path / "root"
    write_instance_dirs(root, [_launch("1"), _launch("2")])
    (root / "master").mkdir()  # not an instance directory (no launch.json): kept
    (root / "tenant_quotas.yaml").write_text("version: 1\n")
    (root / ".kvpool-tmp-3-crashed").mkdir()  # a crashed write: removed
    assert write_instance_dirs(root, [_launch("2")]) == [root / "2"]
    assert sorted(p.name for p in root.iterdir()) == ["2", "master", "tenant_quotas.yaml"]
    assert write_instance_dirs(root, []) == []
    assert sorted(p.name for p in root.iterdir()) == ["master", "tenant_quotas.yaml"]


def test_accepts_launch_spec_objects(tmp_path):
    from tenants.rendering.types import LaunchSpec

    spec = LaunchSpec(instance_id="12", argv=("python", "-V"), env={"A": "1"},
                      file_env={"MOONCAKE_CONFIG_PATH": "mooncake.json"}, files={"mooncake.json": "{}"})
    (path,) = write_instance_dirs(tmp_path, [spec])
    assert read_launch(path)["env"] == {"A": "1", "MOONCAKE_CONFIG_PATH": str(path / "mooncake.json"),
                                        "VLLM_RPC_BASE_PATH": "."}
    assert InstanceLaunch.from_value(spec.to_dict()) == InstanceLaunch.from_value(spec)


@pytest.mark.parametrize(("change", "message"), [
    ({"instance_id": ""}, "instance id"),
    ({"instance_id": "../x"}, "instance id"),
    ({"instance_id": ".hidden"}, "instance id"),
    ({"argv": []}, "argv"),
    ({"argv": "python -V"}, "argv"),
    ({"env": {"BAD NAME": "x"}}, "invalid environment variable name"),
    ({"env": {"A": "nul\0"}}, "without NUL"),
    ({"files": {"../escape": "x"}}, "invalid file name"),
    ({"files": {"launch.sh": "x"}}, "invalid file name"),
    ({"file_env": {"MOONCAKE_CONFIG_PATH": "missing.json"}}, "not one of its files"),
])
def test_refuses_unsafe_launches_before_writing_anything(tmp_path, change, message):
    with pytest.raises(InstanceDirError, match=message):
        write_instance_dirs(tmp_path / "root", [_launch("1"), {**_launch("2"), **change}])
    assert not (tmp_path / "root").exists()


def test_refuses_duplicate_ids(tmp_path):
    with pytest.raises(InstanceDirError, match="appears twice"):
        write_instance_dirs(tmp_path, [_launch("1"), _launch("1")])


def test_env_file_escapes():
    assert env_file({"B": 'a"b$c`d\\e', "A": "x\ny"}) == 'A="x\ny"\nB="a\\"b\\$c\\`d\\\\e"\n'


def test_a_bound_socket_survives_a_rewrite_and_does_not_count_as_a_change(tmp_path):
    import socket

    root = tmp_path / "root"
    (path,) = write_instance_dirs(root, [_launch()])
    engine = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    engine.bind(str(path / "kv-events.sock"))  # what the engine's PUB does in its working directory
    engine.listen(1)
    try:
        inode = (path / "launch.sh").stat().st_ino
        write_instance_dirs(root, [_launch()])
        assert (path / "launch.sh").stat().st_ino == inode  # the socket is no change: nothing rewritten
        write_instance_dirs(root, [_launch(env={"T_A": "changed"})])
        assert (path / "launch.sh").stat().st_ino != inode and read_launch(path)["env"]["T_A"] == "changed"
        client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        client.connect(str(path / "kv-events.sock"))  # the running engine is still reachable at its path
        client.close()
    finally:
        engine.close()


def test_an_unknown_account_gets_a_launch_that_refuses_to_start(tmp_path):
    from agent.node.accounts import AccountError

    why = AccountError("account 'kvpool-t9' does not exist on this node")
    (path,) = write_instance_dirs(tmp_path / "root", [_launch()], accounts={"7": why})
    result = subprocess.run([str(path / "launch.sh")], capture_output=True, text=True)
    assert result.returncode == 1 and "kvpool-t9' does not exist on this node" in result.stderr
    assert "exec" not in (path / "launch.sh").read_text()


def test_launch_sh_refuses_another_uid(tmp_path):
    from agent.node.accounts import Account

    other = Account(name="someone", uid=os.geteuid() + 4242, gid=os.getegid())
    (path,) = write_instance_dirs(tmp_path / "root", [_launch(argv=["/bin/echo", "started"])],
                                  accounts={"7": other} if os.geteuid() != 0 else {})
    if os.geteuid() == 0:  # root may not give files to a uid without an account: check the script text instead
        script = instance_dirs.launch_script(InstanceLaunch.from_value(_launch()), path, other)
        assert f'[ "$(id -u)" = {other.uid} ] ||' in script
        return
    result = subprocess.run([str(path / "launch.sh")], capture_output=True, text=True)
    assert result.returncode == 1 and f"uid {other.uid}" in result.stderr and "started" not in result.stdout


def test_instance_files_are_readable_by_their_account_only(shared_tmp, local_account):
    """As root: the directory belongs to the instance's account; another local account can read nothing of it
    (the seed in env / launch.json / launch.sh), nor list it, nor create a file (a socket) in it."""
    from tests.support.accounts import run_as

    engine, other = local_account(), local_account()
    root = shared_tmp / "root"
    (path,) = write_instance_dirs(root, [_launch(argv=["/bin/sh", "-c", "echo started as $(id -u)"],
                                                 user=engine.name)], accounts={"7": engine})
    info = path.stat()
    assert (info.st_uid, info.st_gid) == (engine.uid, engine.gid)
    assert all((path / n).stat().st_uid == engine.uid for n in ("env", "launch.json", "launch.sh", "mooncake.json"))
    for name in ("env", "launch.json", "launch.sh", "mooncake.json"):
        denied = run_as(other, ["cat", str(path / name)])
        assert denied.returncode != 0 and "Permission denied" in denied.stderr and "42" not in denied.stdout
    assert run_as(other, ["ls", str(path)]).returncode != 0
    assert run_as(other, ["touch", str(path / "kv-events.sock")]).returncode != 0
    assert run_as(engine, ["cat", str(path / "env")]).stdout.count("PYTHONHASHSEED") == 1
    started = run_as(engine, [str(path / "launch.sh")])
    assert started.returncode == 0 and started.stdout.strip() == f"started as {engine.uid}"
    refused = run_as(other, [str(path / "launch.sh")])
    assert refused.returncode != 0 and "started" not in refused.stdout


def test_vllm_sockets_live_in_the_instance_directory_unless_the_launch_says_otherwise(tmp_path):
    """vLLM's lookup socket is one path per host in the temp directory: two instances answered each other's Store
    lookups. Each instance gets its own (its directory, ``VLLM_RPC_BASE_PATH=.``); a rendered value still wins."""
    first, second = write_instance_dirs(tmp_path, [_launch(instance_id="7"), _launch(instance_id="8")])
    for path in (first, second):
        assert read_launch(path)["env"]["VLLM_RPC_BASE_PATH"] == "."
        assert "\nexport VLLM_RPC_BASE_PATH=.\n" in (path / "launch.sh").read_text()
    (own,) = write_instance_dirs(tmp_path / "other", [_launch(env={"VLLM_RPC_BASE_PATH": "/run/x"})])
    assert read_launch(own)["env"]["VLLM_RPC_BASE_PATH"] == "/run/x"
