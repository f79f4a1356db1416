"""The chart lints, renders and validates against the Kubernetes schemas; the values schema
rejects bad values; optional parts appear only when switched on."""

from __future__ import annotations

import copy
import re
from typing import Any

import pytest
import yaml
from _chart_render import ALL_ON, CHART_DIR, FULLNAME, NAMESPACE, Manifests, pod_labels, pod_spec

pytestmark = pytest.mark.deploy

# Oldest supported (Chart.yaml kubeVersion) and the newest the validator knows.
KUBE_VERSIONS = ("1.27.0", "latest")
CRD_KINDS = {"ServiceMonitor", "PrometheusRule"}  # no upstream schema: checked structurally


def _validate_all(docs: Manifests, versions: tuple[str, ...] = KUBE_VERSIONS) -> None:
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    for version in versions:
        target = kubernetes_validate.utils.latest_version() if version == "latest" else version
        for (kind, name), doc in docs.items():
            if kind in CRD_KINDS:
                continue
            try:
                kubernetes_validate.validate(doc, target, strict=True)
            except kubernetes_validate.ValidationError as exc:
                path = ".".join(str(p) for p in exc.path)
                pytest.fail(f"{kind}/{name} invalid for Kubernetes {target}: {path}: {exc.message}")


def test_lint_reports_no_warnings_or_errors() -> None:
    helm_python = pytest.importorskip("helm_python")
    for values in (None, ALL_ON):
        report = helm_python.lint(str(CHART_DIR), values, strict=True, namespace=NAMESPACE)
        assert report["errors"] == []
        serious = [m for m in report["messages"] if m["severity"] >= 2]
        assert serious == [], serious


def test_default_render_validates(render: Any) -> None:
    docs = render()
    kinds = sorted(kind for kind, _ in docs)
    assert kinds == [
        "ConfigMap",
        "Deployment",
        "PodDisruptionBudget",
        "Service",
        "ServiceAccount",
    ]
    _validate_all(docs)


def test_all_optional_features_render_and_validate(render: Any) -> None:
    docs = render(ALL_ON)
    kinds = {kind for kind, _ in docs}
    assert {
        "CronJob",
        "HorizontalPodAutoscaler",
        "NetworkPolicy",
        "Secret",
        "ServiceMonitor",
        "PrometheusRule",
    } <= kinds
    _validate_all(docs)
    # The HPA owns the replica count.
    assert "replicas" not in docs[("Deployment", FULLNAME)]["spec"]


def test_retraining_from_a_pvc_validates(render: Any) -> None:
    values = {"retraining": {"enabled": True, "kbSource": {"existingClaim": "kb-pvc"}}}
    docs = render(values)
    _validate_all(docs)
    job = docs[("CronJob", f"{FULLNAME}-retrain")]
    spec = pod_spec(job)
    kb = next(v for v in spec["volumes"] if v["name"] == "kb")
    assert kb["persistentVolumeClaim"] == {"claimName": "kb-pvc", "readOnly": True}
    container = spec["containers"][0]
    mount = next(m for m in container["volumeMounts"] if m["name"] == "kb")
    assert mount == {"name": "kb", "mountPath": "/kb", "readOnly": True}
    args = container["args"]
    assert "train" in args and "--publish" in args
    assert args[args.index("--kb-name") + 1] == "default"  # scoring.defaultKb
    served = {"scoring": {"kbs": ["default", "claims"]}}
    named = render({**values, **served, "retraining": {**values["retraining"], "kbName": "claims"}})
    named_args = pod_spec(named[("CronJob", f"{FULLNAME}-retrain")])["containers"][0]["args"]
    assert named_args[named_args.index("--kb-name") + 1] == "claims"
    assert job["spec"]["concurrencyPolicy"] == "Forbid"


GATED = {
    "enabled": True,
    "kbSource": {"configMap": "kb"},
    "gate": {"enabled": True, "maxFrr": 0, "oodQueries": "/kb/ood.jsonl", "minAuroc": 0.98},
}


