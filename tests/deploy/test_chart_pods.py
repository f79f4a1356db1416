"""What the pods get: settings that map onto ``sidecar.settings.Settings``, secrets only as
mounted files, probes on the web port, a non-root read-only container."""

from __future__ import annotations

import base64
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from _chart_render import ALL_ON, CHART_DIR, FULLNAME, SENTINEL, Manifests, pod_spec
from pydantic import BaseModel, SecretStr

from sidecar.settings import DEFAULT_SECRETS_DIR, Settings, load_settings

pytestmark = pytest.mark.deploy

ENV_PREFIX = "SIDECAR_"
# Read by load_settings itself, not a field of a section.
NON_FIELD_ENV = {"SIDECAR_SECRETS_DIR"}
SECRETISH = re.compile(r"pass(word|wd)?|secret|hmac|api_?key|token|credential", re.I)
CREDENTIAL_URL = re.compile(r"://[^/\s:@]*:[^/\s@]+@")


def _secret_fields() -> set[str]:
    """``<section>__<field>`` of every SecretStr field of Settings."""
    names = set()
    for section, info in Settings.model_fields.items():
        model = info.annotation
        assert isinstance(model, type) and issubclass(model, BaseModel)
        for field, finfo in model.model_fields.items():
            if "SecretStr" in str(finfo.annotation) or finfo.annotation is SecretStr:
                names.add(f"{section}__{field}")
    return names


def _workloads(docs: Manifests) -> Iterator[dict[str, Any]]:
    yield from (doc for (kind, _), doc in docs.items() if kind in {"Deployment", "CronJob"})


def _sidecar_env(docs: Manifests) -> dict[str, str]:
    """Every SIDECAR_* variable a worker or job gets: ConfigMaps it loads plus its env."""
    env: dict[str, str] = {}
    for doc in _workloads(docs):
        for container in pod_spec(doc)["containers"]:
            for source in container.get("envFrom", []):
                cm = docs[("ConfigMap", source["configMapRef"]["name"])]
                env.update(cm["data"])
            for var in container.get("env", []):
                assert "valueFrom" not in var, f"{var['name']} from a Secret: use mounted files"
                env[var["name"]] = var["value"]
    return {k: v for k, v in env.items() if k.startswith(ENV_PREFIX)}


