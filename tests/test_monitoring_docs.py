"""The sample dashboard and alert rules in docs/monitoring/ name only figures
the server serves: what runtime.metrics exposes, once something of each kind
was recorded, is read back in a process of its own (the figures are kept once
per process), and every ``owllayer_...`` name and label in the two files must
be among it."""
from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from runtime import metrics

ROOT = Path(__file__).resolve().parents[1]
MONITORING = ROOT / "docs" / "monitoring"
DASHBOARD = MONITORING / "grafana-dashboard.json"
ALERTS = MONITORING / "prometheus-alerts.yml"

NAME = re.compile(r"owllayer_[a-z_]+")
SELECTOR = re.compile(r"(owllayer_[a-z_]+)\{([^}]*)\}")
MATCHER = re.compile(r"([a-zA-Z_]+)\s*(?:=~|!~|!=|=)")
# Added by Prometheus to every series it scrapes.
TARGET_LABELS = {"instance", "job"}

ONE_OF_EACH = """
from runtime import metrics
metrics.session_opened()
metrics.session_refused("invalid_api_key")
metrics.turn_ended("answered", 1.0, 0.5)
metrics.tool_call("page", "success", 0.1)
metrics.approval_waited("approved", 2.0)
metrics.llm_used(input_tokens=1, output_tokens=1, cache_read_tokens=1, cache_write_tokens=1)
metrics.llm_error("auth_failed")
metrics.voice("heard", 1.0)
metrics.rate_limited("frames")
metrics.database_call(0.01)
metrics.channel_layer_call("join", 0.01)
metrics.writes_grouped("checkpoints", 1)
metrics.draining(False)
print(metrics.exposition()[0].decode())
"""


@dataclasses.dataclass(frozen=True)
class Served:
    families: dict[str, str]  # name -> type
    samples: dict[str, set[str]]  # sample name -> its label names

    def knows(self, name: str) -> bool:
        """A sample's name as scraped, or a histogram's own name (how
        docs/operations.md names one); a counter is queried with ``_total``."""
        return name in self.samples or self.families.get(name) == "histogram"


def read(exposition: str) -> Served:
    families: dict[str, str] = {}
    samples: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(exposition):
        families[family.name] = family.type
        for sample in family.samples:
            samples.setdefault(sample.name, set()).update(sample.labels)
    return Served(families, samples)