def test_gated_retraining_stores_then_checks_and_promotes(render: Any) -> None:
    docs = render({"retraining": GATED})
    _validate_all(docs)
    spec = pod_spec(docs[("CronJob", f"{FULLNAME}-retrain")])
    (train,), (gate,) = spec["initContainers"], spec["containers"]
    assert train["args"][-3:] == ["--no-promote", "--stats-json", "/tmp/candidate.json"]
    assert "--publish" in train["args"]
    args = gate["args"]
    assert args[args.index("check") :][:5] == [
        "check",
        "--kb",
        "default",
        "--version-from",
        "/tmp/candidate.json",
    ]
    # a limit of 0 is a gate, not a missing one
    assert (
        args[args.index("--max-frr") + 1] == "0" and args[args.index("--min-auroc") + 1] == "0.98"
    )
    assert "--max-ood-accept" not in args and args[-2:] == ["--promote", "--no-progress"]
    assert {m["mountPath"] for m in gate["volumeMounts"]} == {
        m["mountPath"] for m in train["volumeMounts"]
    }  # /tmp carries the version id from one to the other
    # a failed gate fails the job at once: a retry would retrain the same candidate
    (rule,) = docs[("CronJob", f"{FULLNAME}-retrain")]["spec"]["jobTemplate"]["spec"][
        "podFailurePolicy"
    ]["rules"]
    assert rule["action"] == "FailJob"
    assert rule["onExitCodes"] == {"containerName": "gate", "operator": "In", "values": [1, 2]}
    plain = render({"retraining": {**GATED, "gate": {"enabled": False}}})
    assert (
        "podFailurePolicy"
        not in plain[("CronJob", f"{FULLNAME}-retrain")]["spec"]["jobTemplate"]["spec"]
    )


def test_gate_query_paths_follow_the_kb_mount(render: Any) -> None:
    def gate_args(mount: str, **paths: str) -> list[str]:
        gate = {**GATED["gate"], **paths}  # type: ignore[dict-item]
        values = {"retraining": {**GATED, "mountPath": mount, "gate": gate}}
        spec = pod_spec(render(values)[("CronJob", f"{FULLNAME}-retrain")])
        (container,) = spec["containers"]
        args: list[str] = container["args"]
        return args

    def flag(args: list[str], name: str) -> str:
        return args[args.index(name) + 1]

    # the default held-out file moves with the mount, as the KB files do
    args = gate_args("/data/kb/", oodQueries="held_ood.jsonl")
    assert flag(args, "--id-queries") == "/data/kb/held_id_queries.jsonl"
    assert flag(args, "--ood-queries") == "/data/kb/held_ood.jsonl"
    args = gate_args("/kb", idQueries="/srv/held.jsonl", oodQueries="/srv/ood.jsonl")
    assert (flag(args, "--id-queries"), flag(args, "--ood-queries")) == (
        "/srv/held.jsonl",
        "/srv/ood.jsonl",
    )


def test_a_gate_needs_a_limit_and_ood_queries_for_ood_limits(render_raw: Any) -> None:
    helm_python = pytest.importorskip("helm_python")
    base = {"enabled": True, "kbSource": {"configMap": "kb"}}
    with pytest.raises(helm_python.HelmError, match="at least one of"):
        render_raw({"retraining": {**base, "gate": {"enabled": True}}})
    with pytest.raises(helm_python.HelmError, match=r"need gate\.oodQueries"):
        render_raw({"retraining": {**base, "gate": {"enabled": True, "maxOodAccept": 0.05}}})


def test_retraining_needs_exactly_one_kb_source(render_raw: Any) -> None:
    helm_python = pytest.importorskip("helm_python")
    with pytest.raises(helm_python.HelmError, match="kbSource"):
        render_raw({"retraining": {"enabled": True}})
    both = {"existingClaim": "a", "configMap": "b"}
    with pytest.raises(helm_python.HelmError, match="not both"):
        render_raw({"retraining": {"enabled": True, "kbSource": both}})


def test_settings_the_worker_would_refuse_fail_the_render(render_raw: Any) -> None:
    # Caught at install time instead of as a crash-looping pod.
    helm_python = pytest.importorskip("helm_python")
    with pytest.raises(helm_python.HelmError, match="defaultKb"):
        render_raw({"scoring": {"kbs": ["hr", "it"], "defaultKb": "default"}})
    with pytest.raises(helm_python.HelmError, match="produceTimeoutS"):
        render_raw({"terminationGracePeriodSeconds": 30, "kafka": {"produceTimeoutS": 45}})


def test_service_monitor_scrapes_the_metrics_endpoint(render: Any) -> None:
    docs = render(ALL_ON)
    monitor = docs[("ServiceMonitor", FULLNAME)]
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["metadata"]["labels"]["release"] == "prom"
    service = docs[("Service", FULLNAME)]
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert selector.items() <= service["metadata"]["labels"].items()
    [endpoint] = monitor["spec"]["endpoints"]
    assert endpoint["path"] == "/metrics"
    assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}


def test_worker_selectors_do_not_pick_up_retraining_pods(render: Any) -> None:
    docs = render(ALL_ON)
    worker = pod_labels(docs[("Deployment", FULLNAME)])
    retrain = pod_labels(docs[("CronJob", f"{FULLNAME}-retrain")])
    selectors = {
        "Deployment": docs[("Deployment", FULLNAME)]["spec"]["selector"]["matchLabels"],
        "Service": docs[("Service", FULLNAME)]["spec"]["selector"],
        "PodDisruptionBudget": docs[("PodDisruptionBudget", FULLNAME)]["spec"]["selector"][
            "matchLabels"
        ],
        "NetworkPolicy": docs[("NetworkPolicy", FULLNAME)]["spec"]["podSelector"]["matchLabels"],
    }
    for owner, selector in selectors.items():
        assert selector.items() <= worker.items(), owner
        assert not selector.items() <= retrain.items(), owner


