"""Encoder probes: a model refuses an encoder whose weights embed its probe sentences
elsewhere, keeps its probes through the artifact, and a watcher will not install it."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from model_store import (
    AsyncDirectoryStore,
    DirectoryStore,
    IncompatibleArtifact,
    build_artifact,
    decode,
    encode,
)
from sidecar.encoders import embed_probes
from sidecar.errors import DataError, EncoderMismatch
from sidecar.hotswap import ModelHolder, ModelWatcher
from sidecar.persistence import model_from_artifact, model_to_artifact
from sidecar.scoring import MIN_PROBE_COSINE, PROBE_TEXTS, OODModel, fit_ood_model
from sidecar.scoring._probes import probe_cosines, probe_mismatch

D = 16
ENC = {"name": "fake-encoder", "dim": D}


class _HashEncoder:
    """Embeds a text as a fixed pseudo-random unit vector of its characters; ``tilt``
    turns every embedding towards one axis, as other weights would."""

    name, dim = ENC["name"], D

    def __init__(self, tilt: float = 0.0) -> None:
        self.tilt = tilt

    def encode(self, texts: list[str], *, batch_size: int = 64) -> np.ndarray:
        rows = []
        for t in texts:
            rng = np.random.default_rng([ord(c) for c in t])
            v = rng.normal(size=D)
            v[0] += self.tilt * np.linalg.norm(v)
            rows.append(v / np.linalg.norm(v))
        return np.asarray(rows, dtype=np.float32)


def _model(probes: np.ndarray | None) -> OODModel:
    rng = np.random.default_rng(0)
    centre = np.r_[3.0, np.zeros(D - 1)]

    def near(n: int) -> np.ndarray:
        X = centre + rng.normal(size=(n, D)) * np.r_[np.ones(6), np.full(D - 6, 0.05)]
        return (X / np.linalg.norm(X, axis=1, keepdims=True)).astype(np.float32)

    model = fit_ood_model(
        kb="kb1",
        encoder=ENC,
        kb_embeddings=near(120),
        id_embeddings=near(100),
        detector="residual",
        criterion="evr",
        m=4,
        k=8,
    )
    if probes is None:
        return model
    return dataclasses.replace(model, encoder_probes=probes, encoder_probe_texts=PROBE_TEXTS)


def test_the_same_encoder_passes_and_other_weights_are_refused() -> None:
    recorded = embed_probes(_HashEncoder().encode)
    model = _model(recorded)
    model.check_encoder(ENC["name"], D, probes=embed_probes(_HashEncoder().encode))
    other = embed_probes(_HashEncoder(tilt=1.0).encode)
    assert probe_cosines(recorded, other).min() < MIN_PROBE_COSINE
    with pytest.raises(EncoderMismatch, match="same name, other weights"):
        model.check_encoder(ENC["name"], D, probes=other)


def test_nothing_to_compare_is_not_a_refusal() -> None:
    other = embed_probes(_HashEncoder(tilt=1.0).encode)
    _model(None).check_encoder(ENC["name"], D, probes=other)  # trained from embeddings
    _model(embed_probes(_HashEncoder().encode)).check_encoder(ENC["name"], D)  # no encoder
    # A model that recorded other sentences (another release's) is not compared.
    recorded = embed_probes(_HashEncoder().encode)
    assert probe_mismatch(recorded, ("another sentence",) * len(PROBE_TEXTS), other) is None
    assert probe_mismatch(recorded, PROBE_TEXTS, other) is not None


def test_a_small_numeric_difference_passes() -> None:
    recorded = embed_probes(_HashEncoder().encode)
    noisy = recorded + np.random.default_rng(1).normal(scale=1e-3, size=recorded.shape)
    assert probe_mismatch(recorded, PROBE_TEXTS, noisy.astype(np.float32)) is None
    assert "shape" in str(probe_mismatch(recorded, PROBE_TEXTS, recorded[:2]))
    nan = recorded.copy()
    nan[0, 0] = np.nan
    assert probe_mismatch(recorded, PROBE_TEXTS, nan) is not None


def test_probes_survive_the_artifact_bit_for_bit() -> None:
    recorded = embed_probes(_HashEncoder().encode)
    art = model_to_artifact(_model(recorded))
    assert art.manifest["model"]["encoder_probe_texts"] == list(PROBE_TEXTS)
    back = model_from_artifact(decode(*encode(art)))
    assert back.encoder_probe_texts == PROBE_TEXTS
    assert back.encoder_probes is not None
    assert back.encoder_probes.tobytes() == recorded.tobytes()
    plain = model_from_artifact(decode(*encode(model_to_artifact(_model(None)))))
    assert (
        plain.encoder_probes is None and "encoder_probe_texts" not in model_to_artifact(plain).model
    )


def test_malformed_probes_are_refused() -> None:
    recorded = embed_probes(_HashEncoder().encode)
    with pytest.raises(DataError, match="come together"):
        dataclasses.replace(_model(None), encoder_probes=recorded)
    with pytest.raises(DataError, match="shape"):
        dataclasses.replace(
            _model(None), encoder_probes=recorded[:, :4], encoder_probe_texts=PROBE_TEXTS
        )
    art = model_to_artifact(_model(recorded))
    model = json.loads(json.dumps(art.manifest["model"]))
    model["encoder_probe_texts"] = "not a list"
    bad = build_artifact(kb="kb1", encoder=ENC, model=model, arrays=dict(art.arrays))
    with pytest.raises(IncompatibleArtifact, match="encoder_probe_texts"):
        model_from_artifact(bad)


def test_a_watcher_keeps_its_model_when_the_new_one_needs_other_weights(tmp_path: Path) -> None:
    store = DirectoryStore(tmp_path)
    holder = ModelHolder(["kb1"])
    running = embed_probes(_HashEncoder().encode)
    watcher = ModelWatcher(AsyncDirectoryStore(store), holder, encoder=ENC, encoder_probes=running)
    good = store.put(model_to_artifact(_model(running)))
    store.promote("kb1", good)
    asyncio.run(watcher.sync())
    assert holder.get("kb1").version == good  # type: ignore[union-attr]
    elsewhere = embed_probes(_HashEncoder(tilt=1.0).encode)
    bad = store.put(model_to_artifact(_model(elsewhere)))
    store.promote("kb1", bad)
    asyncio.run(watcher.sync())
    assert holder.get("kb1").version == good  # type: ignore[union-attr]
    error = holder.status()["kb1"]["last_error"]
    assert error.startswith(bad) and "other weights" in error


def test_promoting_compares_the_probes_with_the_workers_encoder(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Commands that promote load the settings' encoder (here a fake of the project's
    Encoder protocol) and refuse what the workers would refuse; where it cannot run here
    they say so and leave the check to the workers."""
    import sidecar.encoders
    from sidecar.cli._servable import servable_model
    from sidecar.errors import ConfigError
    from sidecar.settings import Settings

    workers = Settings.model_validate({"scoring": {"encoder": ENC["name"]}})
    running: list[_HashEncoder] = [_HashEncoder()]

    def load(scoring: object, **_: object) -> _HashEncoder:
        return running[0]

    monkeypatch.setattr(sidecar.encoders, "load_encoder", load)
    artifact = model_to_artifact(_model(embed_probes(_HashEncoder().encode)))
    assert servable_model(artifact, refused="nothing was promoted", workers=workers).kb == "kb1"
    running[0] = _HashEncoder(tilt=1.0)
    with pytest.raises(IncompatibleArtifact, match=r"other weights.*nothing was promoted"):
        servable_model(artifact, refused="nothing was promoted", workers=workers)
    servable_model(artifact, refused="nothing was promoted")  # not promoting: not compared

    def unloadable(scoring: object, **_: object) -> _HashEncoder:
        raise ConfigError("no such encoder directory")

    monkeypatch.setattr(sidecar.encoders, "load_encoder", unloadable)
    servable_model(artifact, refused="nothing was promoted", workers=workers)
    err = capsys.readouterr().err
    assert "probes were not compared" in err and "no such encoder directory" in err


def test_check_and_calibrate_blame_the_encoder_before_the_cache(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A model and its cache folder both from weights A, the encoder now B under the same
    name: the error is the model's ("other weights?"), not advice to delete a good cache."""
    import sidecar.encoders
    from sidecar.settings import Settings
    from sidecar.training import EmbeddingCache, QueryEmbeddings

    EmbeddingCache(_HashEncoder(), tmp_path, progress=False).embed(["filled by A"])
    model = _model(embed_probes(_HashEncoder().encode))
    monkeypatch.setattr(sidecar.encoders, "load_encoder", lambda *a, **k: _HashEncoder(tilt=1.0))
    settings = Settings.model_validate({"scoring": {"encoder": ENC["name"]}})
    queries = tmp_path / "q.jsonl"
    queries.write_text('{"text": "hello"}\n')
    embed = QueryEmbeddings(model, settings, cache_dir=tmp_path, progress=False)
    with pytest.raises(EncoderMismatch, match="other weights"):
        embed(queries, None, "ID")