@pytest.fixture(scope="module")
def served(tmp_path_factory) -> Served:
    directory = tmp_path_factory.mktemp("metrics")
    env = {**os.environ, "OWLLAYER_METRICS": "true", "OWLLAYER_METRICS_DIR": str(directory),
           "DJANGO_SETTINGS_MODULE": "owllayer_site.settings"}
    done = subprocess.run([sys.executable, "-c", ONE_OF_EACH], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    return read(done.stdout)


def unknown_names(text: str, served: Served) -> list[str]:
    return sorted({name for name in NAME.findall(text) if not served.knows(name)})


def unknown_labels(text: str, served: Served) -> list[str]:
    """``name{label=...}`` selectors with a label the series does not carry."""
    wrong = set()
    for name, matchers in SELECTOR.findall(text):
        carried = served.samples.get(name, set()) | TARGET_LABELS
        wrong |= {f"{name}{{{label}}}" for label in MATCHER.findall(matchers) if label not in carried}
    return sorted(wrong)


def dashboard_expressions() -> list[str]:
    def walk(node: object) -> list[str]:
        if isinstance(node, dict):
            found = [node["expr"]] if isinstance(node.get("expr"), str) else []
            return found + [e for value in node.values() for e in walk(value)]
        if isinstance(node, list):
            return [e for item in node for e in walk(item)]
        return []

    return walk(json.loads(DASHBOARD.read_text()))


def alert_rules() -> list[dict]:
    """The rules of every group (with PyYAML when it is installed)."""
    try:
        import yaml
    except ImportError:
        return rules_without_yaml(ALERTS.read_text())
    return [rule for group in yaml.safe_load(ALERTS.read_text())["groups"] for rule in group["rules"]]


def rules_without_yaml(text: str) -> list[dict]:
    """Each ``- alert:`` item with the keys written at its own indent, for a
    check of its shape only (the values are not parsed)."""
    rules: list[dict] = []
    indent = None
    for line in text.splitlines():
        item = re.match(r"^(\s*)- alert:\s*(\S+)", line)
        if item:
            indent = len(item.group(1)) + 2
            rules.append({"alert": item.group(2)})
            continue
        key = re.match(r"^(\s*)([a-z_]+):", line)
        if rules and key and len(key.group(1)) == indent:
            rules[-1][key.group(2)] = line.split(":", 1)[1].strip()
        elif rules and key and indent is not None and len(key.group(1)) < indent:
            indent = None
    return rules


# --- the check itself --------------------------------------------------------------------


def test_recording_one_of_each_serves_every_figure_runtime_metrics_keeps(served):
    assert len(served.families) == len(dataclasses.fields(metrics._Figures))


def test_the_name_check_sees_a_metric_the_server_does_not_serve(served):
    text = ('rate(owllayer_turns_total[5m]) owllayer_turn_seconds_bucket owllayer_turn_seconds '
            'owllayer_turns owllayer_turn_second_bucket owllayer_sessions_live_total')
    assert unknown_names(text, served) == ["owllayer_sessions_live_total", "owllayer_turn_second_bucket",
                                           "owllayer_turns"]


def test_the_label_check_sees_a_label_the_series_does_not_carry(served):
    text = ('owllayer_turns_total{outcome="failed",instance=~"$instance"} '
            'owllayer_tool_call_seconds_bucket{status="error", le="1"}')
    assert unknown_labels(text, served) == ["owllayer_tool_call_seconds_bucket{status}"]


def test_the_shape_check_without_yaml_reads_each_rules_keys():
    text = ("groups:\n  - name: g\n    rules:\n      - alert: A\n        expr: up == 0\n"
            "        for: 1m\n        labels:\n          severity: critical\n"
            "  - name: h\n    rules:\n      - alert: B\n        expr: up == 1\n")
    assert rules_without_yaml(text) == [
        {"alert": "A", "expr": "up == 0", "for": "1m", "labels": ""},
        {"alert": "B", "expr": "up == 1"},
    ]


# --- the dashboard -----------------------------------------------------------------------


def test_the_dashboard_is_json_for_grafana_with_a_prometheus_datasource_to_choose():
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["schemaVersion"] >= 36
    assert [i["name"] for i in dashboard["__inputs"]] == ["DS_PROMETHEUS"]
    panels = [p for p in dashboard["panels"] if p["type"] != "row"]
    assert panels and all(p["datasource"]["uid"] == "${DS_PROMETHEUS}" and p["targets"] for p in panels)


def test_every_metric_the_dashboard_names_is_one_the_server_serves(served):
    assert unknown_names(DASHBOARD.read_text(), served) == []


def test_every_label_the_dashboard_selects_on_is_one_its_series_carries(served):
    assert unknown_labels("\n".join(dashboard_expressions()), served) == []


# --- the alert rules ---------------------------------------------------------------------


def test_every_alert_rule_has_an_expression_a_duration_a_severity_and_its_text():
    rules = alert_rules()
    assert rules
    for rule in rules:
        assert {"alert", "expr", "for", "labels", "annotations"} <= set(rule), rule["alert"]
    if isinstance(rules[0]["labels"], dict):  # parsed by PyYAML
        assert all(rule["labels"]["severity"] in {"critical", "warning"} for rule in rules)
        assert all({"summary", "description"} <= set(rule["annotations"]) for rule in rules)


def test_every_metric_the_alert_rules_name_is_one_the_server_serves(served):
    assert unknown_names(ALERTS.read_text(), served) == []


def test_every_label_the_alert_rules_select_on_is_one_its_series_carries(served):
    assert unknown_labels(ALERTS.read_text(), served) == []