@pytest.mark.parametrize(
    "bad",
    [
        {"replicaCount": "two"},
        {"replicaCount": -1},
        {"scoring": {"failMode": "maybe"}},
        {"scoring": {"kbs": []}},
        {"scoring": {"batchMax": 0}},
        {"kafka": {"brokers": "kafka:9092"}},  # faust needs the kafka:// scheme
        {"web": {"port": 70000}},
        {"secret": {"data": {"redis_password": "x"}}},  # not a <section>__<field> name
        {"replicaCuont": 3},  # a typo is an error, not a silent default
        {"retraining": {"gate": {"idQueries": ""}}},
    ],
)
def test_values_schema_rejects_bad_values(render_raw: Any, bad: dict[str, Any]) -> None:
    helm_python = pytest.importorskip("helm_python")
    with pytest.raises(helm_python.HelmValuesError):
        render_raw(bad)


def test_values_schema_accepts_the_documented_defaults(chart: Any) -> None:
    values_file = yaml.safe_load((CHART_DIR / "values.yaml").read_text())
    chart.validate_schema(values_file)
    chart.validate_schema(copy.deepcopy(ALL_ON))


def test_notes_warn_when_replicas_exceed_partitions(render_raw: Any) -> None:
    quiet = render_raw()["ood-sidecar/templates/NOTES.txt"]
    assert "idle" not in quiet
    loud = render_raw({"replicaCount": 6, "kafka": {"partitions": 4}})
    assert "beyond the partition count" in loud["ood-sidecar/templates/NOTES.txt"]
    hpa = render_raw({"autoscaling": {"enabled": True, "maxReplicas": 8}})
    assert "beyond the partition count" in hpa["ood-sidecar/templates/NOTES.txt"]


def test_config_change_rolls_the_pods(render: Any) -> None:
    def checksum(values: dict[str, Any] | None) -> str:
        deployment = render(values)[("Deployment", FULLNAME)]
        annotation: str = deployment["spec"]["template"]["metadata"]["annotations"][
            "checksum/config"
        ]
        return annotation

    assert checksum(None) == checksum(None)
    assert checksum(None) != checksum({"scoring": {"kbs": ["default", "billing"]}})


def test_values_shown_in_the_deployment_guide_install(render: Any) -> None:
    readme = (CHART_DIR.parents[2] / "docs" / "operations" / "deployment.md").read_text()
    blocks = [yaml.safe_load(b) for b in re.findall(r"```yaml\n(.*?)```", readme, re.S)]
    assert len(blocks) >= 2
    merged: dict[str, Any] = {}
    for block in blocks:
        merged.update(block)
        docs = render(merged)
        _validate_all(docs, versions=("latest",))
    assert ("CronJob", f"{FULLNAME}-retrain") in docs


def test_the_prebuilt_encoder_directory_reaches_the_worker(render: Any) -> None:
    from sidecar.settings import ScoringSettings

    def env(values: dict[str, Any] | None) -> str:
        value: str = render(values)[("ConfigMap", f"{FULLNAME}-env")]["data"][
            "SIDECAR_SCORING__ONNX_PREBUILT_DIR"
        ]
        return value

    assert env(None) == "/opt/ood-sidecar/onnx"
    off = env({"scoring": {"onnxPrebuiltDir": ""}})
    assert off == "" and ScoringSettings(onnx_prebuilt_dir=off).onnx_prebuilt_dir is None


def test_kafka_tls_files_reach_the_worker_only_when_set(render: Any) -> None:
    def data(values: dict[str, Any] | None) -> dict[str, str]:
        cm: dict[str, str] = render(values)[("ConfigMap", f"{FULLNAME}-env")]["data"]
        return cm

    assert not any(k.startswith("SIDECAR_KAFKA__SSL_") for k in data(None))
    tls = {
        "sslCaFile": "/run/secrets/sidecar/kafka-ca.pem",
        "sslCertFile": "/c",
        "sslKeyFile": "/k",
    }
    got = data({"kafka": {"securityProtocol": "SSL", **tls}})
    assert got["SIDECAR_KAFKA__SSL_CA_FILE"] == "/run/secrets/sidecar/kafka-ca.pem"
    assert (got["SIDECAR_KAFKA__SSL_CERT_FILE"], got["SIDECAR_KAFKA__SSL_KEY_FILE"]) == ("/c", "/k")
