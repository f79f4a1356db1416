"""The deployable OOD model: KB subspace arrays + a fitted detector + a calibrated threshold.

An :class:`OODModel` turns embeddings into the input blocks its detector needs
(selected-PC coordinates, residual norms, max-cosine, or the embedding itself), scores
them (higher = more out-of-domain) and compares with the calibrated threshold. It gives
its state as plain arrays and a JSON-able section, and is built back from them
(:mod:`sidecar.persistence` stores that as an artifact, never pickle). Everything the
hot path needs is precomputed once, in ``__post_init__``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from sidecar.errors import DataError, EncoderMismatch
from sidecar.scoring._base import INPUT_BLOCKS, OODDetector
from sidecar.scoring._baselines import top_cosines, top_k_cosines
from sidecar.scoring._centering import LanguageCentering
from sidecar.scoring._deny import DenyScreen
from sidecar.scoring._probes import probe_mismatch

MODEL_FORMAT = "kb-subspace-ood/1"
# A model with a denied-topic screen: its score is not the detector's alone, so a reader
# that does not know the screen must refuse it rather than misread its threshold.
MODEL_FORMAT_DENY = "kb-subspace-ood/2"
# A model that centres every embedding by its language first (it may screen denied topics
# too): a reader without centring would score raw embeddings against centred state.
MODEL_FORMAT_CENTERED = "kb-subspace-ood/3"
SCORE_CONVENTION = "higher = more out-of-domain; OOD when score > threshold"
_DET_PREFIX = "detector."
# Labelled neighbours at or above this cosine are the query itself (or a duplicate).
_DUPLICATE_COS = 0.9999


def _unit(X: np.ndarray) -> np.ndarray:
    X = np.asarray(X, dtype=np.float32)
    norms = np.linalg.norm(X, axis=1, keepdims=True)
    norms[norms == 0] = 1.0
    return np.ascontiguousarray(X / norms)


@dataclass(frozen=True, eq=False)
class OODModel:
    """A fitted, calibrated OOD detector for one KB.

    Attributes
    ----------
    kb : str
        KB name.
    encoder : dict
        ``{"name": str, "dim": int}`` of the encoder that produced the embeddings.
    detector_name : str
        The detector kind (``"combined"``, ``"epsilon_ball"``, ...).
    detector : OODDetector
        Fitted; scores the model's input blocks.
    mean : ndarray of shape (dim,)
        KB embedding mean.
    components : ndarray of shape (K, dim)
        The top-K KB principal components (K covers the selected PCs and every residual k).
    selected_pcs : ndarray of int, shape (m,)
        Indices into ``components`` of the PCs the ``"pcs"`` block uses.
    k : int
        Number of top PCs spanning the KB subspace (residual and p-value pool).
    criterion : str
        ``"evr"`` or ``"pvalue"``.
    threshold : float
        OOD when ``score > threshold`` (calibrated on held-out ID queries).
    metrics : dict
    params : dict
        How the model was fitted (m, k, seed, target FRR, detector parameters, ...).
    residual_ks : tuple of int
        The k of each residual column (default ``(k,)``).
    kb_embeddings : ndarray of shape (n_kb, dim) or None
        Only kept when the detector uses the ``"max_cosine"`` block.
    explained_variance_ratio : ndarray of shape (K,) or None
    encoder_probes : ndarray of shape (n_probes, dim) or None
        Embeddings of ``encoder_probe_texts`` by the encoder that embedded the training
        data (see :mod:`sidecar.scoring._probes`); None when training had no encoder.
    encoder_probe_texts : tuple of str
    deny : DenyScreen or None
        Denied topics: the score is then the larger of the detector's and the query's
        closeness to its nearest denied topic, each on its ID scale
        (:mod:`sidecar.scoring._deny`).
    language_thresholds : dict of str to float
        Thresholds of their own for queries detected in these languages (ISO 639-1
        codes), each calibrated on ID queries of that language; every other query
        (another language, or none detected) meets ``threshold``.
    centering : LanguageCentering or None
        Language means every embedding loses before anything else (:meth:`center`); the
        KB embeddings, neighbour banks and denied-topic anchors are stored centred.
    version : str or None
        The artifact version the model was loaded from (not part of its content).
    """

    kb: str
    encoder: dict[str, Any]
    detector_name: str
    detector: OODDetector
    mean: np.ndarray
    components: np.ndarray
    selected_pcs: np.ndarray
    k: int
    criterion: str
    threshold: float
    metrics: dict[str, Any] = field(default_factory=dict)
    params: dict[str, Any] = field(default_factory=dict)
    residual_ks: tuple[int, ...] = ()
    kb_embeddings: np.ndarray | None = None
    explained_variance_ratio: np.ndarray | None = None
    encoder_probes: np.ndarray | None = None
    encoder_probe_texts: tuple[str, ...] = ()
    language_thresholds: dict[str, float] = field(default_factory=dict)
    deny: DenyScreen | None = None
    centering: LanguageCentering | None = None
    version: str | None = None
    # Hot-path caches, derived in __post_init__.
    _inputs: tuple[str, ...] = field(init=False, repr=False)
    _mean64: np.ndarray = field(init=False, repr=False)
    _ct: np.ndarray = field(init=False, repr=False)
    _n_proj: int = field(init=False, repr=False)
    _kb_unit: np.ndarray | None = field(init=False, repr=False)
    _knn_ks: tuple[int, ...] = field(init=False, repr=False)
    _banks: tuple[np.ndarray, np.ndarray] | None = field(init=False, repr=False)
    _nb_ks: tuple[int, ...] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        setattr_ = object.__setattr__
        dim = int(self.encoder["dim"])
        comps = np.asarray(self.components)
        if comps.ndim != 2 or comps.shape[1] != dim or np.asarray(self.mean).shape != (dim,):
            raise DataError(f"subspace arrays do not match the encoder dimension {dim}")
        sel = np.asarray(self.selected_pcs, dtype=np.int64)
        ks = tuple(int(k) for k in (self.residual_ks or (self.k,)))
        if sel.ndim != 1 or (sel.size and not 0 <= sel.min() <= sel.max() < comps.shape[0]):
            raise DataError("selected PCs are out of range of the stored components")
        if any(not 1 <= k <= comps.shape[0] for k in ks):
            raise DataError(f"residual k {ks} out of range 1..{comps.shape[0]}")
        inputs = self.detector.inputs
        if any(b not in INPUT_BLOCKS for b in inputs):
            raise DataError(f"detector asks for unknown input blocks {inputs}")
        if ("max_cosine" in inputs or "knn" in inputs) and self.kb_embeddings is None:
            raise DataError(
                "the detector uses max-cosine or knn but the model has no KB embeddings"
            )
        if self.kb_embeddings is not None:
            shape = np.asarray(self.kb_embeddings).shape
            if len(shape) != 2 or shape[0] < 1 or shape[1] != dim:
                raise DataError(f"KB embeddings have shape {shape}, not (documents, {dim})")
        if (self.encoder_probes is None) != (not self.encoder_probe_texts):
            raise DataError("encoder probe embeddings and probe texts come together")
        if self.encoder_probes is not None:
            shape = np.shape(self.encoder_probes)
            if shape != (len(self.encoder_probe_texts), dim):
                raise DataError(
                    f"encoder probes have shape {shape}, not ({len(self.encoder_probe_texts)}, "
                    f"{dim}) for {len(self.encoder_probe_texts)} probe texts"
                )
        if self.deny is not None and self.deny.dim != dim:
            raise DataError(
                f"denied-topic anchors have {self.deny.dim} dimensions, the encoder {dim}"
            )
        if self.centering is not None and self.centering.dim != dim:
            raise DataError(f"centring means have {self.centering.dim} dimensions, not {dim}")
        knn_ks = tuple(int(k) for k in getattr(self.detector, "knn_ks", ()) or ())
        if "knn" in inputs:
            n_kb = np.asarray(self.kb_embeddings).shape[0]
            if not knn_ks or any(not 1 <= k <= n_kb for k in knn_ks):
                raise DataError(f"knn ks {knn_ks} out of range 1..{n_kb}")
        setattr_(self, "_knn_ks", knn_ks)
        banks, nb_ks = None, tuple(int(k) for k in getattr(self.detector, "neighbour_ks", ()) or ())
        if "neighbours" in inputs:
            id_bank = getattr(self.detector, "id_bank_", None)
            ood_bank = getattr(self.detector, "ood_bank_", None)
            if id_bank is None or ood_bank is None:
                raise DataError("the detector uses labelled neighbours but has no banks")
            for which, bank in (("ID", id_bank), ("OOD", ood_bank)):
                if np.ndim(bank) != 2 or np.shape(bank)[1] != dim:
                    raise DataError(
                        f"{which} neighbour bank has shape {np.shape(bank)}, not (queries, {dim})"
                    )
            n_min = min(len(id_bank), len(ood_bank))
            if not nb_ks or any(not 1 <= k <= n_min for k in nb_ks):
                raise DataError(f"neighbour ks {nb_ks} out of range 1..{n_min}")
            banks = (_unit(id_bank), _unit(ood_bank))
        setattr_(self, "_banks", banks)
        setattr_(self, "_nb_ks", nb_ks)
        setattr_(self, "selected_pcs", sel)
        setattr_(self, "residual_ks", ks)
        setattr_(self, "threshold", float(self.threshold))
        langs = {}
        for lang, thr in dict(self.language_thresholds or {}).items():
            if not isinstance(lang, str) or not lang or not np.isfinite(float(thr)):
                raise DataError(f"language threshold {lang!r}: {thr!r} is not a finite number")
            langs[lang] = float(thr)
        setattr_(self, "language_thresholds", langs)
        # Hot-path caches: float32 contiguous operands, computed once per model.
        setattr_(self, "_inputs", inputs)
        setattr_(self, "_mean64", np.ascontiguousarray(self.mean, dtype=np.float64))
        setattr_(self, "_ct", np.ascontiguousarray(np.asarray(self.components, np.float64).T))
        # Project only on the PCs the detector's blocks read.
        need = [int(sel.max()) + 1] if sel.size and "pcs" in inputs else []
        need += list(ks) if "residual" in inputs else []
        setattr_(self, "_n_proj", max(need, default=0))
        kb_unit = None
        if self.kb_embeddings is not None:
            kb = np.asarray(self.kb_embeddings, dtype=np.float32)
            norms = np.linalg.norm(kb, axis=1, keepdims=True)
            norms[norms == 0] = 1.0
            kb_unit = np.ascontiguousarray(kb / norms)
        setattr_(self, "_kb_unit", kb_unit)

    # -- scoring -------------------------------------------------------------------------
    @property
    def m(self) -> int:
        """Number of selected PCs."""
        return int(self.selected_pcs.size)

    @property
    def dims(self) -> int:
        """Number of features the detector sees."""
        return sum(self.block_widths().values())

    def block_widths(self) -> dict[str, int]:
        """The number of columns of each of the detector's input blocks, in column order."""
        sizes = {
            "pcs": self.m,
            "residual": len(self.residual_ks),
            "max_cosine": 1,
            "knn": len(self._knn_ks),
            "neighbours": 2 * len(self._nb_ks),
            "full": int(self.encoder["dim"]),
        }
        return {b: sizes[b] for b in self._inputs}

    def check_encoder(self, name: str, dim: int, probes: np.ndarray | None = None) -> None:
        """Raise :class:`EncoderMismatch` unless ``(name, dim)`` is the model's encoder and,
        given ``probes`` (the running encoder's :func:`~sidecar.scoring.embed_probes`),
        its weights embed the probe sentences as the model recorded."""
        want = (str(self.encoder["name"]), int(self.encoder["dim"]))
        if (str(name), int(dim)) != want:
            raise EncoderMismatch(
                f"model for KB {self.kb!r} was built with {want[0]} ({want[1]} dims), "
                f"got embeddings of {name} ({dim} dims)"
            )
        why = probe_mismatch(self.encoder_probes, self.encoder_probe_texts, probes)
        if why is not None:
            raise EncoderMismatch(f"model for KB {self.kb!r} refused: {why}")

    def _check_E(self, E: Any) -> np.ndarray:
        arr = np.asarray(E, dtype=np.float32)
        if arr.ndim == 1:
            arr = arr[None, :]
        if arr.ndim != 2 or arr.shape[1] != int(self.encoder["dim"]):
            raise EncoderMismatch(
                f"embeddings of shape {arr.shape} do not match the model's encoder "
                f"{self.encoder['name']} ({self.encoder['dim']} dims)"
            )
        return arr

    def center(self, E: Any, languages: Any = None) -> np.ndarray:
        """``E`` (n, dim) as the model compares it: centred by each row's language
        (``languages``, one code or None per row; None: the global mean) for a centred
        model, else as given. float32, shape (n, dim)."""
        E = self._check_E(E)
        return E if self.centering is None else self.centering.transform(E, languages)

    def features(self, E: Any) -> np.ndarray:
        """The detector's input for embeddings ``E``, already centred for a centred
        model (:meth:`center`).

        Parameters
        ----------
        E : ndarray of shape (n, dim)

        Returns
        -------
        ndarray of shape (n, dims), float64; blocks in the detector's ``inputs`` order.
        """
        E = self._check_E(E)
        inputs: tuple[str, ...] = self._inputs
        blocks: list[np.ndarray] = []
        proj = Xc = None
        if "pcs" in inputs or "residual" in inputs:
            # float64 so that a query's score does not depend on its batch's BLAS kernel.
            # One ufunc call that widens as it subtracts: astype() and then "-" allocate
            # two fresh buffers, and at batch 256 their page faults cost more than the
            # projection (3.9 against 1.4 us per query for the residual on an EPYC).
            Xc = np.subtract(E, self._mean64, dtype=np.float64)
            proj = Xc @ self._ct[:, : self._n_proj]
        for name in inputs:
            if name == "pcs":
                assert proj is not None
                blocks.append(proj[:, self.selected_pcs])
            elif name == "residual":
                assert proj is not None and Xc is not None
                # Squared length within each k's PCs, summed segment by segment between
                # the sorted ks (a cumsum over every column cost more than the projection).
                explained, start, acc = {}, 0, 0.0
                for k in sorted(set(self.residual_ks)):
                    seg = proj[:, start:k]
                    acc = acc + np.einsum("ij,ij->i", seg, seg)
                    explained[k], start = acc, k
                total = np.einsum("ij,ij->i", Xc, Xc)
                cols = [np.sqrt(np.maximum(total - explained[k], 0.0)) for k in self.residual_ks]
                blocks.append(np.stack(cols, axis=1))
            elif name == "max_cosine":
                q = E / np.maximum(np.linalg.norm(E, axis=1, keepdims=True), 1e-12)
                kb_unit = self._kb_unit
                assert kb_unit is not None  # checked in __post_init__
                blocks.append((1.0 - top_cosines(q, kb_unit, 1))[:, None])
            elif name == "knn":
                q = E / np.maximum(np.linalg.norm(E, axis=1, keepdims=True), 1e-12)
                assert self._kb_unit is not None  # checked in __post_init__
                blocks.append(1.0 - top_k_cosines(q, self._kb_unit, self._knn_ks))
            elif name == "neighbours":
                q = E / np.maximum(np.linalg.norm(E, axis=1, keepdims=True), 1e-12)
                assert self._banks is not None  # checked in __post_init__
                blocks += [
                    1.0 - top_k_cosines(q, bank, self._nb_ks, skip_above=_DUPLICATE_COS)
                    for bank in self._banks
                ]
            else:  # "full"
                blocks.append(E)
        if len(blocks) == 1:
            return blocks[0]
        return np.hstack([b.astype(np.float64, copy=False) for b in blocks])

    def score(self, E: Any, languages: Any = None) -> np.ndarray:
        """OOD score of each embedding, higher = more out-of-domain.

        Parameters
        ----------
        E : ndarray of shape (n, dim), float32
        languages : sequence of str or None, length n, optional
            Each query's language, for a centred model (:meth:`center`); ignored otherwise.

        Returns
        -------
        ndarray of shape (n,), float64
            Bit-identical for the same input batch (and after an artifact round trip); a
            query scored in a different batch may differ by float32 rounding (~1e-6) when
            the detector uses the max-cosine block or the full embedding.
        """
        E = self.center(E, languages)
        s = np.asarray(self.detector.score_samples(self.features(E)), dtype=np.float64)
        return s if self.deny is None else self.deny.combine(s, E)

    def denied_topic(self, E: Any, languages: Any = None) -> list[str | None]:
        """Per embedding, the denied topic that decides its score (the screen's topic
        term is the larger one and above the threshold), else None; all None for a model
        without denied topics. ``languages`` as for :meth:`score`."""
        E = self.center(E, languages)
        if self.deny is None:
            return [None] * E.shape[0]
        s = np.asarray(self.detector.score_samples(self.features(E)), dtype=np.float64)
        det = (s - self.deny.detector_center) / self.deny.detector_spread
        topic = self.deny.topic_scores(E)
        idx = self.deny.nearest(E)
        return [
            self.deny.topics[int(i)] if t > d and t > self.threshold else None
            for i, t, d in zip(idx, topic, det, strict=True)
        ]

    def training_copies(self, E: Any, languages: Any = None) -> np.ndarray | None:
        """True where a row of ``E`` (n, dim) repeats a labelled training query the model
        keeps (cosine >= 0.9999 to a row of its neighbour banks); None for a model that
        keeps none. Figures measured on such rows are optimistic. ``languages`` as for
        :meth:`score`."""
        if self._banks is None:
            return None
        q = _unit(self.center(E, languages))
        near = [top_cosines(q, bank, 1) >= _DUPLICATE_COS for bank in self._banks]
        return np.logical_or(*near)

    def threshold_for(self, language: str | None) -> float:
        """The threshold a query detected in ``language`` meets (the global one for a
        language without its own, or None)."""
        if language is None:
            return self.threshold
        return self.language_thresholds.get(language, self.threshold)

    def thresholds(self, languages: Any, n: int) -> np.ndarray:
        """Per-query thresholds, ndarray of shape (n,): ``threshold`` for every query
        when ``languages`` is None, else each query's :meth:`threshold_for`."""
        if languages is None or not self.language_thresholds:
            return np.full(n, self.threshold)
        langs = list(languages)
        if len(langs) != n:
            raise DataError(f"{len(langs)} languages for {n} queries")
        return np.array([self.threshold_for(lang) for lang in langs], dtype=np.float64)

    def predict(self, E: Any, languages: Any = None) -> np.ndarray:
        """True where the query is OOD (``score > threshold``); bool ndarray of shape (n,).

        ``languages`` (one code or None per query) selects each query's threshold among
        :attr:`language_thresholds` and, for a centred model, its mean. A query without
        a score (NaN: an embedding that is not all numbers) is OOD: an answer nothing
        vouches for is refused, as the stream's fail-closed mode does.
        """
        s = self.score(E, languages)
        return (s > self.thresholds(languages, len(s))) | np.isnan(s)

    def with_metrics(self, **metrics: Any) -> OODModel:
        """A copy with ``metrics`` merged into the model's metrics."""
        return dataclasses.replace(self, metrics={**self.metrics, **metrics})
