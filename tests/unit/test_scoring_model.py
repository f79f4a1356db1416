"""OODModel: fitting, features, calibration, and the artifact round trip."""

from __future__ import annotations

import json
from functools import cache

import numpy as np
import pytest

from model_store import (
    ArtifactCorrupt,
    IncompatibleArtifact,
    SignatureInvalid,
    build_artifact,
    decode,
    encode,
)
from sidecar.errors import ConfigError, EncoderMismatch
from sidecar.persistence import model_from_artifact, model_to_artifact
from sidecar.scoring import (
    FitConfig,
    KBSubspace,
    OODModel,
    detector_kinds,
    fit_model,
    fit_ood_model,
)

D = 16
ENC = {"name": "fake-encoder", "dim": D}


def _unit(X: np.ndarray) -> np.ndarray:
    return (X / np.linalg.norm(X, axis=1, keepdims=True)).astype(np.float32)


@cache
def _data() -> dict[str, np.ndarray]:
    """KB and ID queries live near e0 in the first 6 dims; OOD elsewhere."""
    rng = np.random.default_rng(0)
    centre = np.r_[3.0, np.zeros(D - 1)]
    spread = np.r_[np.ones(6), np.full(D - 6, 0.05)]

    def near(n: int) -> np.ndarray:
        return _unit(centre + rng.normal(size=(n, D)) * spread)

    return {
        "kb": near(120),
        "id": near(100),
        "ood": _unit(rng.normal(size=(100, D)) + np.r_[0, 0, 0, 0, 0, 0, 2.0, np.zeros(D - 7)]),
        "test": np.vstack([near(20), _unit(rng.normal(size=(20, D)))]),
    }


@cache
def _model(kind: str, criterion: str = "pvalue") -> OODModel:
    d = _data()
    return fit_ood_model(
        kb="kb1",
        encoder=ENC,
        kb_embeddings=d["kb"],
        id_embeddings=d["id"],
        ood_embeddings=d["ood"],
        detector=kind,
        criterion=criterion,
        m=4,
        k=8,
    )


@pytest.mark.parametrize("kind", detector_kinds())
def test_artifact_round_trip_is_bit_exact(kind: str) -> None:
    model = _model(kind)
    manifest, npz = encode(model_to_artifact(model))
    loaded = model_from_artifact(decode(manifest, npz, expected_encoder=ENC))
    E = _data()["test"]
    assert np.array_equal(loaded.score(E), model.score(E))
    assert np.array_equal(loaded.predict(E), model.predict(E))
    assert loaded.threshold == model.threshold
    assert loaded.selected_pcs.tolist() == model.selected_pcs.tolist()
    assert loaded.version == model_to_artifact(model).version
    # Re-encoding the loaded model gives the same content, hence the same version.
    assert model_to_artifact(loaded).version == model_to_artifact(model).version


@pytest.mark.parametrize("kind", detector_kinds())
def test_models_separate_id_from_ood(kind: str) -> None:
    E = _data()["test"]
    s = _model(kind).score(E)
    assert s.shape == (40,) and s.dtype == np.float64
    assert s[20:].mean() > s[:20].mean()


@pytest.mark.parametrize("kind", detector_kinds())
def test_a_query_that_is_not_all_numbers_is_nan_and_predicted_ood(kind: str) -> None:
    E = _data()["test"][:3].copy()
    E[0, 5] = np.nan
    model = _model(kind)
    s = model.score(E)
    assert np.isnan(s[0]) and np.isfinite(s[1:]).all()
    assert model.predict(E)[0]  # refused, never waved through as ID


