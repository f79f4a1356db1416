"""The chart's Grafana dashboard and Prometheus alert rules: rendered only when switched on,
built on the metrics the worker really exports, and configurable through the values."""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from _chart_render import CHART_DIR, FULLNAME, NAMESPACE, Manifests

pytestmark = pytest.mark.deploy

REPO = CHART_DIR.parents[2]
DASHBOARD = {"grafanaDashboard": {"enabled": True}}
RULES = {"prometheusRule": {"enabled": True, "labels": {"release": "prom"}}}
# Series that are not the worker's own: Prometheus' scrape health and the chart's recording
# rules.
EXTERNAL = {"up"}
RECORDED = {"ood_sidecar:ood_share:rate1h", "ood_sidecar:ood_share:rate1d_offset1h"}
PROMQL_WORDS = {
    "sum", "by", "rate", "histogram_quantile", "max", "min", "count", "delta", "and", "or",
    "offset", "le", "without", "on", "unless", "abs",
}  # fmt: skip


def _tables() -> ModuleType:
    """docs/scripts/reference_tables.py: it reads the metric names from the source."""
    path = REPO / "docs" / "scripts" / "reference_tables.py"
    spec = importlib.util.spec_from_file_location("reference_tables", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("reference_tables", module)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def exported() -> set[str]:
    """Every series name the worker exports (histograms with their three series)."""
    names: set[str] = set()
    for metric in _tables().metrics(REPO):
        names.add(metric.name)
        if metric.kind == "histogram":
            names |= {f"{metric.name}_{s}" for s in ("bucket", "sum", "count")}
    assert {"sidecar_verdicts_total", "sidecar_dlq_total", "sidecar_model_info"} <= names
    return names


def _series(expr: str) -> set[str]:
    """The metric names a PromQL expression reads (label names, functions and label
    values left out)."""
    without_strings = re.sub(r'"[^"]*"', '""', expr)
    without_matchers = re.sub(r"\{[^}]*\}", "{}", without_strings)
    without_ranges = re.sub(r"\[[^\]]*\]", "", without_matchers)
    without_groupings = re.sub(r"\b(by|without|on)\s*\([^)]*\)", "", without_ranges)
    without_numbers = re.sub(r"\b\d+(\.\d+)?(ms|[smhdwy])?\b", "", without_groupings)
    tokens = set(re.findall(r"[a-zA-Z_:][a-zA-Z0-9_:]*", without_numbers))
    return tokens - PROMQL_WORDS


def _balanced(expr: str) -> bool:
    pairs = {")": "(", "]": "[", "}": "{"}
    stack: list[str] = []
    for ch in re.sub(r'"[^"]*"', '""', expr):
        if ch in "([{":
            stack.append(ch)
        elif ch in pairs and (not stack or stack.pop() != pairs[ch]):
            return False
    return not stack


def _dashboard(docs: Manifests) -> dict[str, Any]:
    cm = docs[("ConfigMap", f"{FULLNAME}-dashboard")]
    data: dict[str, Any] = json.loads(cm["data"]["ood-sidecar.json"])
    return data


def _rules(docs: Manifests) -> list[dict[str, Any]]:
    rule = docs[("PrometheusRule", FULLNAME)]
    return [r for group in rule["spec"]["groups"] for r in group["rules"]]


def test_neither_renders_by_default(render: Any) -> None:
    docs = render()
    assert ("ConfigMap", f"{FULLNAME}-dashboard") not in docs
    assert not any(kind == "PrometheusRule" for kind, _ in docs)


def test_the_dashboard_configmap_validates_and_carries_the_grafana_label(render: Any) -> None:
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    docs = render(DASHBOARD)
    cm = docs[("ConfigMap", f"{FULLNAME}-dashboard")]
    kubernetes_validate.validate(cm, kubernetes_validate.utils.latest_version(), strict=True)
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert cm["metadata"]["namespace"] == NAMESPACE
    assert _dashboard(docs)["uid"] == "ood-sidecar"
    # The file the docs point operators to is the one the chart ships.
    shipped = json.loads((CHART_DIR / "dashboards" / "ood-sidecar.json").read_text())
    assert _dashboard(docs) == shipped


def test_the_dashboard_shows_what_the_issue_asks_for_from_exported_metrics(
    render: Any, exported: set[str]
) -> None:
    board = _dashboard(render(DASHBOARD))
    exprs = {p["title"]: [t["expr"] for t in p["targets"]] for p in board["panels"]}
    read = set().union(*(_series(e) for es in exprs.values() for e in es))
    assert read <= exported, (
        f"the dashboard reads series the worker does not export: {read - exported}"
    )
    wanted = {
        "sidecar_verdicts_total",  # verdict rate by KB and verdict, OOD share
        "sidecar_dlq_total",  # dead letters by reason
        "sidecar_stage_seconds_bucket",  # batch latency
        "sidecar_latency_seconds_bucket",
        "sidecar_consumer_lag",
        "sidecar_model_info",  # model version per replica
        "sidecar_model_load_failures",
    }
    assert wanted <= read
    assert any('verdict="OOD"' in e for es in exprs.values() for e in es)  # the OOD share
    assert all(_balanced(e) for es in exprs.values() for e in es)
    # Every query filters on the release's namespace and job, chosen in the dashboard.
    assert all('namespace="$namespace", job="$job"' in e for es in exprs.values() for e in es)
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))


def test_the_dashboard_can_go_to_grafanas_namespace_with_a_folder(render: Any) -> None:
    docs = render(
        {
            "grafanaDashboard": {
                "enabled": True,
                "namespace": "monitoring",
                "labels": {"grafana_dashboard": "yes"},
                "annotations": {"grafana_folder": "RAG"},
            }
        }
    )
    cm = docs[("ConfigMap", f"{FULLNAME}-dashboard")]
    assert cm["metadata"]["namespace"] == "monitoring"
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "yes"
    assert cm["metadata"]["annotations"] == {"grafana_folder": "RAG"}


