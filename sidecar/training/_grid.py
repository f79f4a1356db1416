"""The search grids: which m and hyperparameters :func:`~._search.search` tries per detector."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from sidecar.scoring import detector_class, detector_kinds

# At most this many input columns for the searched detectors (the budget).
MAX_DIMS = 32
# Residual norms at several k: the combined detector sees all of them.
COMBINED_RESIDUAL_KS = (16, 32, 64)
# The combined detector's labelled-neighbour block: k-th nearest ID / OOD training query.
COMBINED_NEIGHBOUR_KS = (1, 3, 10)
# The blocks of the combined detector's floor (evidence learned from no OOD query: the
# residual norms, the cosine to the nearest and k-th nearest KB documents, the distances
# to the labelled ID queries), those of its features. Every combined candidate is floored
# unless the floor is switched off (combined_grid(floor=False), `--no-floor`): with OOD
# families held out of training it lifted mean AUROC from 0.975 to 0.993 (covid), 0.981
# to 0.986 (CLINC150) and 0.944 to 0.957 (StackExchange), and under the standard protocol
# it cost at most 0.005 balanced accuracy at the calibrated threshold
# (benchmarks/results/unseen_ood_ablation_*.json, variant floor_kb_id_oof99).
COMBINED_FLOOR = ("residual", "max_cosine", "knn", "neighbours")


def with_floor(params: Mapping[str, Any]) -> dict[str, Any]:
    """Combined-detector ``params`` with the floor of :data:`COMBINED_FLOOR` its features
    allow."""
    feats = params.get("features", ())
    return {**params, "floor": [b for b in COMBINED_FLOOR if b in feats]}


@dataclass(frozen=True)
class Candidate:
    """One point of a search grid."""

    detector: str
    m: int = 13
    params: Mapping[str, Any] = field(default_factory=dict)
    residual_ks: tuple[int, ...] | None = None

    def fitted_to_kb(self, n_docs: int, dim: int) -> Candidate:
        """This candidate as a KB of ``n_docs`` documents in ``dim`` dimensions allows it:
        at most ``n_docs - 1`` PCs, residual ks of at most that (and 64, and ``dim``; equal
        ones merged), kNN ks of at most ``n_docs``."""
        ks = self.residual_ks
        if ks is not None:
            k_max = min(64, n_docs - 1, dim)
            ks = tuple(sorted({min(k, k_max) for k in ks}))
        params = dict(self.params)
        if "knn_ks" in params:
            params["knn_ks"] = [min(int(k), n_docs) for k in params["knn_ks"]]
        return replace(self, m=min(self.m, n_docs - 1), params=params, residual_ks=ks)

    def describe(self) -> dict[str, Any]:
        return {
            "m": self.m,
            "params": dict(self.params),
            "residual_ks": list(self.residual_ks) if self.residual_ks else None,
        }


def default_grid(detector: str) -> list[Candidate]:
    """The search grid of ``detector``: m and its own radius quantile / C / mixture
    components / residual k / feature blocks.

    Kept small on purpose: every candidate refits the KB PCA.
    """
    c = Candidate
    if detector in detector_kinds() and detector_class(detector).geometric:
        return [c(detector, m, {"quantile": q}) for m in (8, 13) for q in (0.95, 0.99)]
    if detector == "logreg":
        return [c(detector, m, {"C": C}) for m in (13, MAX_DIMS) for C in (0.1, 1.0)]
    if detector == "svm":
        return [
            c(detector, m, {"C": C, "max_samples": 2000}) for m in (13, 8) for C in (1.0, 0.1, 10.0)
        ]
    if detector == "gmm":
        return [c(detector, m, {"n_components": n}) for m in (8, 13) for n in (4, 2, 8)]
    if detector == "residual":
        return [c(detector, 13, {}, (k,)) for k in (32, 64)]
    if detector == "combined":
        n_res = len(COMBINED_RESIDUAL_KS)
        with_cos = {"features": ["pcs", "residual", "max_cosine"]}
        out = [
            c(detector, m, {"C": C, **with_cos}, COMBINED_RESIDUAL_KS)
            for m in (20, MAX_DIMS - n_res - 1)
            for C in (0.1, 1.0)
        ]
        out += [
            c(
                detector,
                MAX_DIMS - n_res,
                {"C": C, "features": ["pcs", "residual"]},
                COMBINED_RESIDUAL_KS,
            )
            for C in (0.1, 1.0)
        ]
        # + labelled neighbours: nearest ID / OOD training queries (2 * 2 columns). Small m
        # too: with a few hundred labelled queries (covid) 8-13 PCs generalise better, and
        # the search's one-standard-error rule takes them where they do as well.
        with_nb: dict[str, Any] = {
            "features": [*with_cos["features"], "neighbours"],
            "neighbour_ks": list(COMBINED_NEIGHBOUR_KS),
        }
        n_nb = 2 * len(COMBINED_NEIGHBOUR_KS)
        out += [
            c(detector, m, {"C": C, **with_nb}, COMBINED_RESIDUAL_KS)
            for m in (8, 13, 20, MAX_DIMS - n_res - 1 - n_nb)
            for C in (0.1, 1.0)
        ]
        return [replace(cand, params=with_floor(cand.params)) for cand in out]
    if detector == "knn":
        return [c(detector, 13, {"n_neighbors": 10})]
    return [c(detector)]  # max_cosine, mahalanobis: nothing to tune


def combined_grid(
    features: Sequence[str] | None = None,
    neighbour_bank: int | None = None,
    *,
    floor: bool = True,
) -> list[Candidate]:
    """The combined detector's grid, kept to the candidates of ``features`` (a grid of
    C = 0.1 / 1 / 10 at m = 13 when the default grid has none), each neighbours block
    holding at most ``neighbour_bank`` labelled queries per class; every candidate is
    floored with its OOD-free blocks (:data:`COMBINED_FLOOR`), none with ``floor=False``."""
    base = default_grid("combined")
    if features is not None:
        base = [c for c in base if tuple(c.params.get("features", ())) == tuple(features)]
        if not base:
            base = [
                Candidate("combined", 13, {"C": C, "features": list(features)}, (16, 32, 64))
                for C in (0.1, 1.0, 10.0)
            ]
    base = [
        replace(c, params=with_floor(c.params))
        if floor
        else replace(c, params={k: v for k, v in c.params.items() if k != "floor"})
        for c in base
    ]
    if neighbour_bank is not None:
        base = [
            replace(c, params={**c.params, "bank_max": neighbour_bank})
            if "neighbours" in c.params.get("features", ())
            else c
            for c in base
        ]
    return base
