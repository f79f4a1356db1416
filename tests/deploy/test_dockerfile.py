"""The image recipe: CPU torch pinned and installed before the project, non-root, offline."""

from __future__ import annotations

import re
import tomllib

import pytest
import yaml
from _chart_render import CHART_DIR, DOCKERFILE, REPO

pytestmark = pytest.mark.deploy

TORCH = "torch==2.13.0"
CPU_INDEX = "https://download.pytorch.org/whl/cpu"


def _instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    joined: list[str] = []
    pending = ""
    for raw in DOCKERFILE.read_text().splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        joined.append(pending + line)
        pending = ""
    assert not pending, "dangling line continuation"
    out = []
    for line in joined:
        word, _, rest = line.partition(" ")
        out.append((word.upper(), rest.strip()))
    return out


def _runtime_stage() -> list[tuple[str, str]]:
    steps = _instructions()
    last_from = max(i for i, (word, _) in enumerate(steps) if word == "FROM")
    return steps[last_from:]


def test_torch_cpu_is_installed_before_the_project() -> None:
    runs = [args for word, args in _instructions() if word == "RUN"]
    torch_at = [i for i, run in enumerate(runs) if TORCH in run.split()]
    assert torch_at, f"no RUN installs {TORCH}"
    assert f"--index-url {CPU_INDEX}" in runs[torch_at[0]]
    project_at = [
        i
        for i, run in enumerate(runs)
        if re.search(r"pip install\b.*\s\"?(\.|/src)(\s|$|\[|\")", run + " ") and TORCH not in run
    ]
    assert project_at, "no RUN installs the project"
    assert torch_at[0] < project_at[0]


def test_base_image_is_python_311_slim_and_multi_stage() -> None:
    steps = _instructions()
    args = {a.split("=", 1)[0]: a.split("=", 1)[1] for w, a in steps if w == "ARG" and "=" in a}
    froms = [a for w, a in steps if w == "FROM"]
    assert len(froms) >= 2
    for line in froms:
        image = line.split()[0]
        image = args.get(image.strip("${}"), image)
        assert image == "python:3.11-slim"
    runtime = _runtime_stage()
    assert any(w == "COPY" and "--from=build" in a for w, a in runtime)


def test_runtime_is_non_root_offline_and_runs_the_worker() -> None:
    runtime = _runtime_stage()
    users = [a for w, a in runtime if w == "USER"]
    assert users and users[-1].split(":")[0] not in {"0", "root"}
    env_text = " ".join(a for w, a in runtime if w == "ENV")
    assert "HF_HUB_OFFLINE=1" in env_text
    assert "ORT_DISABLE_TELEMETRY=1" in env_text  # onnxruntime's usage telemetry
    assert ("ENTRYPOINT", '["sidecar"]') in runtime
    assert ("CMD", '["worker"]') in runtime
    assert not [w for w, _ in runtime if w == "HEALTHCHECK"]
    # The chart's pod security context runs as the image's user.
    values = yaml.safe_load((CHART_DIR / "values.yaml").read_text())
    assert users[-1].split(":")[0] == str(values["podSecurityContext"]["runAsUser"])


def test_chart_app_version_is_the_package_version() -> None:
    chart = yaml.safe_load((CHART_DIR / "Chart.yaml").read_text())
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert chart["appVersion"] == project["version"]
    assert chart["apiVersion"] == "v2"


def test_the_image_carries_a_checked_encoder_export_where_workers_look() -> None:
    steps = _instructions()
    runtime_at = max(i for i, (word, _) in enumerate(steps) if word == "FROM")
    build, runtime = steps[:runtime_at], steps[runtime_at:]
    prepared = [
        a.split("--dir", 1)[1].split()[0]
        for w, a in build
        if w == "RUN" and "sidecar prepare-encoder" in a
    ]
    assert len(prepared) == 1, "the build stage must export the encoder once"
    where = prepared[0]
    copied = [a.split()[1] for w, a in runtime if w == "COPY" and a.startswith("--from=build")]
    assert any(where == c or where.startswith(c.rstrip("/") + "/") for c in copied)
    env_text = " ".join(a for w, a in runtime if w == "ENV")
    assert f"SIDECAR_SCORING__ONNX_PREBUILT_DIR={where}" in env_text
    values = yaml.safe_load((CHART_DIR / "values.yaml").read_text())
    assert values["scoring"]["onnxPrebuiltDir"] == where
