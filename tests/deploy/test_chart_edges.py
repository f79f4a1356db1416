"""Values a platform engineer sets beyond the defaults: each renders what Kubernetes and the
worker accept, or fails the render with a line that says why."""

from __future__ import annotations

from typing import Any

import pytest
from _chart_render import FULLNAME, pod_spec

from sidecar.settings import load_settings

pytestmark = pytest.mark.deploy

RETRAIN = {"enabled": True, "kbSource": {"configMap": "kb"}}
NODE_POOL = {
    "nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [
                {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["phi"]}]}
            ]
        }
    }
}


def _one(docs: dict[tuple[str, str], Any], kind: str) -> dict[str, Any]:
    (doc,) = [d for (k, _), d in docs.items() if k == kind]
    return doc


def test_recreate_has_no_rolling_update_parameters(render: Any) -> None:
    # The API server refuses rollingUpdate beside Recreate; Helm merges the default in.
    docs = render({"updateStrategy": {"type": "Recreate"}})
    assert _one(docs, "Deployment")["spec"]["strategy"] == {"type": "Recreate"}
    default = _one(render(), "Deployment")["spec"]["strategy"]
    assert default == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1},
    }


def test_the_cronjob_name_fits_kubernetes_52_characters(chart: Any) -> None:
    long_name = "hospital-rag-prod-moderation-eu-1"
    rendered = chart.render({"retraining": RETRAIN}, name=long_name, namespace="rag")
    names = [
        line.split(":", 1)[1].strip()
        for path, text in rendered.items()
        if path.endswith("cronjob.yaml")
        for line in text.splitlines()
        if line.startswith("  name:")
    ]
    assert len(names) == 1 and len(names[0]) <= 52 and names[0].endswith("-retrain"), names
    notes = next(t for p, t in rendered.items() if p.endswith("NOTES.txt"))
    assert f"cronjob/{names[0]} " in notes  # the hint names the CronJob that exists


def test_node_affinity_keeps_the_replica_spreading(render: Any) -> None:
    values = {
        "affinity": NODE_POOL,
        "podAnnotations": {"sidecar.istio.io/inject": "false"},
        "podLabels": {"team": "ml"},
        "retraining": RETRAIN,
    }
    docs = render(values)
    worker = pod_spec(_one(docs, "Deployment"))["affinity"]
    assert worker["nodeAffinity"] == NODE_POOL["nodeAffinity"]
    assert "preferredDuringSchedulingIgnoredDuringExecution" in worker["podAntiAffinity"]
    # The retraining pod, which mounts the KB, runs in the same node pool with the same
    # pod annotations and labels (a mesh opt-out, NetworkPolicy labels).
    job = _one(docs, "CronJob")["spec"]["jobTemplate"]["spec"]["template"]
    assert job["spec"]["affinity"] == NODE_POOL
    assert job["metadata"]["annotations"]["sidecar.istio.io/inject"] == "false"
    assert job["metadata"]["labels"]["team"] == "ml"
    own = {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": []}}
    mine = pod_spec(_one(render({"affinity": own}), "Deployment"))["affinity"]
    assert mine == own  # a podAntiAffinity of the user's own replaces the chart's


def test_large_integers_render_without_an_exponent(render: Any) -> None:
    values = {
        "scoring": {"maxTextChars": 1000000, "batchTimeoutMs": 2000000},
        "retraining": {
            **RETRAIN,
            "activeDeadlineSeconds": 1000000,
            "ttlSecondsAfterFinished": 2592000,
        },
    }
    docs = render(values)
    env = _one(docs, "ConfigMap")["data"]
    assert env["SIDECAR_SCORING__MAX_TEXT_CHARS"] == "1000000"
    assert env["SIDECAR_KAFKA__SESSION_TIMEOUT_S"] == "10"
    job = _one(docs, "CronJob")["spec"]["jobTemplate"]["spec"]
    assert job["activeDeadlineSeconds"] == 1000000 and job["ttlSecondsAfterFinished"] == 2592000


def test_large_integers_load_as_settings(render: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    env = _one(render({"scoring": {"maxTextChars": 1000000}}), "ConfigMap")["data"]
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert load_settings().scoring.max_text_chars == 1_000_000


def test_null_and_zero_integers_keep_their_meaning(render: Any) -> None:
    # null removes a default (no TTL: finished Jobs and a failed gate's logs are kept);
    # 0 is a value (no retries).
    values = {"retraining": {**RETRAIN, "ttlSecondsAfterFinished": None, "backoffLimit": 0}}
    job = _one(render(values), "CronJob")["spec"]["jobTemplate"]["spec"]
    assert job["ttlSecondsAfterFinished"] is None and job["backoffLimit"] == 0


def test_a_retraining_kb_no_worker_serves_fails_the_render(render_raw: Any) -> None:
    helm_python = pytest.importorskip("helm_python")
    values = {
        "scoring": {"kbs": ["billing"], "defaultKb": "billing"},
        "retraining": {**RETRAIN, "kbName": "billng"},
    }
    with pytest.raises(helm_python.HelmError, match=r"retraining\.kbName \"billng\""):
        render_raw(values)
    values["retraining"]["kbName"] = "billing"
    assert render_raw(values)


@pytest.mark.parametrize(
    "url",
    [
        "redis://:S3cret@redis:6379/0",
        "redis://app:S3cret@redis:6379/0",
        "redis://redis:6379/0?password=S3cret",
        "rediss://redis/0?db=1&password=S3cret",
    ],
)
def test_a_password_in_the_redis_url_fails_the_render(render_raw: Any, url: str) -> None:
    helm_python = pytest.importorskip("helm_python")
    with pytest.raises(helm_python.HelmError, match="redis__password") as failed:
        render_raw({"redis": {"url": url}})
    assert "S3cret" not in str(failed.value)


@pytest.mark.parametrize(
    "url", ["rediss://redis.prod:6380/2", "redis://app@redis:6379/0", "unix:///run/redis.sock"]
)
def test_redis_urls_without_a_password_render(render: Any, url: str) -> None:
    # A user name alone names an ACL user; its password is the secret redis__password.
    env = _one(render({"redis": {"url": url}}), "ConfigMap")["data"]
    assert env["SIDECAR_REDIS__URL"] == url


def test_fullname_is_what_the_tests_expect(render: Any) -> None:
    assert ("Deployment", FULLNAME) in render()


def test_the_default_retraining_job_gives_the_default_detector_its_ood_queries(
    render: Any,
) -> None:
    # combined, the default detector, is fitted on ID against OOD queries: a job without
    # them would fail at every run.
    job = _one(render({"retraining": RETRAIN}), "CronJob")
    args = pod_spec(job)["containers"][0]["args"]
    assert "--detector" not in args
    assert args[args.index("--ood-queries") + 1] == "/kb/ood_queries.jsonl"
