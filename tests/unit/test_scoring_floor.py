"""The combined detector's floor: evidence learned from no OOD query, which the weights
learned from the OOD training families cannot override."""

from __future__ import annotations

import numpy as np
import pytest

from model_store import decode, encode
from sidecar.errors import DataError
from sidecar.persistence import model_from_artifact, model_to_artifact
from sidecar.scoring import CombinedDetector, fit_ood_model


def _family_data() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Columns [pc0, pc1, residual]. ID: pcs around 0, residual about 1. The training OOD
    family differs from ID in pc0 alone (+4); an unseen family sits at pc0 = -4, where
    the learned weights say ID, but far from the KB (residual 3)."""
    rng = np.random.default_rng(0)

    def rows(n: int, pc0: float, res: float) -> np.ndarray:
        return np.c_[rng.normal(pc0, 1.0, n), rng.normal(0, 1.0, n), rng.normal(res, 0.1, n)]

    return rows(300, 0.0, 1.0), rows(300, 4.0, 1.0), rows(100, -4.0, 3.0)


def _fitted(floor: list[str] | None) -> CombinedDetector:
    ID, OOD, _ = _family_data()
    det = CombinedDetector(features=["pcs", "residual"], floor=floor)
    det.set_blocks({"pcs": 2, "residual": 1})
    X = np.vstack([ID, OOD])
    return det.fit(X, np.r_[np.zeros(len(ID)), np.ones(len(OOD))])


def test_the_floor_refuses_an_unseen_family_the_weights_call_in_domain() -> None:
    ID, OOD, unseen = _family_data()
    plain, floored = _fitted(None), _fitted(["residual"])
    # the weights learned pc0: the unseen family looks more in-domain than ID itself
    assert plain.score_samples(unseen).max() < np.median(plain.score_samples(ID))
    # with the floor every unseen query scores above every ID training query
    assert floored.score_samples(unseen).min() > floored.score_samples(ID).max()
    # and the family the weights learned from is still refused as before
    assert floored.score_samples(OOD).mean() > np.quantile(floored.score_samples(ID), 0.99)


def test_the_floor_is_the_larger_of_the_pinned_regression_and_the_pinned_columns() -> None:
    ID, OOD, unseen = _family_data()
    det = _fitted(["residual"])
    log_odds = unseen @ det.coef_ + det.intercept_
    # the regression is pinned by its log-odds of the ID rows from fits that did not see
    # them, which are less confident than the fitted model's own
    X, y = np.vstack([ID, OOD]), np.r_[np.zeros(len(ID)), np.ones(len(OOD))]
    sup_id = det._cross_fit_id_log_odds(X, y)
    assert sup_id.shape == (len(ID),)
    assert np.quantile(sup_id, 0.99) > np.quantile(ID @ det.coef_ + det.intercept_, 0.99)
    sup = (log_odds - np.median(sup_id)) / (
        np.quantile(sup_id, det.SUPERVISED_QUANTILE) - np.median(sup_id)
    )
    res = ID[:, 2]
    kb = (unseen[:, 2] - np.median(res)) / (np.quantile(res, det.FLOOR_QUANTILE) - np.median(res))
    assert np.allclose(det.score_samples(unseen), np.maximum(sup, kb))


def test_the_floor_reads_the_id_half_of_the_neighbours_block() -> None:
    det = CombinedDetector(features=["pcs", "max_cosine", "neighbours"], floor=["neighbours"])
    det.set_blocks({"pcs": 4, "max_cosine": 1, "neighbours": 6})
    assert det._floor_columns().tolist() == [5, 6, 7]
    det = CombinedDetector(features=["pcs", "max_cosine", "neighbours"], floor=["max_cosine"])
    det.set_blocks({"pcs": 4, "max_cosine": 1, "neighbours": 6})
    assert det._floor_columns().tolist() == [4]


@pytest.mark.parametrize(
    ("features", "floor", "words"),
    [
        (["pcs", "residual"], ["pcs"], "floor blocks ['pcs']"),
        (["pcs", "residual"], ["max_cosine"], "floor blocks ['max_cosine']"),
    ],
)
def test_a_floor_outside_the_kb_only_blocks_of_its_features_is_refused(
    features: list[str], floor: list[str], words: str
) -> None:
    ID, OOD, _ = _family_data()
    det = CombinedDetector(features=features, floor=floor)
    det.set_blocks({"pcs": 2, "residual": 1})
    with pytest.raises(DataError, match=words.replace("[", r"\[").replace("]", r"\]")):
        det.fit(np.vstack([ID, OOD]), np.r_[np.zeros(300), np.ones(300)])


def test_a_floor_without_block_widths_is_refused() -> None:
    ID, OOD, _ = _family_data()
    det = CombinedDetector(features=["pcs", "residual"], floor=["residual"])
    with pytest.raises(DataError, match="block widths"):
        det.fit(np.vstack([ID, OOD]), np.r_[np.zeros(300), np.ones(300)])


def test_a_floored_model_survives_the_artifact_round_trip_bit_exact() -> None:
    rng = np.random.default_rng(1)
    dim = 16

    def unit(X: np.ndarray) -> np.ndarray:
        return (X / np.linalg.norm(X, axis=1, keepdims=True)).astype(np.float32)

    centre = np.r_[3.0, np.zeros(dim - 1)]
    kb, idq = (unit(centre + rng.normal(size=(n, dim))) for n in (60, 80))
    ood = unit(rng.normal(size=(80, dim)) + np.r_[np.zeros(6), 2.0, np.zeros(dim - 7)])
    enc = {"name": "fake-encoder", "dim": dim}
    model = fit_ood_model(
        kb="kb",
        encoder=enc,
        kb_embeddings=kb,
        id_embeddings=idq,
        ood_embeddings=ood,
        detector="combined",
        m=4,
        k=8,
        residual_ks=(4, 8),
        detector_params={
            "features": ["pcs", "residual", "max_cosine", "neighbours"],
            "neighbour_ks": [1, 3],
            "floor": ["residual", "max_cosine", "neighbours"],
        },
    )
    assert model.detector.floor_cols_.tolist() == [4, 5, 6, 7, 8]  # 2 residual, cos, 2 ID
    manifest, npz = encode(model_to_artifact(model))
    loaded = model_from_artifact(decode(manifest, npz, expected_encoder=enc))
    E = unit(rng.normal(size=(30, dim)))
    assert np.array_equal(loaded.score(E), model.score(E))
    assert loaded.threshold == model.threshold


def test_by_default_every_combined_candidate_is_floored_with_its_ood_free_blocks() -> None:
    from sidecar.training import combined_grid, default_grid

    assert all("floor" not in c.params for c in combined_grid(floor=False))
    grid = combined_grid()
    assert [c.params for c in grid] == [c.params for c in default_grid("combined")]
    for cand in grid:
        feats = cand.params["features"]
        want = [b for b in ("residual", "max_cosine", "knn", "neighbours") if b in feats]
        assert cand.params["floor"] == want and want
    assert any("neighbours" in c.params["floor"] for c in grid)
    custom = combined_grid(["pcs", "knn"])  # no default candidate has these blocks
    assert {tuple(c.params["floor"]) for c in custom} == {("knn",)}


def test_train_config_floor_reaches_the_searched_grid_and_only_the_combined_detector() -> None:
    from sidecar.errors import ConfigError
    from sidecar.training import TrainConfig, check_config
    from sidecar.training._job import build_grid

    assert all("floor" not in c.params for c in build_grid(TrainConfig(floor=False)))
    for floor in (None, True):
        floored = build_grid(TrainConfig(floor=floor, m=13))
        assert floored and all(c.params["floor"] and c.m == 13 for c in floored)
    check_config(TrainConfig(floor=True))
    check_config(TrainConfig(detector="max_cosine"))  # the default floor is the combined's
    with pytest.raises(ConfigError, match="--floor"):
        check_config(TrainConfig(detector="max_cosine", floor=True))
    with pytest.raises(ConfigError, match="--no-floor"):
        check_config(TrainConfig(detector="max_cosine", floor=False))
