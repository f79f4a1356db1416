"""The chart's embedding server: its settings reach workers and the retraining job, its API
key comes from a Secret as a mounted file (never an environment variable or the
ConfigMap), and values that could not work fail the render."""

from __future__ import annotations

from typing import Any

import pytest
from _chart_render import FULLNAME, pod_spec
from test_chart_render import _validate_all

from sidecar.settings import DEFAULT_SECRETS_DIR, load_settings

pytestmark = pytest.mark.deploy

SERVER = {
    "enabled": True,
    "baseUrl": "http://embeddings.ml:7997/v1",
    "model": "sentence-transformers/all-MiniLM-L6-v2",
    "deadlineS": 12.5,
    "maxBatch": 64,
}
RETRAIN = {"enabled": True, "kbSource": {"configMap": "kb-files"}}


def _env(docs: Any) -> dict[str, str]:
    data: dict[str, str] = docs[("ConfigMap", f"{FULLNAME}-env")]["data"]
    return data


def _workloads(docs: Any) -> list[dict[str, Any]]:
    return [doc for (kind, _), doc in docs.items() if kind in {"Deployment", "CronJob"}]


def test_off_by_default(render: Any) -> None:
    env = _env(render())
    assert env["SIDECAR_SCORING__ENCODER_BACKEND"] == "auto"
    assert not [k for k in env if k.startswith("SIDECAR_EMBEDDING_SERVER__")]


def test_workers_and_the_retraining_job_embed_through_the_server(
    render: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    docs = render({"embeddingServer": SERVER, "retraining": RETRAIN})
    _validate_all(docs, versions=("latest",))
    env = _env(docs)
    assert env["SIDECAR_SCORING__ENCODER_BACKEND"] == "http"
    assert env["SIDECAR_EMBEDDING_SERVER__BASE_URL"] == SERVER["baseUrl"]
    # Both load the one ConfigMap: the job trains with the encoder the workers score with.
    for doc in _workloads(docs):
        refs = [s["configMapRef"]["name"] for s in pod_spec(doc)["containers"][0]["envFrom"]]
        assert f"{FULLNAME}-env" in refs
    # The settings accept every value as rendered.
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    s = load_settings()
    server = s.embedding_server
    assert (server.base_url, server.model, server.deadline_s, server.max_batch) == (
        SERVER["baseUrl"],
        SERVER["model"],
        12.5,
        64,
    )
    assert s.scoring.encoder_backend == "http" and server.api_key is None


def test_the_api_key_comes_from_its_secret_as_a_file(render: Any) -> None:
    values = {
        "embeddingServer": {**SERVER, "apiKeySecret": {"name": "embeddings-key", "key": "token"}},
        "existingSecret": "sidecar-secrets",
        "retraining": RETRAIN,
    }
    docs = render(values)
    _validate_all(docs, versions=("latest",))
    assert not [k for k in docs if k[0] == "Secret"]  # the chart makes no copy of it
    for doc in _workloads(docs):
        spec = pod_spec(doc)
        [volume] = [v for v in spec["volumes"] if v["name"] == "secrets"]
        sources = volume["projected"]["sources"]
        # The sidecar's own secret files and the key, in one directory.
        assert sources[0] == {"secret": {"name": "sidecar-secrets"}}
        assert sources[1]["secret"] == {
            "name": "embeddings-key",
            "items": [{"key": "token", "path": "embedding_server__api_key"}],
        }
        container = spec["containers"][0]
        [mount] = [m for m in container["volumeMounts"] if m["name"] == "secrets"]
        assert mount["mountPath"] == str(DEFAULT_SECRETS_DIR) and mount["readOnly"] is True
        assert all("valueFrom" not in e for e in container.get("env", []))


def test_a_key_secret_alone_is_mounted_too(render: Any) -> None:
    docs = render({"embeddingServer": {**SERVER, "apiKeySecret": {"name": "k", "key": "t"}}})
    spec = pod_spec(docs[("Deployment", FULLNAME)])
    [volume] = [v for v in spec["volumes"] if v["name"] == "secrets"]
    assert [s["secret"]["name"] for s in volume["projected"]["sources"]] == ["k"]


@pytest.mark.parametrize(
    ("server", "message"),
    [
        ({"enabled": True}, "needs embeddingServer.baseUrl"),
        ({"enabled": True, "baseUrl": "http://u:sk-123@emb:7997/v1"}, "must not carry a key"),
        ({"enabled": True, "baseUrl": "http://emb:7997/v1?api_key=sk-1"}, "must not carry a key"),
    ],
)
def test_values_that_cannot_work_fail_the_render(
    render_raw: Any, server: dict[str, Any], message: str
) -> None:
    helm_python = pytest.importorskip("helm_python")
    with pytest.raises(helm_python.HelmError, match=message):
        render_raw({"embeddingServer": server})


@pytest.mark.parametrize(
    "bad",
    [
        {"baseUrl": "embeddings:7997"},
        {"encodingFormat": "fp16"},
        {"maxBatch": 0},
        {"apiKey": "sk-in-values"},  # a key is never a value
    ],
)
def test_the_values_schema_refuses(render_raw: Any, bad: dict[str, Any]) -> None:
    helm_python = pytest.importorskip("helm_python")
    with pytest.raises(helm_python.HelmError):
        render_raw({"embeddingServer": {"enabled": True, "baseUrl": "http://e/v1", **bad}})