@pytest.mark.parametrize(
    "kind",
    [
        "residual",
        "max_cosine",
        "knn",
        "mahalanobis",
        "epsilon_ball",
        "epsilon_cube",
        "epsilon_rect",
        "gmm",
        "svm",
    ],
)
def test_kb_only_models_flag_a_far_point(kind: str) -> None:
    d = _data()
    model = fit_ood_model(
        kb="kb1",
        encoder=ENC,
        kb_embeddings=d["kb"],
        id_embeddings=d["id"],
        detector=kind,
        criterion="evr",
        m=4,
        k=8,
    )
    if "pcs" in model.detector.inputs:  # far along the selected PCs
        far = model.mean + 3.0 * model.components[model.selected_pcs].sum(axis=0)
    else:  # far outside the KB: opposite direction, energy where the KB has none
        far = np.r_[-1.0, np.zeros(5), np.ones(D - 6)]
    far = far[None, :].astype(np.float32)
    assert model.predict(far).tolist() == [True]
    assert model.score(far)[0] > model.score(d["id"]).max()


def test_model_features_match_the_subspace() -> None:
    d = _data()
    model = fit_ood_model(
        kb="kb1",
        encoder=ENC,
        kb_embeddings=d["kb"],
        id_embeddings=d["id"],
        ood_embeddings=d["ood"],
        detector="combined",
        m=3,
        k=8,
        residual_ks=(2, 8),
        detector_params={"features": ["pcs", "residual", "max_cosine"]},
    )
    sub = KBSubspace(8).fit(d["kb"])
    E = d["test"]
    F = model.features(E)
    assert F.shape == (40, 3 + 2 + 1) and model.dims == 6
    np.testing.assert_allclose(
        np.abs(F[:, :3]), np.abs(sub.project(E, model.selected_pcs)), atol=1e-5
    )
    np.testing.assert_allclose(F[:, 4], sub.residual_norm(E), atol=1e-5)
    maxcos = 1.0 - (E @ d["kb"].T).max(axis=1)
    np.testing.assert_allclose(F[:, 5], maxcos, atol=1e-5)
    assert model_to_artifact(model).model["inputs"] == ["pcs", "residual", "max_cosine"]


def test_threshold_is_calibrated_on_held_out_id() -> None:
    model = _model("combined")
    assert model.metrics["n_calibration"] == 30 and model.metrics["n_id_fit"] == 70
    assert model.metrics["calibration_frr"] <= 0.05 + 1e-12


def test_explicit_calibration_set() -> None:
    d = _data()
    model = fit_ood_model(
        kb="kb1",
        encoder=ENC,
        kb_embeddings=d["kb"],
        id_embeddings=d["id"][:60],
        calibration_embeddings=d["id"][60:],
        detector="residual",
        criterion="evr",
        m=4,
        k=8,
        target_frr=0.05,
    )
    cal_scores = np.sort(model.score(d["id"][60:]))
    assert model.threshold == cal_scores[int(np.ceil(41 * 0.95)) - 1]


def test_pvalue_without_ood_is_refused() -> None:
    d = _data()
    with pytest.raises(ConfigError):
        fit_ood_model(
            kb="kb1",
            encoder=ENC,
            kb_embeddings=d["kb"],
            id_embeddings=d["id"],
            detector="epsilon_ball",
            criterion="pvalue",
        )
    with pytest.raises(ConfigError):
        fit_ood_model(
            kb="kb1",
            encoder=ENC,
            kb_embeddings=d["kb"],
            id_embeddings=d["id"],
            detector="combined",
            criterion="evr",
        )


def test_encoder_mismatch_is_refused() -> None:
    model = _model("combined")
    model.check_encoder("fake-encoder", D)
    with pytest.raises(EncoderMismatch):
        model.check_encoder("other-encoder", D)
    with pytest.raises(EncoderMismatch):
        model.check_encoder("fake-encoder", D + 1)
    with pytest.raises(EncoderMismatch):
        model.score(np.zeros((2, D + 1), dtype=np.float32))
    manifest, npz = encode(model_to_artifact(model))
    with pytest.raises(IncompatibleArtifact):
        decode(manifest, npz, expected_encoder={"name": "other-encoder", "dim": D})


def test_tampered_array_is_refused() -> None:
    art = model_to_artifact(_model("epsilon_ball"))
    arrays = dict(art.arrays)
    pts = arrays["detector.id_points"].copy()
    pts[0, 0] += 1e-9
    arrays["detector.id_points"] = pts
    tampered = type(art)(art.manifest, arrays)
    with pytest.raises(ArtifactCorrupt):
        decode(*encode(tampered))


