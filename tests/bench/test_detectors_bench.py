"""``sidecar bench detectors`` writes the documented JSON shape (tiny run)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from sidecar.cli import main


def test_bench_detectors_json_shape(tmp_path: Path) -> None:
    out = tmp_path / "detectors.json"
    result = CliRunner().invoke(
        main,
        [
            "bench",
            "detectors",
            "--json",
            str(out),
            "--n-train",
            "150",
            "--repeats",
            "1",
            "--scale-n",
            "300",
            "--scale-m",
            "8",
            "--detectors",
            "epsilon_ball,epsilon_cube,residual",
        ],
    )
    assert result.exit_code == 0, result.output
    doc = json.loads(out.read_text())
    assert set(doc["detectors"]) == {"epsilon_ball", "epsilon_cube", "residual"}
    for row in doc["detectors"].values():
        assert row["us_per_query_batch1"] > 0 and row["us_per_query_batch256"] > 0
    assert doc["reference"]["sklearn_RadiusNeighborsClassifier"]["us_per_query_batch256"] > 0
    cube = doc["reference"]["epsilon_cube_nearest_id"]
    assert cube["kdtree_us_per_query_batch256"] > 0 and cube["scan_us_per_query_batch256"] > 0
    assert "epsilon_rect_nearest_id" not in doc["reference"]  # only the detectors asked for
    assert set(doc["scale"]["by_n_train"]["epsilon_cube"]) == {"300"}
    assert set(doc["scale"]["by_m"]["logreg"]) == {"8"}
    assert doc["machine"]["cpu_count"] >= 1


def test_unknown_detector_is_one_error_line(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        main, ["bench", "detectors", "--json", str(tmp_path / "x.json"), "--detectors", "nope"]
    )
    assert result.exit_code == 2
    assert "unknown detectors: nope" in result.output


def test_machine_facts_name_the_cpu_numba_was_told_to_compile_for(monkeypatch) -> None:
    from sidecar.bench._timing import cpu_facts

    monkeypatch.delenv("NUMBA_CPU_NAME", raising=False)
    host = cpu_facts()
    if not host:
        pytest.skip("no /proc/cpuinfo here: cpu_facts records nothing")
    assert host["llvm_cpu"] and "llvm_cpu_features" not in host
    monkeypatch.setenv("NUMBA_CPU_NAME", "znver2")
    monkeypatch.setenv("NUMBA_CPU_FEATURES", "")
    told = cpu_facts()
    assert told["llvm_cpu"] == "znver2" and told["llvm_cpu_features"] == ""
    monkeypatch.delenv("NUMBA_CPU_FEATURES")
    assert cpu_facts()["llvm_cpu_features"] == "host"  # numba keeps the host's features
