"""Threshold rules (conformal FRR vs balanced) and the combined detector's kNN blocks."""

from __future__ import annotations

import numpy as np
import pytest

from model_store import decode, encode
from sidecar.errors import ConfigError
from sidecar.persistence import model_from_artifact, model_to_artifact
from sidecar.scoring import OODModel, fit_ood_model
from sidecar.training import carve_splits, search
from sidecar.training._fitting import balanced_threshold
from sidecar.training._grid import Candidate

D = 16
ENC = {"name": "fake-encoder", "dim": D}


def _unit(X: np.ndarray) -> np.ndarray:
    return (X / np.linalg.norm(X, axis=1, keepdims=True)).astype(np.float32)


def _data(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    centre = np.r_[3.0, np.zeros(D - 1)]
    spread = np.r_[np.ones(6), np.full(D - 6, 0.05)]

    def near(n: int) -> np.ndarray:
        return _unit(centre + rng.normal(size=(n, D)) * spread)

    return {
        "kb": near(120),
        "id": near(150),
        "ood": _unit(rng.normal(size=(200, D)) + np.r_[np.zeros(6), 2.0, np.zeros(D - 7)]),
    }


def test_balanced_threshold_separates_separable_scores() -> None:
    s_id, s_ood = np.array([0.0, 0.1, 0.2, 0.3]), np.array([0.5, 0.6, 0.9])
    t = balanced_threshold(s_id, s_ood)
    assert 0.3 < t < 0.5  # score > t is OOD: every ID accepted, every OOD flagged


def test_balanced_threshold_maximises_balanced_accuracy() -> None:
    rng = np.random.default_rng(1)
    s_id, s_ood = rng.normal(0, 1, 300), rng.normal(2, 1, 200)
    t = balanced_threshold(s_id, s_ood)

    def ba(th: float) -> float:
        return float((np.mean(s_id <= th) + np.mean(s_ood > th)) / 2)

    grid = np.linspace(-3, 5, 801)
    assert ba(t) >= max(ba(g) for g in grid) - 1e-12


def test_ood_calibration_split_is_disjoint_and_optional() -> None:
    d = _data()
    plain = carve_splits(d["kb"], d["id"], d["ood"], seed=0)
    assert plain.ood_cal is None
    s = carve_splits(d["kb"], d["id"], d["ood"], seed=0, ood_cal_fraction=0.2)
    assert s.ood_cal is not None and len(s.ood_cal) == 40
    assert s.ood_fit is not None and s.ood_val is not None
    rows = {r.tobytes() for r in s.ood_cal}
    assert not rows & {r.tobytes() for r in np.vstack([s.ood_fit, s.ood_val])}


def test_search_with_balanced_rule_moves_the_threshold() -> None:
    d = _data()
    s = carve_splits(d["kb"], d["id"], d["ood"], seed=0, ood_cal_fraction=0.2)
    grid = [Candidate("logreg", 4, {"C": 1.0})]
    frr = search(s, "logreg", kb_name="k", encoder=ENC, grid=grid, target_frr=0.05)
    bal = search(s, "logreg", kb_name="k", encoder=ENC, grid=grid, threshold_rule="balanced")
    assert bal.model.params["threshold_rule"] == "balanced"
    assert bal.model.metrics["threshold_rule"] == "balanced"
    assert s.ood_cal is not None
    expect = balanced_threshold(bal.model.score(s.id_cal), bal.model.score(s.ood_cal))
    assert bal.model.threshold == expect
    assert "threshold_rule" not in frr.model.params
    with pytest.raises(ConfigError, match="threshold rule"):
        search(s, "logreg", kb_name="k", encoder=ENC, grid=grid, threshold_rule="oracle")
    no_cal = carve_splits(d["kb"], d["id"], d["ood"], seed=0)
    with pytest.raises(ConfigError, match="OOD training queries to hold some out for calibration"):
        search(no_cal, "logreg", kb_name="k", encoder=ENC, grid=grid, threshold_rule="balanced")


def _combined(features: list[str]) -> OODModel:
    d = _data()
    return fit_ood_model(
        kb="k",
        encoder=ENC,
        kb_embeddings=d["kb"],
        id_embeddings=d["id"],
        ood_embeddings=d["ood"],
        detector="combined",
        m=4,
        k=8,
        detector_params={"features": features, "knn_ks": [1, 3], "neighbour_ks": [1, 2]},
    )


def test_knn_and_neighbour_blocks_round_trip_bit_exact() -> None:
    model = _combined(["pcs", "residual", "knn", "neighbours"])
    assert model.dims == 4 + 1 + 2 + 4
    E = _data(seed=7)["ood"][:30]
    loaded = model_from_artifact(decode(*encode(model_to_artifact(model)), expected_encoder=ENC))
    assert np.array_equal(loaded.score(E), model.score(E))
    assert loaded.threshold == model.threshold


def test_knn_block_is_distance_to_kth_nearest_kb_document() -> None:
    model = _combined(["pcs", "knn"])
    d = _data()
    q = d["ood"][:5]
    sims = np.sort(q @ d["kb"].T, axis=1)[:, ::-1]
    feats = model.features(q)[:, -2:]
    np.testing.assert_allclose(feats, 1.0 - sims[:, [0, 2]], atol=1e-5)


def test_a_training_query_is_not_its_own_labelled_neighbour() -> None:
    model = _combined(["pcs", "neighbours"])
    bank = model.detector.id_bank_  # type: ignore[attr-defined]
    nb = model.features(bank[:10])[:, 4]  # 1 - cosine of the nearest other ID query
    assert np.all(nb > 1e-4)
    fresh = _unit(bank[:10] + 0.01)  # near but not equal: its neighbour is very close
    assert np.all(model.features(fresh)[:, 4] < nb + 1e-3)


def test_neighbour_block_needs_ood_queries() -> None:
    d = _data()
    with pytest.raises(ConfigError):
        fit_ood_model(
            kb="k",
            encoder=ENC,
            kb_embeddings=d["kb"],
            id_embeddings=d["id"],
            detector="combined",
            m=4,
            k=8,
            detector_params={"features": ["pcs", "neighbours"]},
        )
