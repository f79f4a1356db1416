"""Redis over TLS through the chart: the files reach the settings, a Secret of TLS files
is mounted where they point, and files without a rediss:// URL fail the render."""

from __future__ import annotations

from typing import Any

import pytest
from _chart_render import FULLNAME, pod_spec

from sidecar.settings import load_settings

pytestmark = pytest.mark.deploy

TLS_DIR = "/run/secrets/redis-tls"
TLS = {
    "url": "rediss://sidecar-worker@redis.prod:6380/0",
    "sslCaFile": f"{TLS_DIR}/ca.crt",
    "sslCertFile": f"{TLS_DIR}/tls.crt",
    "sslKeyFile": f"{TLS_DIR}/tls.key",
    "tlsSecret": "redis-client-tls",
}
RETRAIN = {"enabled": True, "kbSource": {"configMap": "kb"}}


def _env(docs: dict[tuple[str, str], Any]) -> dict[str, str]:
    data: dict[str, str] = docs[("ConfigMap", f"{FULLNAME}-env")]["data"]
    return data


def test_without_tls_values_nothing_is_set_or_mounted(render: Any) -> None:
    docs = render({"retraining": RETRAIN})
    assert not any(k.startswith("SIDECAR_REDIS__SSL_") for k in _env(docs))
    for kind in ("Deployment", "CronJob"):
        (doc,) = [d for (k, _), d in docs.items() if k == kind]
        assert "redis-tls" not in [v["name"] for v in pod_spec(doc)["volumes"]]


def test_tls_files_reach_the_settings_and_their_secret_is_mounted_where_they_point(
    render: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    docs = render({"redis": TLS, "retraining": RETRAIN, "existingSecret": "sidecar-secrets"})
    env = _env(docs)
    assert env["SIDECAR_REDIS__SSL_CA_FILE"] == TLS["sslCaFile"]
    assert env["SIDECAR_REDIS__SSL_CERT_FILE"] == TLS["sslCertFile"]
    assert env["SIDECAR_REDIS__SSL_KEY_FILE"] == TLS["sslKeyFile"]
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    redis = load_settings().redis
    assert (redis.ssl_ca_file, redis.ssl_cert_file, redis.ssl_key_file) == (
        TLS["sslCaFile"], TLS["sslCertFile"], TLS["sslKeyFile"],
    )  # fmt: skip
    for kind in ("Deployment", "CronJob"):
        (doc,) = [d for (k, _), d in docs.items() if k == kind]
        spec = pod_spec(doc)
        (volume,) = [v for v in spec["volumes"] if v["name"] == "redis-tls"]
        assert volume["secret"]["secretName"] == "redis-client-tls"
        for container in spec.get("initContainers", []) + spec["containers"]:
            mounts = {m["name"]: m for m in container["volumeMounts"]}
            assert mounts["redis-tls"]["mountPath"] == TLS_DIR
            assert mounts["redis-tls"]["readOnly"] is True
            # beside, not inside, the secrets directory (whose files are settings)
            assert mounts["secrets"]["mountPath"] == "/run/secrets/sidecar"


def test_the_ca_alone_is_enough(render: Any) -> None:
    env = _env(render({"redis": {"url": "rediss://redis:6380/0",
                                 "sslCaFile": "/run/secrets/sidecar/redis-ca.pem"}}))  # fmt: skip
    assert env["SIDECAR_REDIS__SSL_CA_FILE"] == "/run/secrets/sidecar/redis-ca.pem"
    assert "SIDECAR_REDIS__SSL_CERT_FILE" not in env


@pytest.mark.parametrize(
    ("redis", "says"),
    [
        ({"url": "redis://redis:6379/0", "sslCaFile": "/ca.pem"}, "need a rediss://"),
        ({"url": "rediss://redis:6380/0", "sslKeyFile": "/k"}, "needs redis.sslCertFile"),
    ],
)
def test_tls_files_that_would_be_ignored_fail_the_render(
    render_raw: Any, redis: dict[str, str], says: str
) -> None:
    helm_python = pytest.importorskip("helm_python")
    with pytest.raises(helm_python.HelmError, match=says):
        render_raw({"redis": redis})
