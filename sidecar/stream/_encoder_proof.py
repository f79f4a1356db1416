"""Proving a client's encoder: the model's probe sentences out, the client's embeddings of
them checked against the model's.

A client that sends its own query embeddings must embed with the encoder the model was
built with: the same weights, not only the same name. A trained model records the
embeddings of a few fixed probe sentences by the encoder that embedded its training data
(:mod:`sidecar.scoring._probes`). The client embeds the same sentences with its own encoder
and the sidecar compares them one by one, with the tolerance the worker applies to its own
encoder before it installs a model (:data:`~sidecar.scoring.MIN_PROBE_COSINE`). Used by
``sidecar check-encoder`` and by the worker's ``/encoder/probes`` view.

The client's answer is JSON, in one of three shapes: a list with one vector per probe
sentence, in the sheet's order; an object ``{"embeddings": [...], "encoder": name?}``; or
an OpenAI-style ``/v1/embeddings`` response (``{"data": [{"index", "embedding"}, ...]}``),
as the client's embedding server answered it. Each vector is a JSON array of numbers or a
base64 string of little-endian float32, decoded as strictly as a query record's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from sidecar.errors import DataError
from sidecar.stream._embedding import EmbeddingProblem, decode_embedding, same_encoder
from sidecar.stream._records import quote

# What a sheet tells a client about the vectors it sends back.
VECTOR_FORMAT = (
    "one vector per sentence, in this order: a JSON array of numbers or a base64 string of "
    "little-endian float32"
)


@dataclass(frozen=True)
class ProbeCheck:
    """The outcome of comparing a client's probe embeddings with a model's.

    Attributes
    ----------
    ok : bool
        Every cosine is at least ``min_cosine`` (and a named encoder is the model's).
    kb, version, encoder, dim
        The model checked against, and its encoder's name and width.
    min_cosine : float
        The tolerance (the one the worker applies to its own encoder).
    worst_cosine : float or None
        The lowest cosine between a client vector and the model's; None when the widths
        differ (nothing can be compared).
    worst_sentence : int or None
        Index of the probe sentence with that cosine.
    cosines : list of float
        One per probe sentence, in order.
    detail : str
        One line saying why it passed or failed.
    """

    ok: bool
    kb: str
    version: str | None
    encoder: str
    dim: int
    min_cosine: float
    worst_cosine: float | None
    worst_sentence: int | None
    cosines: list[float]
    detail: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def probe_sheet(model: Any, version: str | None = None) -> dict[str, Any]:
    """What a client needs to prove its encoder against ``model`` (an ``OODModel``).

    Returns
    -------
    dict
        ``kb``, ``version``, ``encoder`` (the name to send in records), ``dim``,
        ``min_cosine``, ``normalised`` (client vectors are scaled to unit length),
        ``vector_format`` and ``texts`` (the probe sentences, in order).

    Raises
    ------
    DataError
        The model recorded no probe embeddings (trained from embeddings alone, or by a
        release before probes): nothing can prove an encoder against it.
    """
    from sidecar.scoring import MIN_PROBE_COSINE

    _recorded(model)
    return {
        "kb": model.kb,
        "version": version if version is not None else model.version,
        "encoder": str(model.encoder["name"]),
        "dim": int(model.encoder["dim"]),
        "min_cosine": MIN_PROBE_COSINE,
        "normalised": True,
        "vector_format": VECTOR_FORMAT,
        "texts": list(model.encoder_probe_texts),
    }


def check_probe_embeddings(model: Any, doc: Any, version: str | None = None) -> ProbeCheck:
    """Compare a client's embeddings of the probe sentences (``doc``, decoded JSON in one
    of the module's three shapes) with those ``model`` recorded.

    Raises
    ------
    DataError
        ``doc`` is not embeddings of the probe sentences: another shape, another number of
        vectors, or a vector that does not decode. (Vectors of another width, or of
        another named encoder, are a failed check, not an error.)
    """
    from sidecar.scoring import MIN_PROBE_COSINE, probe_cosines

    recorded = _recorded(model)
    vectors, named = _vectors(doc)
    texts = model.encoder_probe_texts
    if len(vectors) != len(texts):
        raise DataError(
            f"{len(vectors)} embeddings for the model's {len(texts)} probe sentences: embed "
            "each sentence of the sheet once, in its order"
        )
    rows = []
    for i, value in enumerate(vectors):
        row = decode_embedding(value)
        if isinstance(row, EmbeddingProblem):
            raise DataError(f"embedding {i}: {row.detail} ({row.reason})")
        rows.append(row)
    name, dim = str(model.encoder["name"]), int(model.encoder["dim"])
    base = {
        "kb": model.kb,
        "version": version if version is not None else model.version,
        "encoder": name,
        "dim": dim,
        "min_cosine": MIN_PROBE_COSINE,
    }
    widths = sorted({row.shape[0] for row in rows})
    if widths != [dim]:
        got = " and ".join(str(w) for w in widths)
        return ProbeCheck(
            ok=False,
            worst_cosine=None,
            worst_sentence=None,
            cosines=[],
            detail=f"the embeddings have {got} dimensions, the model's encoder {name} {dim}: "
            "another encoder",
            **base,
        )
    cos = probe_cosines(recorded, np.stack(rows))
    cos = np.where(np.isfinite(cos), cos, -1.0)
    worst_at = int(np.argmin(cos))
    worst = float(cos[worst_at])
    cosines = [round(float(c), 6) for c in cos]
    if named is not None and not same_encoder(named, name):
        detail = (
            f"the embeddings name encoder {quote(named)}, the model was built with {name!r}: "
            f"records naming it are refused (encoder_mismatch) whatever the vectors (lowest "
            f"cosine {worst:.6f})"
        )
        return ProbeCheck(
            ok=False,
            worst_cosine=worst,
            worst_sentence=worst_at,
            cosines=cosines,
            detail=detail,
            **base,
        )
    ok = worst >= MIN_PROBE_COSINE
    verdict = "at least" if ok else "under"
    detail = (
        f"lowest cosine {worst:.6f} (deviation {1.0 - worst:.2e}) on probe sentence "
        f"{worst_at + 1} of {len(cos)}, {verdict} the {MIN_PROBE_COSINE} required"
    )
    if not ok:
        detail += ": not the model's encoder (other weights, pooling, or preprocessing?)"
    return ProbeCheck(
        ok=ok,
        worst_cosine=worst,
        worst_sentence=worst_at,
        cosines=cosines,
        detail=detail,
        **base,
    )


def _recorded(model: Any) -> np.ndarray:
    probes = getattr(model, "encoder_probes", None)
    if probes is None or not getattr(model, "encoder_probe_texts", ()):
        raise DataError(
            f"the model of KB {model.kb!r} recorded no probe embeddings (trained from "
            "embeddings alone, or by an earlier release): no client encoder can be proven "
            "against it; retrain it with `sidecar train` and an encoder"
        )
    return np.asarray(probes)


def _vectors(doc: Any) -> tuple[Sequence[Any], str | None]:
    """(the vectors, the encoder name the document gives or None) of a client's answer."""
    if isinstance(doc, list):
        return doc, None
    if not isinstance(doc, dict):
        raise DataError(
            'expected a JSON list of embeddings, an object with "embeddings", or an '
            "OpenAI-style /v1/embeddings response"
        )
    named = doc.get("encoder")
    if named is not None and not isinstance(named, str):
        raise DataError('"encoder" must be a string')
    if "embeddings" in doc:
        vectors = doc["embeddings"]
        if not isinstance(vectors, list):
            raise DataError('"embeddings" must be a list with one vector per probe sentence')
        return vectors, named
    data = doc.get("data")
    if isinstance(data, list):  # an OpenAI-style /v1/embeddings response, as it came
        items = []
        for k, item in enumerate(data):
            if not isinstance(item, dict) or "embedding" not in item:
                raise DataError(f'data[{k}] of the response holds no "embedding"')
            index = item.get("index", k)
            if isinstance(index, bool) or not isinstance(index, int):
                raise DataError(f"data[{k}].index is not an integer")
            items.append((index, item["embedding"]))
        if sorted(i for i, _ in items) != list(range(len(items))):
            raise DataError("the response's indices are not 0..n-1, each once")
        return [v for _, v in sorted(items, key=lambda p: p[0])], named
    raise DataError(
        'an object without "embeddings" or "data": expected a JSON list of embeddings, '
        '{"embeddings": [...]} or an OpenAI-style /v1/embeddings response'
    )