def _walk(node: Any, path: str = "") -> Iterator[tuple[str, Any]]:
    if isinstance(node, dict):
        for key, value in node.items():
            yield f"{path}.{key}", value
            yield from _walk(value, f"{path}.{key}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _walk(value, f"{path}[{i}]")


def _not_settings_fields(env: dict[str, str]) -> list[str]:
    """The SIDECAR_* names that name no field of Settings (drift between chart and code)."""
    unknown = []
    for name in env:
        if name in NON_FIELD_ENV:
            continue
        section, _, field = name.removeprefix(ENV_PREFIX).lower().partition("__")
        info = Settings.model_fields.get(section)
        model = info.annotation if info else None
        fields = (
            model.model_fields if isinstance(model, type) and issubclass(model, BaseModel) else {}
        )
        if field not in fields:
            unknown.append(name)
    return unknown


@pytest.mark.parametrize("values", [None, ALL_ON], ids=["defaults", "all-on"])
def test_every_sidecar_env_var_is_a_settings_field(render: Any, values: Any) -> None:
    env = _sidecar_env(render(values))
    assert len(env) > 20
    assert _not_settings_fields(env) == []


def test_drifted_env_names_are_caught(render: Any) -> None:
    extra = [
        {"name": "SIDECAR_KAFKA__BROKER", "value": "x"},  # field renamed
        {"name": "SIDECAR_SCORE__KBS", "value": "[]"},  # section renamed
        {"name": "SIDECAR_WEBPORT", "value": "1"},  # no delimiter
    ]
    env = _sidecar_env(render({"extraEnv": extra}))
    assert sorted(_not_settings_fields(env)) == sorted(e["name"] for e in extra)


def test_rendered_env_parses_into_the_values_given(
    render: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    values = {
        "kafka": {"brokers": "kafka://k0:9092;kafka://k1:9092", "partitions": 12},
        "redis": {"url": "rediss://redis.prod:6380/2"},
        "scoring": {"kbs": ["billing", "claims"], "defaultKb": "billing", "failMode": "open"},
        "web": {"port": 7070},
        "log": {"level": "DEBUG", "json": False},
    }
    env = _sidecar_env(render(values))
    for key in list(os.environ):
        if key.startswith(ENV_PREFIX):
            monkeypatch.delenv(key)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("SIDECAR_SECRETS_DIR", str(tmp_path))  # no secret files here
    settings = load_settings()
    assert settings.kafka.brokers == "kafka://k0:9092;kafka://k1:9092"
    assert settings.kafka.partitions == 12
    assert settings.redis.url == "rediss://redis.prod:6380/2"
    assert settings.store.backend == "redis"
    assert settings.scoring.kbs == ("billing", "claims")
    assert settings.scoring.default_kb == "billing"
    assert settings.scoring.fail_mode == "open"
    assert settings.web.port == 7070
    assert settings.log.level == "DEBUG" and settings.log.json_lines is False


def test_default_values_hold_no_secret(render_raw: Any) -> None:
    values = yaml.safe_load((CHART_DIR / "values.yaml").read_text())
    for path, value in _walk(values):
        key = path.rsplit(".", 1)[-1]
        if SECRETISH.search(key) and isinstance(value, str):
            assert value == "", f"values.yaml{path} looks like a secret and is set"
    assert values["existingSecret"] == ""
    assert values["secret"] == {"create": False, "data": {}}


@pytest.mark.parametrize("values", [None, {"existingSecret": "sidecar-secrets"}])
def test_rendered_manifests_hold_no_secret(render: Any, values: Any) -> None:
    docs = render(values)
    assert not [key for key in docs if key[0] == "Secret"]
    secret_env = {f"{ENV_PREFIX}{name.upper()}" for name in _secret_fields()}
    assert secret_env, "Settings has SecretStr fields"
    assert not secret_env & set(_sidecar_env(docs)), "a secret setting is passed as env"
    for (kind, name), doc in docs.items():
        for path, value in _walk(doc):
            key = path.rsplit(".", 1)[-1]
            if not isinstance(value, str):
                continue
            if SECRETISH.search(key) and key != "secretName":
                pytest.fail(f"{kind}/{name}{path} = {value!r} looks like a secret")
            assert not CREDENTIAL_URL.search(value), f"{kind}/{name}{path}: password in a URL"


def test_chart_managed_secret_stays_in_the_secret(render: Any, render_raw: Any) -> None:
    docs = render(ALL_ON)
    secret_name = f"{FULLNAME}-secrets"
    secret = docs[("Secret", secret_name)]
    assert set(secret["data"]) == {"redis__password", "store__hmac_key"}
    assert base64.b64decode(secret["data"]["redis__password"]).decode() == SENTINEL
    encoded = base64.b64encode(SENTINEL.encode()).decode()
    for path, text in render_raw(ALL_ON).items():
        if path.endswith("templates/secret.yaml"):
            continue
        assert SENTINEL not in text and encoded not in text, f"secret value leaks into {path}"
    spec = pod_spec(docs[("Deployment", FULLNAME)])
    assert any(v.get("secret", {}).get("secretName") == secret_name for v in spec["volumes"])


def test_existing_secret_and_chart_secret_are_exclusive(render_raw: Any) -> None:
    helm_python = pytest.importorskip("helm_python")
    with pytest.raises(helm_python.HelmError, match="not both"):
        render_raw({"existingSecret": "s", "secret": {"create": True, "data": {}}})


@pytest.mark.parametrize("values", [{"existingSecret": "sidecar-secrets"}, ALL_ON])
def test_secret_is_mounted_read_only_at_the_secrets_dir(render: Any, values: Any) -> None:
    docs = render(values)
    expected = values.get("existingSecret") or f"{FULLNAME}-secrets"
    assert Path("/run/secrets/sidecar") == DEFAULT_SECRETS_DIR
    for doc in _workloads(docs):
        spec = pod_spec(doc)
        [volume] = [v for v in spec["volumes"] if "secret" in v]
        assert volume["secret"]["secretName"] == expected
        container = spec["containers"][0]
        [mount] = [m for m in container["volumeMounts"] if m["name"] == volume["name"]]
        assert mount["mountPath"] == str(DEFAULT_SECRETS_DIR)
        assert mount["readOnly"] is True
        env = {e["name"]: e["value"] for e in container["env"]}
        assert env["SIDECAR_SECRETS_DIR"] == str(DEFAULT_SECRETS_DIR)


def test_no_secret_volume_without_a_secret(render: Any) -> None:
    spec = pod_spec(render()[("Deployment", FULLNAME)])
    assert not [v for v in spec["volumes"] if "secret" in v]


@pytest.mark.parametrize("port", [6066, 7070])
def test_probes_hit_healthz_and_readyz_on_the_web_port(render: Any, port: int) -> None:
    docs = render({"web": {"port": port}})
    container = pod_spec(docs[("Deployment", FULLNAME)])["containers"][0]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"http": port}
    env_port = _sidecar_env(docs)["SIDECAR_WEB__PORT"]
    assert int(env_port) == port
    expected = {
        "startupProbe": "/healthz",
        "livenessProbe": "/healthz",
        "readinessProbe": "/readyz",
    }
    for probe, path in expected.items():
        get = container[probe]["httpGet"]
        assert get["path"] == path
        assert ports[get["port"]] == port
    startup = container["startupProbe"]
    # The encoder load (~10 s here, more on a cold node) must fit in the startup window.
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 120
    service = docs[("Service", FULLNAME)]
    assert service["spec"]["ports"][0]["targetPort"] == "http"


def test_worker_runs_non_root_on_a_read_only_root(render: Any) -> None:
    docs = render(ALL_ON)
    for doc in _workloads(docs):
        spec = pod_spec(doc)
        assert spec["securityContext"]["runAsNonRoot"] is True
        assert spec["securityContext"]["runAsUser"] != 0
        assert spec["automountServiceAccountToken"] is False
        container = spec["containers"][0]
        assert container["securityContext"]["readOnlyRootFilesystem"] is True
        assert container["securityContext"]["allowPrivilegeEscalation"] is False
        empty_dirs = {v["name"] for v in spec["volumes"] if "emptyDir" in v}
        writable = {m["mountPath"] for m in container["volumeMounts"] if m["name"] in empty_dirs}
        env = {e["name"]: e["value"] for e in container["env"]}
        assert "/tmp" in writable
        assert container["workingDir"] in writable
        assert env["HOME"] in writable


def test_worker_shape_for_a_consumer_group(render: Any) -> None:
    deployment = render()[("Deployment", FULLNAME)]
    assert deployment["spec"]["replicas"] == 2
    # No surge pod: an extra group member may get no partition and never become ready.
    assert deployment["spec"]["strategy"]["rollingUpdate"]["maxSurge"] == 0
    spec = pod_spec(deployment)
    assert spec["terminationGracePeriodSeconds"] >= 30
    anti = spec["affinity"]["podAntiAffinity"]
    assert anti["preferredDuringSchedulingIgnoredDuringExecution"]
    assert "requiredDuringSchedulingIgnoredDuringExecution" not in anti
    container = spec["containers"][0]
    assert container["args"][-1] == "worker"
    managed = pod_spec(render({"kafka": {"createTopics": False}})[("Deployment", FULLNAME)])
    assert managed["containers"][0]["args"][-2:] == ["worker", "--no-create-topics"]
    resources = container["resources"]
    assert resources["requests"] == {"cpu": "500m", "memory": "1Gi"}
    assert resources["limits"]["memory"] == "2Gi"


def _cli_accepts(args: list[str]) -> None:
    """The container args parse as a `sidecar` command line (option names included)."""
    from click.testing import CliRunner

    from sidecar.cli import main

    result = CliRunner().invoke(main, [*args, "--help"])
    assert result.exit_code == 0, f"sidecar {' '.join(args)}: {result.output}"
    assert "Usage: " in result.output


@pytest.mark.parametrize(
    "values",
    [None, {"kafka": {"createTopics": False}, "log": {"json": False}}],
    ids=["defaults", "managed-topics"],
)
def test_worker_args_are_a_valid_command_line(render: Any, values: Any) -> None:
    container = pod_spec(render(values)[("Deployment", FULLNAME)])["containers"][0]
    _cli_accepts(container["args"])


def test_retraining_args_are_a_valid_command_line(render: Any) -> None:
    from sidecar.cli import main

    if "train" not in main.commands:
        pytest.skip("`sidecar train` is not registered yet")
    docs = render({"retraining": {"enabled": True, "kbSource": {"configMap": "kb"}}})
    container = pod_spec(docs[("CronJob", f"{FULLNAME}-retrain")])["containers"][0]
    _cli_accepts(container["args"])
    gate = {"enabled": True, "maxFrr": 0.02, "oodQueries": "/kb/ood.jsonl", "minAuroc": 0.9}
    gated = render({"retraining": {"enabled": True, "kbSource": {"configMap": "kb"}, "gate": gate}})
    spec = pod_spec(gated[("CronJob", f"{FULLNAME}-retrain")])
    for container in [*spec["initContainers"], *spec["containers"]]:
        _cli_accepts(container["args"])


def test_the_gated_retraining_job_promotes_only_a_model_that_passes(
    render: Any, tmp_path: Path
) -> None:
    """The job's two command lines, as rendered, run one after the other (with the real
    encoder, a directory store, and /tmp moved under tmp_path) on the demo KB."""
    from click.testing import CliRunner

    from model_store import DirectoryStore
    from sidecar.cli import main

    data = Path(__file__).resolve().parents[2] / "sidecar" / "data"
    kb = tmp_path / "kb"
    kb.mkdir()
    (kb / "kb.jsonl").write_text((data / "demo_kb.jsonl").read_text())
    for name, cut in (("id", 50), ("ood", 40)):  # the rest held out for the gate
        lines = (data / f"demo_{name}_queries.jsonl").read_text().splitlines(keepends=True)
        (kb / f"{name}.jsonl").write_text("".join(lines[:cut]))
        (kb / f"held_{name}.jsonl").write_text("".join(lines[cut:]))
    env = {
        "HOME": str(tmp_path),  # as the chart sets it: caches under ~ go to /tmp
        "SIDECAR_STORE__BACKEND": "directory",
        "SIDECAR_STORE__DIRECTORY": str(tmp_path / "store"),
    }

    # the pod's /tmp (an emptyDir both containers mount) under tmp_path
    moved = {f"/tmp/{n}": str(tmp_path / n) for n in ("train-out", "candidate.json")}

    def run_job(seed: str, gate: dict[str, Any]) -> list[int]:
        train = ["train", "--kb", f"{kb}/kb.jsonl", "--id-queries", f"{kb}/id.jsonl"]
        train += ["--ood-queries", f"{kb}/ood.jsonl", "--detector", "knn", "--seed", seed]
        values = {
            "scoring": {"kbs": ["default", "clinic"]},
            "retraining": {
                "enabled": True,
                "kbSource": {"configMap": "kb"},
                "kbName": "clinic",
                "args": [*train, "--out", "/tmp/train-out", "--no-report", "--publish"],
                "gate": {
                    "enabled": True,
                    "idQueries": f"{kb}/held_id.jsonl",
                    "oodQueries": f"{kb}/held_ood.jsonl",
                    **gate,
                },
            },
        }
        spec = pod_spec(render(values)[("CronJob", f"{FULLNAME}-retrain")])
        codes = []
        for container in [*spec["initContainers"], *spec["containers"]]:
            args = [moved.get(a, a) for a in container["args"]]
            res = CliRunner().invoke(main, args, env=env)
            codes.append(res.exit_code)
            if res.exit_code:
                break
        return codes

    assert run_job("0", {"maxFrr": 1}) == [0, 0]
    store = DirectoryStore(tmp_path / "store")
    first = store.active("clinic")
    assert first is not None and len(store.versions("clinic")) == 1
    # 0 of 20 held-out OOD queries accepted still leaves a 95% interval up to 17%:
    # a conservative 5% limit cannot pass, and the serving version stays
    assert run_job("1", {"maxOodAccept": 0.05, "conservative": True}) == [0, 1]
    assert store.active("clinic") == first and len(store.versions("clinic")) == 2
