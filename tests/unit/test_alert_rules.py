"""The alert rules and the dashboard of docs/alerts/: valid for Prometheus (``promtool check
rules``), firing as documented on synthetic series (``promtool test rules``), and naming
only metrics chronolog really exports — read from the collectors' own exposition (the
``/metrics`` of the API and of ``chronolog projector --metrics-port``).

promtool comes from the Debian package ``prometheus``; ``scripts/with_services.py`` (so
``make test`` and ``make test-unit``) installs it when it is missing."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from types import SimpleNamespace

import yaml
from prometheus_client import CollectorRegistry, generate_latest

from chronolog.projections.metrics import ProjectorCollector
from chronolog.projections.projector import ProjectorStats
from chronolog.queries.metrics import Snapshot, render

ALERTS = Path(__file__).resolve().parents[2] / "docs" / "alerts"
RULES = ALERTS / "chronolog-rules.yaml"
DASHBOARD = ALERTS / "grafana-dashboard.json"
METRIC = re.compile(r"\bchronolog_[a-z_]+\b")
SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"),
            "gauge": ("",)}


def exported() -> set[str]:
    """Every sample name the collectors expose (a counter as ``_total``, a histogram's
    ``_bucket``/``_sum``/``_count``)."""
    text = render(Snapshot(fence_rejections={}, rules={})).decode()
    registry = CollectorRegistry()
    registry.register(ProjectorCollector(SimpleNamespace(
        stats=ProjectorStats(), dead_letters=SimpleNamespace(counts={}))))
    text += generate_latest(registry).decode()
    names = set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, family, kind = line.split()
            base = family.removesuffix("_total") if kind == "counter" else family
            names.update(base + s for s in SUFFIXES[kind])
    return names


def promtool() -> str:
    found = shutil.which("promtool")
    assert found, ("promtool is missing: run the tests through scripts/with_services.py "
                   "(make test / make test-unit), which installs the Debian package "
                   "'prometheus', or apt-get install -y prometheus")
    return found


def expressions() -> list[tuple[str, str]]:
    doc = yaml.safe_load(RULES.read_text())
    return [(r["alert"], r["expr"]) for g in doc["groups"] for r in g["rules"]]


def test_promtool_checks_the_rules() -> None:
    r = subprocess.run([promtool(), "check", "rules", str(RULES)], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"SUCCESS: {len(expressions())} rules found" in r.stdout


def test_promtool_unit_tests_fire_the_alerts_as_documented() -> None:
    r = subprocess.run([promtool(), "test", "rules", "chronolog-rules.test.yaml"],
                       capture_output=True, text=True, timeout=60, cwd=ALERTS)
    assert r.returncode == 0, r.stdout + r.stderr
    tested = {t["alertname"] for case in yaml.safe_load(
        (ALERTS / "chronolog-rules.test.yaml").read_text())["tests"]
        for t in case["alert_rule_test"]}
    # the alerts of the facts this release counts are each exercised
    assert {"ChronologStartLateness", "ChronologOldestAdmittedRunWaiting",
            "ChronologLeasesExpiring", "ChronologStaleCompletions", "ChronologMisfiresSkipped",
            "ChronologEffectPublicationFailed", "ChronologEffectUncertain",
            "ChronologProcessorRulesMismatch"} <= tested


def test_every_rule_names_only_exported_metrics() -> None:
    names = exported()
    for required in ("chronolog_run_start_lateness_seconds_bucket",
                     "chronolog_leases_expired_total", "chronolog_effects_finished_total",
                     "chronolog_processor_rules_mismatch"):
        assert required in names
    rules = expressions()
    assert len(rules) >= 8
    for alert, expr in rules:
        used = set(METRIC.findall(expr))
        assert used, f"{alert} names no chronolog metric"
        assert used <= names, f"{alert} names metrics nobody exports: {sorted(used - names)}"


def test_the_dashboard_is_valid_and_names_only_exported_metrics() -> None:
    dash = json.loads(DASHBOARD.read_text())
    names = exported()
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    assert len({p["id"] for p in dash["panels"]}) == len(dash["panels"])
    assert exprs
    for expr in exprs:
        used = set(METRIC.findall(expr))
        assert used and used <= names, f"{expr}: {sorted(used - names)}"
    # every metric an alert watches has a panel
    alerted = {m for _, e in expressions() for m in METRIC.findall(e)}
    shown = {m for e in exprs for m in METRIC.findall(e)}
    assert alerted <= shown, sorted(alerted - shown)
