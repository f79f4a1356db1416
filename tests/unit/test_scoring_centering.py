"""Language centring: the means, the transform, a centred model's scores and its artifact."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from model_store import decode, encode
from sidecar.errors import DataError, InvalidModelState
from sidecar.persistence import model_from_artifact, model_to_artifact
from sidecar.scoring import (
    MIN_LANGUAGE_TEXTS,
    DenyTopics,
    LanguageCentering,
    conformal_threshold,
    fit_ood_model,
    model_from_state,
    model_state,
    recalibrate,
    recalibrate_by_language,
)
from sidecar.scoring._model import MODEL_FORMAT, MODEL_FORMAT_DENY

DIM = 16


def _unit(X: np.ndarray) -> np.ndarray:
    return (X / np.linalg.norm(X, axis=1, keepdims=True)).astype(np.float32)


def _axis(i: int, scale: float = 1.0) -> np.ndarray:
    v = np.zeros(DIM)
    v[i] = scale
    return v


def test_the_means_are_per_language_with_enough_texts_and_the_global_one_otherwise() -> None:
    rng = np.random.default_rng(0)
    n_de, n_fr = MIN_LANGUAGE_TEXTS, MIN_LANGUAGE_TEXTS - 1
    E = _unit(rng.normal(size=(n_de + n_fr + 7, DIM)))
    langs = ["de"] * n_de + ["fr"] * n_fr + ["und"] * 3 + [None] * 4
    c = LanguageCentering.fit(E, langs)
    assert c.languages == ("de",)  # fr has one text too few
    assert c.counts == {"de": n_de, "fr": n_fr, "*": len(E)}
    np.testing.assert_allclose(c.global_mean, E.mean(axis=0), atol=1e-6)
    np.testing.assert_allclose(c.mean_for("de"), E[:n_de].mean(axis=0), atol=1e-6)
    for other in ("fr", "und", None, "xx"):
        np.testing.assert_array_equal(c.mean_for(other), c.global_mean)


def test_transform_subtracts_each_rows_mean_and_renormalises() -> None:
    rng = np.random.default_rng(1)
    E = _unit(rng.normal(size=(2 * MIN_LANGUAGE_TEXTS, DIM)) + _axis(0, 2.0))
    langs = ["de"] * MIN_LANGUAGE_TEXTS + ["it"] * MIN_LANGUAGE_TEXTS
    c = LanguageCentering.fit(E, langs)
    Q = _unit(rng.normal(size=(4, DIM)))
    got = c.transform(Q, ["de", "it", "und", None])
    assert got.shape == (4, DIM) and got.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-6)
    want = Q - np.stack([c.mean_for("de"), c.mean_for("it"), c.global_mean, c.global_mean])
    np.testing.assert_allclose(got, _unit(want), atol=1e-6)
    # no languages at all: the global mean for every row
    np.testing.assert_allclose(c.transform(Q), _unit(Q - c.global_mean), atol=1e-6)
    # a row's result depends on that row alone (the stream's batches differ)
    np.testing.assert_array_equal(c.transform(Q[1:2], ["it"])[0], got[1])
    with pytest.raises(DataError, match="3 languages for 4"):
        c.transform(Q, ["de"] * 3)
    with pytest.raises(DataError, match="shape"):
        c.transform(Q[:, :8])


def _world(seed: int = 0) -> dict[str, np.ndarray]:
    """A KB around axis 0 in language A. Language B's texts carry a shift along axis 3
    (its language component): its ID queries are on the KB's subject, its OOD ones on
    axis 5, both shifted."""
    rng = np.random.default_rng(seed)
    shift = _axis(3, 1.6)

    def cloud(centre: np.ndarray, n: int) -> np.ndarray:
        return _unit(centre + rng.normal(scale=0.6, size=(n, DIM)))

    return {
        "kb": cloud(_axis(0, 3.0), 80),
        "id_a": cloud(_axis(0, 3.0), 200),
        "id_b": cloud(_axis(0, 3.0) + shift, 200),
        "ood_a": cloud(_axis(5, 3.0), 100),
        "ood_b": cloud(_axis(5, 3.0) + shift, 100),
    }


def _centred_model(world: dict[str, np.ndarray], deny: DenyTopics | None = None):
    kb, ids, oods = world["kb"], np.vstack([world["id_a"], world["id_b"]]), None
    oods = np.vstack([world["ood_a"], world["ood_b"]])
    langs = ["a"] * (len(kb) + 200) + ["b"] * 200 + ["a"] * 100 + ["b"] * 100
    c = LanguageCentering.fit(np.vstack([kb, ids, oods]), langs)
    n_kb = len(kb)
    model = fit_ood_model(
        kb="kb",
        encoder={"name": "fake-encoder", "dim": DIM},
        kb_embeddings=c.transform(kb, ["a"] * n_kb),
        id_embeddings=c.transform(ids, langs[n_kb : n_kb + 400]),
        ood_embeddings=c.transform(oods, langs[n_kb + 400 :]),
        detector="combined",
        m=4,
        k=8,
        seed=0,
        target_frr=0.05,
        deny_topics=deny,
    )
    return replace(model, centering=c)


def test_a_centred_model_scores_each_query_with_its_languages_mean() -> None:
    world = _world()
    model = _centred_model(world)
    c = model.centering
    assert c is not None and c.languages == ("a", "b")
    Q = np.vstack([world["id_b"][:10], world["ood_b"][:10]])
    langs = ["b"] * 20
    plain = replace(model, centering=None)
    # what the model does: centre with each query's mean, then everything else
    np.testing.assert_array_equal(model.score(Q, langs), plain.score(c.transform(Q, langs)))
    # without languages: the global mean, which is another score for language b's queries
    np.testing.assert_array_equal(model.score(Q), plain.score(c.transform(Q)))
    assert not np.allclose(model.score(Q, langs), model.score(Q))
    np.testing.assert_array_equal(model.predict(Q, langs), model.score(Q, langs) > model.threshold)
    # the centred model tells language b's ID and OOD queries apart
    fresh = _world(seed=5)
    s_id = model.score(fresh["id_b"], ["b"] * 200)
    s_ood = model.score(fresh["ood_b"], ["b"] * 100)
    assert np.median(s_id) < model.threshold < np.median(s_ood)


def test_a_centred_model_survives_the_artifact_round_trip_bit_exact() -> None:
    world = _world()
    anchor = DenyTopics(("harm",), _unit(_axis(9)[None, :]))
    for model in (_centred_model(world), _centred_model(world, anchor)):
        section, arrays = model_state(model)
        assert section["format"] == "kb-subspace-ood/3"
        assert section["centering"]["languages"] == ["a", "b"]
        assert arrays["centering.means"].shape == (2, DIM)
        assert arrays["centering.global_mean"].shape == (DIM,)
        manifest, npz = encode(model_to_artifact(model))
        loaded = model_from_artifact(decode(manifest, npz, expected_encoder=model.encoder))
        Q = np.vstack([world["id_b"][:20], world["ood_a"][:20]])
        langs = ["b"] * 20 + ["a"] * 20
        assert np.array_equal(loaded.score(Q, langs), model.score(Q, langs))
        assert loaded.centering is not None and loaded.centering.counts == model.centering.counts
        assert (loaded.deny is None) == (model.deny is None)


def test_a_reader_of_the_earlier_formats_refuses_a_centred_model() -> None:
    section, arrays = model_state(_centred_model(_world()))
    # an earlier worker accepts formats 1 and 2 only; the centred model is neither
    assert section["format"] not in (MODEL_FORMAT, MODEL_FORMAT_DENY)
    # a reader refuses every format it does not know, as the earlier one refuses 3
    with pytest.raises(InvalidModelState, match="model section"):
        model_from_state(
            {**section, "format": "kb-subspace-ood/4"},
            arrays,
            kb="kb",
            encoder={"name": "fake-encoder", "dim": DIM},
        )
    # a format-3 section without its means is refused
    bare = {k: v for k, v in arrays.items() if not k.startswith("centering.")}
    with pytest.raises(InvalidModelState):
        model_from_state(section, bare, kb="kb", encoder={"name": "fake-encoder", "dim": DIM})
    broken = {**section, "centering": {**section["centering"], "languages": "a"}}
    with pytest.raises(InvalidModelState, match=r"centering\.languages"):
        model_from_state(broken, arrays, kb="kb", encoder={"name": "fake-encoder", "dim": DIM})


def test_an_uncentred_model_keeps_its_format_and_ignores_languages() -> None:
    world = _world()
    plain = replace(_centred_model(world), centering=None)
    section, arrays = model_state(plain)
    assert section["format"] == MODEL_FORMAT and "centering" not in section
    assert not any(k.startswith("centering.") for k in arrays)
    Q = world["id_b"][:5]
    np.testing.assert_array_equal(plain.score(Q, ["b"] * 5), plain.score(Q))


def test_means_of_another_width_are_refused() -> None:
    model = _centred_model(_world())
    with pytest.raises(DataError, match="centring means"):
        replace(model, centering=LanguageCentering(np.ones(DIM + 1)))
    with pytest.raises(DataError, match="language means"):
        LanguageCentering(np.ones(DIM), ("a",), np.ones((2, DIM)))


def test_recalibration_scores_a_centred_models_queries_by_their_languages() -> None:
    world = _world(seed=3)
    model = _centred_model(_world())
    E = np.vstack([world["id_a"][:60], world["id_b"][:60]])
    langs = ["a"] * 60 + ["b"] * 60
    new = recalibrate(model, E, 0.1, langs)
    assert new.threshold == conformal_threshold(model.score(E, langs), 0.1)
    assert new.threshold != recalibrate(model, E, 0.1).threshold
    assert new.centering is model.centering  # the means are the model's, kept as they are
    per = recalibrate_by_language(model, E, langs, 0.1)
    assert per.language_thresholds["b"] == conformal_threshold(model.score(E[60:], ["b"] * 60), 0.1)
