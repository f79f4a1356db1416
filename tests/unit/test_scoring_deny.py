"""Denied topics: a query on the KB's subject but close to a topic the operator refuses is
OOD, the false-reject calibration still holds, and the screen survives the artifact."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from model_store import IncompatibleArtifact, build_artifact, decode, encode
from sidecar.errors import DataError, InvalidModelState
from sidecar.persistence import model_from_artifact, model_to_artifact
from sidecar.scoring import DenyScreen, DenyTopics, fit_ood_model, model_from_state, model_state
from sidecar.training import read_deny_topics

DIM = 16


def _unit(X: np.ndarray) -> np.ndarray:
    return (X / np.linalg.norm(X, axis=1, keepdims=True)).astype(np.float32)


def _axis(i: int, scale: float = 1.0) -> np.ndarray:
    v = np.zeros(DIM)
    v[i] = scale
    return v


def _world(seed: int = 0) -> dict[str, np.ndarray]:
    """A KB around axis 0. ID queries: the KB's subject plus noise. The labelled OOD
    family sits on axis 5. A harmful family shares the KB's subject (axis 0) but leans
    towards axis 9, where the denied topic lies; the detector never saw it."""
    rng = np.random.default_rng(seed)

    def cloud(centre: np.ndarray, n: int, noise: float = 0.6) -> np.ndarray:
        return _unit(centre + rng.normal(scale=noise, size=(n, DIM)))

    return {
        "kb": cloud(_axis(0, 3.0), 80),
        "id": cloud(_axis(0, 3.0), 400),
        "ood": cloud(_axis(5, 3.0), 200),
        "harmful": cloud(_axis(0, 2.0) + _axis(9, 2.5), 200, noise=0.4),
        "topic": _unit(_axis(9)[None, :]),
    }


def _fit(world: dict[str, np.ndarray], topics: DenyTopics | None, seed: int = 0):
    return fit_ood_model(
        kb="kb",
        encoder={"name": "fake-encoder", "dim": DIM},
        kb_embeddings=world["kb"],
        id_embeddings=world["id"],
        ood_embeddings=world["ood"],
        detector="combined",
        m=4,
        k=8,
        seed=seed,
        target_frr=0.05,
        deny_topics=topics,
    )


def test_a_harmful_family_on_the_kbs_subject_is_refused_only_with_the_topic_screen() -> None:
    world = _world()
    topics = DenyTopics(("harm",), world["topic"])
    plain, screened = _fit(world, None), _fit(world, topics)
    assert plain.deny is None and screened.deny is not None
    assert screened.params["deny_topics"] == 1
    # the detector alone calls the harmful family in-domain: it shares the KB's subject
    assert plain.predict(world["harmful"]).mean() < 0.5
    assert screened.predict(world["harmful"]).mean() > 0.95
    # the labelled OOD family stays refused, and new ID queries are refused no more often
    # than the calibrated budget allows (conformal, so a margin for the finite sample)
    fresh = _world(seed=7)
    assert screened.predict(fresh["ood"]).mean() > 0.95
    assert screened.predict(fresh["id"]).mean() <= 0.05 + 0.03
    assert screened.metrics["calibration_frr"] <= 0.05


def test_the_score_is_the_larger_of_the_two_pinned_terms_and_names_the_deciding_topic() -> None:
    world = _world()
    model = _fit(world, DenyTopics(("harm",), world["topic"]))
    deny = model.deny
    assert deny is not None
    E = np.vstack([world["harmful"][:5], world["id"][:5]])
    det = model.detector.score_samples(model.features(E))
    expect = np.maximum(
        (det - deny.detector_center) / deny.detector_spread,
        deny.topic_scores(E),
    )
    assert np.array_equal(model.score(E), expect)
    # the topic term: each topic's cosine on its own ID scale, the largest on one more
    scaled = ((E @ deny.anchors.T) - deny.topic_centers) / deny.topic_spreads
    term = (scaled.max(axis=1) - deny.term_center) / deny.term_spread
    assert np.allclose(deny.topic_scores(E), term, atol=1e-5)
    named = model.denied_topic(E)
    assert named[:5] == ["harm"] * 5 and named[5:] == [None] * 5


def test_a_screened_model_survives_the_artifact_round_trip_bit_exact() -> None:
    world = _world()
    model = _fit(world, DenyTopics(("harm", "other"), _unit(np.stack([_axis(9), _axis(11)]))))
    section, _ = model_state(model)
    assert section["format"] == "kb-subspace-ood/2" and section["deny"]["topics"] == [
        "harm",
        "other",
    ]
    manifest, npz = encode(model_to_artifact(model))
    loaded = model_from_artifact(decode(manifest, npz, expected_encoder=model.encoder))
    E = np.vstack([world["harmful"][:20], world["id"][:20]])
    assert np.array_equal(loaded.score(E), model.score(E))
    assert loaded.deny is not None and loaded.deny.topics == ("harm", "other")


def test_a_model_without_topics_keeps_the_first_format() -> None:
    section, arrays = model_state(_fit(_world(), None))
    assert section["format"] == "kb-subspace-ood/1" and "deny" not in section
    assert not any(k.startswith("deny.") for k in arrays)


def test_a_malformed_screen_is_refused_as_an_incompatible_artifact() -> None:
    world = _world()
    model = _fit(world, DenyTopics(("harm",), world["topic"]))
    section, arrays = model_state(model)
    broken = {**section, "deny": {**section["deny"], "term_spread": "wide"}}
    with pytest.raises(InvalidModelState, match="term_spread"):
        model_from_state(broken, arrays, kb="kb", encoder=model.encoder)
    no_anchors = {k: v for k, v in arrays.items() if k != "deny.anchors"}
    with pytest.raises(InvalidModelState):
        model_from_state(section, no_anchors, kb="kb", encoder=model.encoder)
    bad_topics = {**section, "deny": {**section["deny"], "topics": "harm"}}
    artifact = build_artifact(kb="kb", encoder=model.encoder, model=bad_topics, arrays=arrays)
    with pytest.raises(IncompatibleArtifact, match=r"deny\.topics"):
        model_from_artifact(artifact)


def test_topics_of_another_width_or_count_are_refused() -> None:
    world = _world()
    with pytest.raises(DataError, match="2 texts"):
        DenyTopics(("a", "b"), world["topic"])
    with pytest.raises(DataError, match="dimensions"):
        _fit(world, DenyTopics(("a",), np.ones((1, DIM + 1), np.float32)))
    with pytest.raises(DataError, match="NaN"):
        DenyTopics(("a",), np.full((1, DIM), np.nan, np.float32))
    with pytest.raises(DataError, match="positive"):
        DenyScreen(("a",), world["topic"], 0.0, 0.0, np.zeros(1), np.ones(1), 0.0, 1.0)
    with pytest.raises(DataError, match="topic scales"):
        DenyScreen(("a",), world["topic"], 0.0, 1.0, np.zeros(2), np.ones(2), 0.0, 1.0)


def test_topic_files_are_read_one_topic_per_line(tmp_path: Path) -> None:
    builtin = read_deny_topics("builtin")
    assert len(builtin) >= 20 and not any(t.startswith("#") or not t.strip() for t in builtin)
    f = tmp_path / "topics.txt"
    f.write_text("# clinic rules\nprescription doses for children\n\n  \ndosing\ndosing\n")
    assert read_deny_topics(f) == ("prescription doses for children", "dosing")
    empty = tmp_path / "empty.txt"
    empty.write_text("# nothing\n\n")
    with pytest.raises(DataError, match="holds no topic"):
        read_deny_topics(empty)
    with pytest.raises(DataError, match="not found"):
        read_deny_topics(tmp_path / "missing.txt")
    with pytest.raises(DataError, match="directory"):
        read_deny_topics(tmp_path)
    bad = tmp_path / "latin1.txt"
    bad.write_bytes("caf\xe9 recipes\n".encode("latin-1"))
    with pytest.raises(DataError, match="not UTF-8"):
        read_deny_topics(bad)
    long = tmp_path / "long.txt"
    long.write_text("x" * 600 + "\n")
    with pytest.raises(DataError, match="short description"):
        read_deny_topics(long)
