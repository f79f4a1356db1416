"""Constants and pure helpers for the chart tests (no cluster, no helm binary)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
CHART_DIR = REPO / "deploy" / "helm" / "ood-sidecar"
DOCKERFILE = REPO / "deploy" / "docker" / "Dockerfile"
RELEASE = "rel"
NAMESPACE = "rag"
FULLNAME = "rel-ood-sidecar"

Manifests = dict[tuple[str, str], dict[str, Any]]


def parse_manifests(rendered: dict[str, str]) -> Manifests:
    """Map (kind, name) to each rendered Kubernetes object; NOTES.txt is left out."""
    docs: Manifests = {}
    for path, text in rendered.items():
        if path.endswith("NOTES.txt"):
            continue
        for doc in yaml.safe_load_all(text):
            if doc:
                key = (doc["kind"], doc["metadata"]["name"])
                assert key not in docs, f"duplicate object {key}"
                docs[key] = doc
    return docs


# Every optional feature switched on (with a chart-managed Secret holding a sentinel).
SENTINEL = "s3ntinel-Secret-Value-7f1e"
ALL_ON: dict[str, Any] = {
    "secret": {"create": True, "data": {"redis__password": SENTINEL, "store__hmac_key": SENTINEL}},
    "serviceMonitor": {"enabled": True, "labels": {"release": "prom"}},
    "grafanaDashboard": {"enabled": True},
    "prometheusRule": {"enabled": True, "labels": {"release": "prom"}},
    "autoscaling": {"enabled": True, "minReplicas": 2, "maxReplicas": 4},
    "networkPolicy": {
        "enabled": True,
        "ingressFrom": [{"namespaceSelector": {"matchLabels": {"name": "monitoring"}}}],
        "egress": [{"ports": [{"port": 9092, "protocol": "TCP"}]}],
    },
    "retraining": {"enabled": True, "kbSource": {"configMap": "kb-files"}},
    "extraEnv": [{"name": "SIDECAR_EXPLAIN__TEMPERATURE", "value": "0.0"}],
    "imagePullSecrets": [{"name": "regcred"}],
    "topologySpreadConstraints": [
        {
            "maxSkew": 1,
            "topologyKey": "topology.kubernetes.io/zone",
            "whenUnsatisfiable": "ScheduleAnyway",
            "labelSelector": {"matchLabels": {"app.kubernetes.io/name": "ood-sidecar"}},
        }
    ],
    "priorityClassName": "high",
}


def pod_spec(doc: dict[str, Any]) -> dict[str, Any]:
    """The pod spec of a Deployment or a CronJob."""
    if doc["kind"] == "CronJob":
        spec: dict[str, Any] = doc["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    else:
        spec = doc["spec"]["template"]["spec"]
    return spec


def pod_labels(doc: dict[str, Any]) -> dict[str, str]:
    if doc["kind"] == "CronJob":
        labels: dict[str, str] = doc["spec"]["jobTemplate"]["spec"]["template"]["metadata"][
            "labels"
        ]
    else:
        labels = doc["spec"]["template"]["metadata"]["labels"]
    return labels
