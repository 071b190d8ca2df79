"""Debian's Prometheus 2.42 in tests: the deploy/prometheus/ and deploy/grafana/ files, promtool, a private server.

``promtool()`` / ``prometheus_binary()`` fail the test (never skip) when the package is missing: scripts/bootstrap.sh
installs it. ``scrape_config(...)`` is the shipped ``deploy/prometheus/prometheus.yml`` with what its comments say to
fill in filled in (targets, the token file) and the rules file named by absolute path. ``PrometheusServer`` runs the
real binary on a free loopback port with a private data directory and answers instant queries.
"""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from agent.sim.master import free_ports
from tests.support.paths import ROOT
from tests.support.waiting import wait_for

PROMETHEUS_DIR = ROOT / "deploy" / "prometheus"
CONFIG = PROMETHEUS_DIR / "prometheus.yml"
RULES = PROMETHEUS_DIR / "rules" / "kvpool.rules.yml"
RULE_TESTS = PROMETHEUS_DIR / "tests"
GRAFANA_DASHBOARD = ROOT / "deploy" / "grafana" / "kvpool.json"


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} is missing: install Debian's prometheus (scripts/bootstrap.sh does when root)")
    return path


def promtool() -> str:
    return _tool("promtool")


def prometheus_binary() -> str:
    return _tool("prometheus")


def alert_rules() -> list[dict[str, Any]]:
    """Every alerting rule of ``RULES`` (dicts as in the file), in file order."""
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"] if "alert" in rule]


def scrape_config(token_file: Path, *, dashboard: str, master: str, interval: str = "15s",
                  engines_dir: Path | None = None) -> dict[str, Any]:
    """The shipped config with its FILL IN fields filled: ``dashboard`` / ``master`` (``host:port``) as the
    dashboard's and the master's targets, ``token_file`` as the dashboard's bearer credentials file, ``interval`` as
    scrape and evaluation interval, ``engines_dir`` (default: none; the job then has no targets) as the vLLM
    file_sd directory. Raises ``KeyError`` when the shipped file lost one of its jobs."""
    config = yaml.safe_load(CONFIG.read_text())
    config["global"].update(scrape_interval=interval, evaluation_interval=interval, scrape_timeout=interval)
    config["rule_files"] = [str(PROMETHEUS_DIR / name) for name in config["rule_files"]]
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    jobs["kvpool-dashboard"]["authorization"]["credentials_file"] = str(token_file)
    jobs["kvpool-dashboard"]["static_configs"] = [{"targets": [dashboard]}]
    jobs["mooncake-master"]["static_configs"] = [{"targets": [master]}]
    engines = engines_dir or token_file.parent / "no-engines"
    jobs["vllm"]["file_sd_configs"] = [{"files": [str(engines / "*.json")]}]
    return config


def grafana_queries() -> list[tuple[str, str]]:
    """``(panel title, expr)`` of every Prometheus target of every panel of the Grafana dashboard (rows included)."""
    dashboard = json.loads(GRAFANA_DASHBOARD.read_text())
    found = []

    def walk(panels):
        for panel in panels:
            for target in panel.get("targets", []):
                if target.get("expr"):
                    found.append((panel["title"], target["expr"]))
            walk(panel.get("panels", []))

    walk(dashboard["panels"])
    return found


def grafana_variables() -> list[tuple[str, str, str]]:
    """``(variable, selector, label)`` of every ``label_values(selector, label)`` template variable."""
    dashboard = json.loads(GRAFANA_DASHBOARD.read_text())
    found = []
    for variable in dashboard["templating"]["list"]:
        query = variable.get("query")
        text = query.get("query", "") if isinstance(query, dict) else ""
        match = re.fullmatch(r"label_values\((.+), (\w+)\)", text)
        if match:
            found.append((variable["name"], match.group(1), match.group(2)))
    return found


def grafana_annotations() -> list[tuple[str, str]]:
    """``(name, expr)`` of the dashboard's Prometheus annotations."""
    dashboard = json.loads(GRAFANA_DASHBOARD.read_text())
    return [(item["name"], item["expr"]) for item in dashboard["annotations"]["list"] if item.get("expr")]


def expand_grafana(expr: str, *, rate_interval: str = "1m") -> str:
    """``expr`` with the dashboard's template variables as Grafana expands them for "All" (``.*``) and
    ``$__rate_interval`` / ``$__range`` as ``rate_interval``."""
    expr = expr.replace("$__rate_interval", rate_interval).replace("$__range", rate_interval)
    expr = expr.replace("$__interval", rate_interval)
    return re.sub(r"\$\{?(tenant|model|namespace|group|node)\}?", ".*", expr)


class PrometheusServer:
    """``prometheus`` on a free 127.0.0.1 port with ``config`` (a dict) and a private TSDB under ``workdir``."""

    def __init__(self, workdir: Path, config: dict[str, Any]) -> None:
        self.workdir = workdir
        self.config_path = workdir / "prometheus.yml"
        self.config_path.write_text(yaml.safe_dump(config, sort_keys=False))
        self.port = free_ports(1)[0]
        self.proc: subprocess.Popen | None = None
        self.log_path = workdir / "prometheus.log"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> PrometheusServer:
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [prometheus_binary(), f"--config.file={self.config_path}",
                 f"--storage.tsdb.path={self.workdir / 'tsdb'}", f"--web.listen-address=127.0.0.1:{self.port}"],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        wait_for(self._ready, 60, f"prometheus on port {self.port}", interval=0.2)
        return self

    def _ready(self) -> bool:
        if self.proc is not None and self.proc.poll() is not None:
            pytest.fail(f"prometheus exited with {self.proc.returncode}:\n{self.log()[-3000:]}")
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as response:
                return response.status == 200
        except OSError:
            return False

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def query(self, expr: str) -> list[dict[str, Any]]:
        """The instant vector (``[{"metric": {...}, "value": [ts, "v"]}]``) of ``expr`` now; fails the test on a
        query error (a bad expression in a rule or a panel)."""
        url = f"{self.url}/api/v1/query?{urllib.parse.urlencode({'query': expr})}"
        try:
            with urllib.request.urlopen(url, timeout=30) as response:
                body = json.load(response)
        except urllib.error.HTTPError as exc:
            pytest.fail(f"query {expr!r} refused: {exc.read().decode(errors='replace')}")
        if body.get("status") != "success":
            pytest.fail(f"query {expr!r} failed: {body}")
        result = body["data"]["result"]
        return result if isinstance(result, list) else [result]

    def targets(self) -> list[dict[str, Any]]:
        with urllib.request.urlopen(f"{self.url}/api/v1/targets", timeout=10) as response:
            return json.load(response)["data"]["activeTargets"]

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self.proc = None