def test_the_alert_rules_cover_the_issue_and_read_exported_metrics(
    render: Any, exported: set[str]
) -> None:
    docs = render(RULES)
    rule = docs[("PrometheusRule", FULLNAME)]
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert rule["metadata"]["namespace"] == NAMESPACE
    assert rule["metadata"]["labels"]["release"] == "prom"
    rules = _rules(docs)
    alerts = {r["alert"]: r for r in rules if "alert" in r}
    assert set(alerts) == {
        "OodSidecarWorkerNotReady",
        "OodSidecarDeadLettersRising",
        "OodSidecarEmbeddingFallbacks",
        "OodSidecarModelLoadFailed",
        "OodSidecarReplicaModelBehind",
        "OodSidecarNoModel",
        "OodSidecarOodShareJump",
        "OodSidecarOodShareOffCalibration",
        "OodSidecarConsumerLagHigh",
    }
    recorded = {r["record"] for r in rules if "record" in r}
    assert recorded == RECORDED
    for r in rules:
        expr = r["expr"]
        assert _balanced(expr), expr
        unknown = _series(expr) - exported - EXTERNAL - RECORDED
        assert not unknown, f"{r.get('alert') or r.get('record')} reads {unknown}"
        # Every series of this release, selected by namespace and job.
        for selector in re.findall(r"(?:sidecar_\w+|ood_sidecar:\w+:\w+|up)\{([^}]*)\}", expr):
            assert f'namespace="{NAMESPACE}"' in selector and f'job="{FULLNAME}"' in selector
    for alert in alerts.values():
        assert alert["labels"]["severity"] in {"warning", "critical"}
        assert alert["annotations"]["summary"] and alert["annotations"]["description"]
        # Prometheus' own templating survives Helm's.
        assert "{{`" not in json.dumps(alert["annotations"])
    assert "{{ $labels.kb }}" in alerts["OodSidecarNoModel"]["annotations"]["summary"]
    # The not-ready alert reads the workers' own readiness gauge (no kube-state-metrics
    # needed) and Prometheus' scrape health, both scoped to this release.
    not_ready = alerts["OodSidecarWorkerNotReady"]["expr"]
    assert "sidecar_ready{" in not_ready and "up{" in not_ready
    assert not_ready.count(f'job="{FULLNAME}"') == 2


def test_the_alert_thresholds_selector_and_labels_are_values(render: Any) -> None:
    values = {
        "prometheusRule": {
            "enabled": True,
            "selector": 'service="custom"',
            "additionalLabels": {"team": "rag"},
            "deadLetterRate": 2.5,
            "embeddingFallbackRate": 0.5,
            "notReadyFor": "3m",
            "versionSkewFor": "90s",
            "consumerLag": 500,
            "oodShareJump": {"factor": 3, "minIncrease": 0.2, "minRate": 1},
            "oodShareOffCalibration": {"minDifference": 0.15, "for": "3h", "minRate": 2},
            "severity": {"noModel": "page"},
        }
    }
    alerts = {r["alert"]: r for r in _rules(render(values)) if "alert" in r}
    assert "> 2.5" in alerts["OodSidecarDeadLettersRising"]["expr"]
    fallbacks = alerts["OodSidecarEmbeddingFallbacks"]["expr"]
    assert "sidecar_embedding_fallbacks_total{" in fallbacks and "> 0.5" in fallbacks
    assert alerts["OodSidecarWorkerNotReady"]["for"] == "3m"
    assert alerts["OodSidecarReplicaModelBehind"]["for"] == "90s"
    assert "> 500" in alerts["OodSidecarConsumerLagHigh"]["expr"]
    share = alerts["OodSidecarOodShareJump"]["expr"]
    assert "> 3 *" in share and "> 0.2" in share and "> 1" in share
    off = alerts["OodSidecarOodShareOffCalibration"]
    assert off["for"] == "3h" and "> 0.15" in off["expr"] and "> 2" in off["expr"]
    assert "sidecar_model_calibration_ood_share{" in off["expr"]
    assert 'sidecar_dlq_total{service="custom"}' in alerts["OodSidecarDeadLettersRising"]["expr"]
    assert alerts["OodSidecarNoModel"]["labels"] == {"severity": "page", "team": "rag"}
    assert all(a["labels"]["team"] == "rag" for a in alerts.values())


@pytest.mark.parametrize(
    "values",
    [
        {"prometheusRule": {"enabled": True, "notReadyFor": "ten minutes"}},
        {"prometheusRule": {"enabled": True, "oodShareJump": {"factor": 0.5}}},
        {"prometheusRule": {"enabled": True, "oodShareOffCalibration": {"minDifference": 0}}},
        {"prometheusRule": {"enabled": True, "deadLetterRate": 0}},
        {"prometheusRule": {"enabled": True, "embeddingFallbackRate": -1}},
        {"prometheusRule": {"enabled": True, "tresholds": {}}},
        {"grafanaDashboard": {"enabled": "yes"}},
    ],
)
def test_the_schema_rejects_bad_monitoring_values(chart: Any, values: dict[str, Any]) -> None:
    with pytest.raises(Exception, match=r"(?i)schema|values"):
        chart.render(values, name="rel", namespace=NAMESPACE)


def test_the_docs_list_every_alert(render: Any) -> None:
    page = (REPO / "docs" / "operations" / "monitoring.md").read_text()
    for r in _rules(render(RULES)):
        if "alert" in r:
            assert f"`{r['alert']}`" in page
    assert Path(CHART_DIR / "dashboards" / "ood-sidecar.json").is_file()
