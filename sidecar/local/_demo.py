"""The built-in demo: a small clinic KB, its model, and labelled sample queries.

Used by ``sidecar demo``, ``sidecar bench e2e`` and the integration tests. The texts ship
in ``sidecar/data/demo_*.jsonl``; the model is fitted in a second or two on their real
embeddings, so nothing is downloaded and no evaluation data is needed.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from importlib import resources
from typing import Any

import numpy as np

from sidecar.errors import DataError
from sidecar.persistence import model_to_artifact

log = logging.getLogger(__name__)

_FILES = {"kb": "demo_kb.jsonl", "id": "demo_id_queries.jsonl", "ood": "demo_ood_queries.jsonl"}


@dataclass(frozen=True)
class DemoData:
    """Texts of the demo KB and of its labelled queries."""

    kb: list[str]
    id_queries: list[str]
    ood_queries: list[str]

    def labelled(self) -> list[tuple[str, str]]:
        """``(text, expected verdict)`` pairs, ID and OOD interleaved."""
        ids = [(t, "ID") for t in self.id_queries]
        oods = [(t, "OOD") for t in self.ood_queries]
        out: list[tuple[str, str]] = []
        for i in range(max(len(ids), len(oods))):
            out.extend(x[i] for x in (ids, oods) if i < len(x))
        return out


def _texts(name: str) -> list[str]:
    try:
        raw = resources.files("sidecar").joinpath("data", name).read_text(encoding="utf-8")
    except (FileNotFoundError, OSError) as exc:
        raise DataError(f"demo data file {name} is missing from the package: {exc}") from exc
    texts = []
    for n, line in enumerate(raw.splitlines(), 1):
        if not line.strip():
            continue
        try:
            texts.append(str(json.loads(line)["text"]))
        except (ValueError, KeyError, TypeError) as exc:
            raise DataError(f"{name}:{n}: not a JSON object with a 'text': {exc}") from exc
    return texts


def demo_data() -> DemoData:
    """Read the packaged demo texts."""
    return DemoData(_texts(_FILES["kb"]), _texts(_FILES["id"]), _texts(_FILES["ood"]))


def demo_multilingual_queries() -> list[dict[str, str]]:
    """The demo's multilingual turn: five clinic questions and two off-topic ones, each in
    English, German, Spanish, French, Italian and Dutch; rows ``{"text", "lang",
    "expected"}`` (``expected`` is ID or OOD)."""
    name = "demo_multilingual_queries.jsonl"
    try:
        raw = resources.files("sidecar").joinpath("data", name).read_text(encoding="utf-8")
        rows = [json.loads(line) for line in raw.splitlines() if line.strip()]
        return [{k: str(r[k]) for k in ("text", "lang", "expected")} for r in rows]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise DataError(f"demo data file {name} is missing or malformed: {exc}") from exc


def training_half(texts: list[str]) -> list[str]:
    """The queries the demo model is fitted on (every other one); the rest stay unseen."""
    return texts[::2]


def train_demo_model(
    encoder: Any,
    *,
    kb: str = "default",
    data: DemoData | None = None,
    detector: str = "knn",
    seed: int = 0,
) -> Any:
    """Fit an ``OODModel`` for ``kb`` on the demo texts embedded by ``encoder``.

    Half of the labelled queries (:func:`training_half`) train and calibrate the model;
    the demo streams all of them, so the table shows seen and unseen queries alike.
    ``knn`` is the default detector: on a KB this small it separates the held-out
    queries best (measured: no held-out ID query rejected, every held-out OOD caught).
    """
    from sidecar.scoring import fit_ood_model

    d = data or demo_data()
    E_kb = encoder.encode(d.kb)
    E_id = encoder.encode(training_half(d.id_queries))
    E_ood = encoder.encode(training_half(d.ood_queries))
    model = fit_ood_model(
        kb=kb,
        encoder={"name": encoder.name, "dim": encoder.dim},
        kb_embeddings=E_kb,
        id_embeddings=np.asarray(E_id),
        ood_embeddings=np.asarray(E_ood),
        detector=detector,
        # About 10 calibration queries: 10% is the lowest rate a conformal quantile over
        # so few supports (the production default, 1%, needs 99).
        target_frr=0.1,
        seed=seed,
    )
    log.info("demo model for %s: %s, threshold %.4f", kb, model.detector_name, model.threshold)
    return model


def publish(store: Any, model: Any) -> str:
    """Put ``model``'s artifact in ``store`` and promote it; returns the version."""
    artifact = model_to_artifact(model)
    version = store.put(artifact)
    store.promote(model.kb, version)
    return str(version)
