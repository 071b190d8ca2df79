"""``manage.py render_config``: print or write the engine (or master, or a node's store client) configuration the
registry implies."""
from __future__ import annotations

import os
import shlex
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from tenants.models import Node, Release, Tenant
from tenants.rendering import (
    ENGINE_PYTHON,
    RenderedConfig,
    RenderTarget,
    render_assignment,
    render_masters,
    render_store_client,
)
from tenants.validators import parse_object_id


def find_release(selector: str) -> Release:
    """A release by primary key or by namespace; an ambiguous namespace is refused with the candidates."""
    releases = Release.objects.select_related("model__tenant")
    release_id = parse_object_id(selector)
    if release_id is not None:
        release = releases.filter(pk=release_id).first()
        if release is not None:
            return release
    matches = list(releases.filter(namespace=selector))
    if not matches:
        raise CommandError(f"No release with id or namespace '{selector}'.")
    if len(matches) > 1:
        listing = ", ".join(f"{r.pk} ({r.model.tenant}/{r.model.served_model_name})" for r in matches)
        raise CommandError(f"Namespace '{selector}' is used by several releases: {listing}; pass the id instead.")
    return matches[0]


def output_dir(raw: str | None) -> Path | None:
    """The ``--out`` directory, absolute and created if missing; ``None`` when ``--out`` was not given.

    Raises ``CommandError`` for an empty value, a path that exists but is not a directory (``/etc/passwd``), or
    a directory that cannot be created (``/proc/nope``: read-only file system, permission denied, ...).
    """
    if raw is None:
        return None
    if not raw.strip():
        raise CommandError("--out needs a directory path; omit --out to print the configuration instead.")
    out = Path(raw).expanduser().resolve()
    if out.exists() and not out.is_dir():
        raise CommandError(f"--out {out} exists and is not a directory; pass a directory to write into.")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise CommandError(f"--out: cannot create directory {out}: {error.strerror or error}.") from None
    return out


def launch_script(config: RenderedConfig, comments: tuple[str, ...] = ()) -> str:
    """A POSIX shell script that exports the environment and execs the command; an engine launch's
    ``argv[0] == "python"`` placeholder runs ``"${KVPOOL_ENGINE_PYTHON:-python3}"`` (the engine's interpreter).
    ``comments`` are extra ``#`` lines after the header."""
    lines = ["#!/bin/sh", f"# rendered by manage.py render_config: {config.kind}", *(f"# {c}" for c in comments),
             "set -e"]
    lines += [f"export {name}={shlex.quote(value)}" for name, value in sorted(config.env.items())]
    argv = list(config.argv)
    if config.instance_id and argv and argv[0] == ENGINE_PYTHON:
        lines.append('exec "${KVPOOL_ENGINE_PYTHON:-python3}" ' + shlex.join(argv[1:]))
    else:
        lines.append(f"exec {config.command_line}")
    return "\n".join(lines) + "\n"


def _rendered(render, *args) -> RenderedConfig:
    """``render(*args)``, with the renderers' ``ValueError`` for unusable input (``KVPOOL_MASTER_ADDRESS=nohost``:
    "master_server_address 'nohost' must be 'host:port'") turned into a one-line ``CommandError`` (exit status 1)."""
    try:
        return render(*args)
    except ValueError as error:
        raise CommandError(f"cannot render the configuration: {error}.") from None