def test_a_model_section_with_an_infinite_count_is_incompatible() -> None:
    # JSON's Infinity parses; int() of it raised OverflowError past the malformed check.
    art = model_to_artifact(_model("logreg"))
    manifest = json.loads(json.dumps(art.manifest))
    manifest["model"]["k"] = float("inf")
    with pytest.raises(IncompatibleArtifact, match="OverflowError"):
        model_from_artifact(type(art)(manifest, art.arrays))


def test_tampered_manifest_is_refused_when_signed() -> None:
    key = b"k" * 32
    art = model_to_artifact(_model("combined")).signed(key)
    manifest, npz = encode(art)
    doc = json.loads(manifest)
    doc["model"]["threshold"] = 1e9  # let every query through
    with pytest.raises(SignatureInvalid):
        decode(json.dumps(doc).encode(), npz, hmac_key=key)
    decode(manifest, npz, hmac_key=key)  # the untouched one loads


def _rebuilt(model_section: dict, arrays: dict) -> OODModel:
    art = build_artifact(kb="kb1", encoder=ENC, model=model_section, arrays=arrays)
    return model_from_artifact(decode(*encode(art)))


def test_unknown_kind_and_malformed_sections_are_refused() -> None:
    art = model_to_artifact(_model("combined"))
    arrays = dict(art.arrays)
    with pytest.raises(IncompatibleArtifact, match="unknown detector kind"):
        _rebuilt({**art.model, "kind": "crystal_ball"}, arrays)
    with pytest.raises(IncompatibleArtifact):
        _rebuilt({k: v for k, v in art.model.items() if k != "threshold"}, arrays)
    with pytest.raises(IncompatibleArtifact):
        _rebuilt({**art.model, "selected_pcs": [0, 1, 2, 99]}, arrays)
    with pytest.raises(IncompatibleArtifact):
        _rebuilt({**art.model, "format": "something-else"}, arrays)
    short = {k: v for k, v in arrays.items() if k != "detector.coef"}
    with pytest.raises(IncompatibleArtifact):
        _rebuilt(art.model, short)
    bad_coef = {**arrays, "detector.coef": np.zeros(3)}
    with pytest.raises(IncompatibleArtifact):
        _rebuilt(art.model, bad_coef)
    # an unsigned manifest edit that would let every query through, or misreport the model
    for edit in ({"threshold": float("nan")}, {"threshold": float("inf")}):
        with pytest.raises(IncompatibleArtifact, match="threshold must be finite"):
            _rebuilt({**art.model, **edit}, arrays)
    for edit in ({"m": -3}, {"dims": 99}):
        with pytest.raises(IncompatibleArtifact, match="manifest says"):
            _rebuilt({**art.model, **edit}, arrays)
    _rebuilt(art.model, arrays)  # the untouched one loads


def test_manifest_describes_the_model() -> None:
    model = _model("combined")
    section = model_to_artifact(model).model
    assert section["kind"] == "combined" and section["criterion"] == "pvalue"
    assert section["m"] == 4 and section["k"] == 8 and len(section["selected_pcs"]) == 4
    assert section["threshold"] == model.threshold
    assert "higher = more out-of-domain" in section["score"]


def test_batch_of_one_matches_the_batch() -> None:
    model = _model("combined")
    E = _data()["test"]
    one = np.array([model.score(E[i])[0] for i in range(len(E))])
    # float32 max-cosine: BLAS kernels differ by batch size, within float32 rounding.
    np.testing.assert_allclose(one, model.score(E), rtol=1e-5, atol=1e-6)


def test_fit_model_with_a_config_is_fit_ood_model() -> None:
    d = _data()
    config = FitConfig(detector="combined", m=4, k=8)
    model = fit_model(d["kb"], d["id"], d["ood"], kb="kb1", encoder=ENC, config=config)
    same = _model("combined")
    assert model.threshold == same.threshold
    assert model.params == same.params and model.metrics == same.metrics
    np.testing.assert_array_equal(model.score(d["test"]), same.score(d["test"]))
