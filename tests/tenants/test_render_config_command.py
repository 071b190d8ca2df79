"""``manage.py render_config``: prints or writes the rendered configuration; clear errors otherwise."""
from __future__ import annotations

import json
import shlex
import subprocess
from io import StringIO

import pytest
import yaml
from django.core.management import CommandError, call_command

from tests.support.factories import (
    make_assignment,
    make_model,
    make_node,
    make_release,
    make_tenant,
)

pytestmark = pytest.mark.django_db


def _run(*args: str) -> str:
    out = StringIO()
    call_command("render_config", *args, stdout=out)
    return out.getvalue()


def test_prints_every_instance_by_namespace(release):
    a = make_assignment(make_node("node-a"), release, role="prefill")
    b = make_assignment(make_node("node-b"), release, role="decode")
    text = _run("--release", "production-2026-07")
    lines = [line for line in text.splitlines() if "vllm.entrypoints.openai.api_server" in line]
    assert len(lines) == 2 and f"# assignment {a.pk}:" in text and f"# assignment {b.pk}:" in text
    assert "MooncakeStoreConnector" in text and "MultiConnector" in text
    argv = shlex.split(lines[0])
    assert argv[argv.index("--model") + 1] == "Qwen/Qwen3-8B"


def test_single_assignment_by_id(release):
    make_assignment(make_node("node-a"), release)
    b = make_assignment(make_node("node-b"), release, port=9000)
    text = _run("--release", str(release.pk), "--assignment", str(b.pk))
    assert text.count("vllm.entrypoints.openai.api_server") == 1 and "--port 9000" in text


def test_writes_files_and_launch_scripts(release, tmp_path):
    assignment = make_assignment(make_node(), release)
    _run("--release", "production-2026-07", "--out", str(tmp_path))
    config = json.loads((tmp_path / str(assignment.pk) / "mooncake.json").read_text())
    assert config["tenant_id"] == "acme"
    script = tmp_path / str(assignment.pk) / "launch.sh"
    text = script.read_text()
    assert f"export MOONCAKE_CONFIG_PATH={tmp_path}/{assignment.pk}/mooncake.json" in text
    assert 'exec "${KVPOOL_ENGINE_PYTHON:-python3}" -m vllm.entrypoints.openai.api_server --model' in text
    subprocess.run(["sh", "-n", str(script)], check=True)


def test_master(tenant, tmp_path):
    assert "--enable_multi_tenants=true" in _run("--master")
    _run("--master", "--out", str(tmp_path))
    quotas = yaml.safe_load((tmp_path / "tenant_quotas.yaml").read_text())
    assert quotas["tenants"] == [{"name": "acme", "quota": "200GB"}]
    assert (tmp_path / "master" / "launch.sh").exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--release", "nope"), "No release with id or namespace 'nope'."),
        (("--release", "production-2026-07"), "has no instance assignments yet"),
        (("--release", "production-2026-07", "--assignment", "999"), "does not belong to release"),
        (("--master", "--assignment", "1"), "--assignment applies to --release"),
    ],
)
def test_errors(release, args, message):
    with pytest.raises(CommandError, match=message):
        _run(*args)


def test_ambiguous_namespace(release):
    make_release(make_model(make_tenant("other")), "production-2026-07")
    with pytest.raises(CommandError, match="is used by several releases"):
        _run("--release", "production-2026-07")


@pytest.mark.parametrize("selector", ["²", "١٢", "99999999999999999999"])
def test_release_selector_with_non_ascii_or_huge_digits(release, selector):
    """``"²".isdigit()`` is True but ``int("²")`` fails: such selectors are namespaces, not ids (no traceback)."""
    with pytest.raises(CommandError, match="No release with id or namespace"):
        _run("--release", selector)


@pytest.mark.parametrize("value", ["²", "x", "99999999999999999999", "-1"])
def test_assignment_must_be_ascii_id(release, value):
    make_assignment(make_node(), release)
    with pytest.raises(CommandError, match="--assignment must be an instance assignment id"):
        _run("--release", str(release.pk), "--assignment", value)


@pytest.mark.parametrize(
    ("out", "message"),
    [
        ("", "--out needs a directory path"),
        ("   ", "--out needs a directory path"),
        ("/etc/passwd", "exists and is not a directory"),
        ("/etc/passwd/sub", "cannot create directory"),
        ("/proc/nope", "cannot create directory"),
    ],
)
def test_bad_out_directory(release, out, message):
    make_assignment(make_node(), release)
    with pytest.raises(CommandError, match=message):
        _run("--release", str(release.pk), "--out", out)