class Command(BaseCommand):
    help = (
        "Render the SGLang/vLLM command line and config files of a release's instance assignments "
        "(or, with --master, the mooncake_master flags and tenant_quotas.yaml, one launch per master in HA mode; "
        "with --node, a standalone-store "
        "node's mooncake_client command line and its kv_events_port)."
    )

    def add_arguments(self, parser):
        target = parser.add_mutually_exclusive_group(required=True)
        target.add_argument("--release", help="Release id or namespace.")
        target.add_argument("--master", action="store_true", help="Render the Mooncake master instead.")
        target.add_argument("--node", help="Node name: render its mooncake_client (standalone-store nodes).")
        parser.add_argument("--assignment", help="Only this instance assignment id of the release.")
        parser.add_argument(
            "--out",
            help="Write files under this directory (config files, and launch.sh per instance) instead of printing.",
        )

    def handle(self, *args, **options):
        out = output_dir(options["out"])
        endpoints = RenderTarget.from_settings(**({"config_dir": str(out)} if out else {}))
        if options["node"] is not None:
            if options["assignment"] is not None:
                raise CommandError("--assignment applies to --release, not --node.")
            return self._node(options["node"], endpoints, out)
        if options["master"]:
            if options["assignment"] is not None:
                raise CommandError("--assignment applies to --release, not --master.")
            configs = [(None, config) for config in _rendered(render_masters, Tenant.objects.all(), endpoints)]
        else:
            release = find_release(options["release"])
            assignments = release.assignments.select_related("node", "release__model__tenant").order_by(
                "node__name", "port"
            )
            if options["assignment"] is not None:
                assignment_id = parse_object_id(options["assignment"])
                if assignment_id is None:
                    raise CommandError(
                        f"--assignment must be an instance assignment id (a positive integer), "
                        f"not {options['assignment']!r}."
                    )
                assignments = assignments.filter(pk=assignment_id)
                if not assignments.exists():
                    raise CommandError(
                        f"Instance assignment {options['assignment']} does not belong to release "
                        f"'{release.namespace}' (id {release.pk})."
                    )
            configs = [(a, _rendered(render_assignment, a, endpoints)) for a in assignments]
            if not configs:
                raise CommandError(
                    f"Release '{release.namespace}' has no instance assignments yet; assign it to a node first."
                )
        for assignment, config in configs:
            if out is None:
                self._print(assignment, config)
                continue
            try:
                self._write(out, assignment, config)
            except OSError as error:
                where = error.filename or out
                raise CommandError(f"--out: cannot write {where}: {error.strerror or error}.") from None

    def _node(self, name: str, endpoints: RenderTarget, out: Path | None) -> None:
        """Print (or write as ``<out>/store-client/launch.sh``) ``node``'s ``mooncake_client`` command line with its
        ``kv_events_port``; an unknown name or an embedded-store node is a ``CommandError``."""
        node = Node.objects.filter(name=name).first()
        if node is None:
            known = ", ".join(Node.objects.order_by("name").values_list("name", flat=True)[:20]) or "none"
            raise CommandError(f"--node: no node named '{name}' (nodes: {known}).")
        config = _rendered(render_store_client, node, endpoints)
        if config is None:
            raise CommandError(
                f"Node '{node.name}' is an embedded-store node: each engine mounts its own segment, so it runs no "
                "mooncake_client."
            )
        comment = (f"node {node.name} (KV events: one ipc://kv-events.sock per instance, in its directory; "
                   "kv_events_port is not used)")
        if out is None:
            self.stdout.write(f"# mooncake_client of {comment}")
            self.stdout.write(config.shell_line)
            return
        script = out / "store-client" / "launch.sh"
        try:
            script.parent.mkdir(parents=True, exist_ok=True)
            script.write_text(launch_script(config, (comment,)), encoding="utf-8")
            os.chmod(script, 0o755)
        except OSError as error:
            raise CommandError(f"--out: cannot write {error.filename or script}: {error.strerror or error}.") from None
        self.stdout.write(f"wrote {script}")

    def _print(self, assignment, config: RenderedConfig) -> None:
        title = config.kind if assignment is None else f"assignment {assignment.pk}: {assignment}"
        if "master_index" in config.meta:
            title += f" {config.meta['master_index']} of the HA set ({config.meta['rpc_address']})"
        self.stdout.write(f"# {title}")
        for path, content in config.files.items():
            self.stdout.write(f"# --- file {path}\n{content.rstrip()}")
        self.stdout.write(config.shell_line)

    def _write(self, out: Path, assignment, config: RenderedConfig) -> None:
        for path, content in config.files.items():
            target = Path(path)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(content, encoding="utf-8")
            self.stdout.write(f"wrote {target}")
        script_dir = out / ("master" if assignment is None else config.instance_id)
        if "master_index" in config.meta:  # an HA set: master-0/, master-1/, ...
            script_dir = out / f"master-{config.meta['master_index']}"
        script_dir.mkdir(parents=True, exist_ok=True)
        script = script_dir / "launch.sh"
        script.write_text(launch_script(config), encoding="utf-8")
        os.chmod(script, 0o755)
        self.stdout.write(f"wrote {script}")
