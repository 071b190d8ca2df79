"""deploy/prometheus/ checked by Debian's promtool: the scrape config, the alert rules and their unit tests.

The alert expressions against a real dashboard: tests/integration/test_prometheus_scrape.py.
"""
from __future__ import annotations

import re
import subprocess

import yaml

from dashboard.checklist import CHECKS
from tests.support.prometheus import CONFIG, RULE_TESTS, RULES, alert_rules, promtool, scrape_config


def _promtool(*args: str, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([promtool(), *args], capture_output=True, text=True, timeout=120, cwd=cwd)


def test_promtool_accepts_the_shipped_config_once_its_token_file_exists(tmp_path):
    done = _promtool("check", "config", str(CONFIG))  # as shipped: only the token file is missing
    assert done.returncode != 0 and "kvpool-metrics.token" in done.stdout + done.stderr
    token = tmp_path / "token"
    token.write_text("secret\n")
    filled = tmp_path / "prometheus.yml"
    filled.write_text(yaml.safe_dump(scrape_config(token, dashboard="dash:8000", master="master:9003")))
    done = _promtool("check", "config", str(filled))
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(alert_rules())} rules found" in done.stdout  # the rules file it names was read


def test_promtool_accepts_the_rules():
    done = _promtool("check", "rules", str(RULES))
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(alert_rules())} rules found" in done.stdout


def test_rule_unit_tests_pass():
    files = sorted(RULE_TESTS.glob("*.yml"))
    done = _promtool("test", "rules", *[path.name for path in files], cwd=RULE_TESTS)
    assert files and done.returncode == 0, done.stdout + done.stderr


def test_every_alert_has_a_unit_test_with_a_firing_and_a_quiet_evaluation():
    tested: dict[str, list[bool]] = {}
    for path in RULE_TESTS.glob("*.yml"):
        for test in yaml.safe_load(path.read_text())["tests"]:
            for check in test.get("alert_rule_test", []):
                tested.setdefault(check["alertname"], []).append(bool(check.get("exp_alerts")))
    for rule in alert_rules():
        assert {True, False} <= set(tested.get(rule["alert"], [])), rule["alert"]


def test_every_alert_says_what_to_do_and_how_bad_it_is():
    for rule in alert_rules():
        assert rule["labels"]["severity"] in {"critical", "warning", "info"}, rule["alert"]
        assert rule["annotations"]["summary"] and len(rule["annotations"]["description"]) > 80, rule["alert"]


def test_every_check_of_the_checks_page_has_an_alert_or_is_named_as_without_a_family():
    """A check's key appears in an alert's description, or in the rules file's header among the checks that no
    family carries (they compare config history)."""
    text = RULES.read_text()
    header = text.split("groups:", 1)[0]
    described = " ".join(rule["annotations"]["description"] for rule in alert_rules())
    keys = {re.sub(r"^check_", "", check.__name__) for check in CHECKS}
    missing = sorted(key for key in keys if key not in described and key not in header)
    assert not missing
