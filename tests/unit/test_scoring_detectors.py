"""Detectors: the estimator contract, the paper's rules, numpy inference = scikit-learn."""

from __future__ import annotations

import os
import platform
from typing import Any

import numpy as np
import pytest
from sklearn.base import clone

from sidecar.errors import DataError, NotFittedError
from sidecar.scoring import (
    CombinedDetector,
    EpsilonBall,
    EpsilonCube,
    EpsilonRect,
    GMMDetector,
    KNNDetector,
    LogRegDetector,
    MahalanobisDetector,
    MaxCosineDetector,
    ResidualDetector,
    SVMDetector,
    make_detector,
)

M = 4


def _labelled(seed: int = 0, n_id: int = 150, n_ood: int = 150) -> tuple[np.ndarray, np.ndarray]:
    """ID around the origin, OOD shifted along the first axis; y = 1 for OOD."""
    rng = np.random.default_rng(seed)
    X_id = rng.normal(size=(n_id, M))
    X_ood = rng.normal(size=(n_ood, M)) * 1.5 + np.r_[4.0, np.zeros(M - 1)]
    return np.vstack([X_id, X_ood]), np.r_[np.zeros(n_id), np.ones(n_ood)].astype(int)


def _unit(X: np.ndarray) -> np.ndarray:
    return X / np.linalg.norm(X, axis=1, keepdims=True)


# (detector, ID-only training data, a far-away query)
def _id_only_cases() -> list[tuple[Any, np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(1)
    pcs = rng.normal(size=(200, M))
    far_pcs = np.full((1, M), 30.0)
    emb = _unit(np.r_[5.0, np.zeros(15)] + rng.normal(size=(200, 16)))
    far_emb = _unit(np.r_[-5.0, np.ones(15)][None, :])
    resid = np.abs(rng.normal(0.5, 0.05, size=(200, 1)))
    return [
        (EpsilonBall(), pcs, far_pcs),
        (EpsilonCube(), pcs, far_pcs),
        (EpsilonRect(), pcs, far_pcs),
        (SVMDetector(), pcs, far_pcs),
        (GMMDetector(n_components=2), pcs, far_pcs),
        (ResidualDetector(), resid, np.array([[1.2]])),
        (MaxCosineDetector(), emb, far_emb),
        (KNNDetector(n_neighbors=5), emb, far_emb),
        (MahalanobisDetector(), emb, far_emb),
    ]


@pytest.mark.parametrize("case", _id_only_cases(), ids=lambda c: type(c[0]).__name__)
def test_id_only_detector_flags_a_far_point(case: tuple[Any, np.ndarray, np.ndarray]) -> None:
    det, X, far = case
    det.fit(X)
    train = det.score_samples(X)
    assert det.score_samples(far)[0] > train.max()
    assert det.predict(far).tolist() == [1]
    assert det.predict(X).mean() < 0.5  # most training ID points stay ID


@pytest.mark.parametrize("cls", [LogRegDetector, CombinedDetector])
def test_supervised_detectors_need_ood(cls: type) -> None:
    X, _ = _labelled()
    with pytest.raises(DataError):
        cls().fit(X[:150])


@pytest.mark.parametrize(
    "det",
    [
        LogRegDetector(),
        SVMDetector(kernel="linear"),
        SVMDetector(),
        GMMDetector(n_components=2),
        EpsilonBall(),
        EpsilonCube(),
        EpsilonRect(),
    ],
    ids=lambda d: f"{d.kind}-{getattr(d, 'kernel', '')}",
)
def test_labelled_detectors_separate_and_flag_far_ood(det: Any) -> None:
    X, y = _labelled()
    det.fit(X, y)
    s = det.score_samples(X)
    assert s[y == 1].mean() > s[y == 0].mean()
    far = np.r_[40.0, np.zeros(M - 1)][None, :]
    assert det.predict(far).tolist() == [1]
    if getattr(det, "kernel", "") != "rbf":  # far from every support vector, RBF is its bias
        assert det.score_samples(far)[0] > np.median(s[y == 1])


@pytest.mark.parametrize(
    "det",
    [
        EpsilonBall(),
        LogRegDetector(),
        SVMDetector(),
        GMMDetector(),
        MaxCosineDetector(),
        KNNDetector(),
        MahalanobisDetector(),
        ResidualDetector(),
    ],
    ids=lambda d: d.kind,
)
def test_not_fitted(det: Any) -> None:
    with pytest.raises(NotFittedError):
        det.score_samples(np.zeros((1, M)))
    with pytest.raises(NotFittedError):
        det.to_state()


def test_sklearn_contract_clone_and_params() -> None:
    det = make_detector("epsilon_rect", quantile=0.9)
    assert det.get_params()["quantile"] == 0.9
    twin = clone(det)
    assert twin.get_params() == det.get_params()
    X, y = _labelled()
    assert det.fit(X, y) is det
    assert not hasattr(clone(det), "epsilon_")  # a clone is unfitted
    assert CombinedDetector(C=0.3).set_params(C=2.0).C == 2.0


def _brute_counts(Q: np.ndarray, P: np.ndarray, r: float, p: float) -> np.ndarray:
    diff = Q[:, None, :] - P[None, :, :]
    d = np.abs(diff).max(axis=2) if p == np.inf else np.linalg.norm(diff, axis=2)
    return (d <= r).sum(axis=1)


def _brute_dist(Q: np.ndarray, P: np.ndarray, p: float) -> np.ndarray:
    diff = Q[:, None, :] - P[None, :, :]
    d = np.abs(diff).max(axis=2) if p == np.inf else np.linalg.norm(diff, axis=2)
    return d.min(axis=1)


@pytest.mark.parametrize(
    ("det", "p"),
    [(EpsilonBall(epsilon=0.9, score_cap=None), 2.0), (EpsilonCube(epsilon=0.6), np.inf)],
)
def test_ball_and_cube_match_brute_force(det: Any, p: float) -> None:
    X, y = _labelled(n_id=60, n_ood=200)
    X_id, X_ood = X[y == 0], X[y == 1]
    det.fit(X, y)
    assert det.n_ood_seen_ == 200 and 0 < len(det.ood_points_) < 200  # far OOD points dropped
    Q = np.random.default_rng(5).normal(size=(120, M)) * 2.5 + np.r_[2.0, 0, 0, 0]
    eps = det.epsilon_
    # The paper's rule on ALL training points, by brute force ...
    bf_id, bf_ood = _brute_counts(Q, X_id, eps, p), _brute_counts(Q, X_ood, eps, p)
    rule = ((bf_id == 0) | (bf_ood >= bf_id)).astype(int)
    assert det.predict(Q).tolist() == rule.tolist()
    assert 0 < rule.sum() < len(Q)  # the example exercises both verdicts
    # ... and the counts are exact wherever an ID point is within epsilon.
    n_id, n_ood = det.neighbour_counts(Q)
    assert np.array_equal(n_id, bf_id)
    assert np.array_equal(n_ood[bf_id > 0], bf_ood[bf_id > 0])
    # Score: the documented formula; exact on all points wherever an ID point is inside.
    cap = np.inf if det.score_cap is None else det.score_cap
    d_id = np.minimum(_brute_dist(Q, X_id, p) / eps, cap)
    kept = d_id - np.minimum(_brute_dist(Q, det.ood_points_, p), eps) / eps
    # The scores come from float32 kernels (documented): ~1e-6 of the exact.
    tol = 1e-5
    np.testing.assert_allclose(det.score_samples(Q), kept, rtol=tol, atol=tol)
    full = d_id - np.minimum(_brute_dist(Q, X_ood, p), eps) / eps
    inside = bf_id > 0
    np.testing.assert_allclose(det.score_samples(Q)[inside], full[inside], atol=tol)
    # Elsewhere dropping OOD points can only lower the score, and it stays above 0 (OOD).
    ours = det.score_samples(Q)
    assert (ours <= full + tol).all() and (ours[~inside] > 0).all()


def test_score_cap_bounds_the_distance_term() -> None:
    X = np.random.default_rng(8).normal(size=(100, M))
    det = EpsilonBall(score_cap=3.0).fit(X)
    far = np.full((2, M), 50.0)
    assert det.score_samples(far).tolist() == [2.0, 2.0]  # cap - 1 (no OOD point)
    assert EpsilonBall(score_cap=None).fit(X).score_samples(far)[0] > 10


def test_rect_is_a_scaled_chebyshev_ball() -> None:
    X, y = _labelled(n_id=60, n_ood=60)
    hw = np.array([0.4, 0.9, 1.3, 0.7])
    det = EpsilonRect(half_widths=hw.tolist()).fit(X, y)
    np.testing.assert_allclose(det.half_widths_, hw)
    Q = np.random.default_rng(6).normal(size=(80, M)) * 2.0
    # Brute force: inside the box iff |q_j - x_j| <= hw_j on every axis.
    inside_id = (np.abs(Q[:, None, :] - X[y == 0][None]) <= hw).all(axis=2).sum(axis=1)
    inside_ood = (np.abs(Q[:, None, :] - X[y == 1][None]) <= hw).all(axis=2).sum(axis=1)
    n_id, n_ood = det.neighbour_counts(Q)
    assert np.array_equal(n_id, inside_id)
    assert np.array_equal(n_ood[n_id > 0], inside_ood[n_id > 0])
    # ... which is the Chebyshev ball of radius 1 after dividing each axis by hw.
    assert np.array_equal(n_id, _brute_counts(Q / hw, X[y == 0] / hw, 1.0, np.inf))


def test_default_epsilon_is_a_quantile_of_neighbour_distances() -> None:
    X = np.random.default_rng(2).normal(size=(300, M))
    det = EpsilonBall(quantile=0.9).fit(X)
    d = np.linalg.norm(X[:, None] - X[None], axis=2)
    np.fill_diagonal(d, np.inf)
    assert det.epsilon_ == pytest.approx(np.quantile(d.min(axis=1), 0.9))


def test_logreg_numpy_equals_sklearn() -> None:
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    X, y = _labelled()
    det = LogRegDetector(C=0.5).fit(X, y)
    ref = make_pipeline(
        StandardScaler(),
        LogisticRegression(C=0.5, class_weight="balanced", max_iter=2000, random_state=0),
    ).fit(X, y)
    np.testing.assert_allclose(det.score_samples(X), ref.decision_function(X), atol=1e-8)
    assert np.array_equal(det.predict(X), ref.predict(X))


@pytest.mark.parametrize("kernel", ["linear", "rbf"])
def test_svm_numpy_equals_sklearn(kernel: str) -> None:
    from sklearn.svm import SVC

    X, y = _labelled()
    det = SVMDetector(kernel=kernel, C=2.0).fit(X, y)
    ref = SVC(kernel=kernel, C=2.0, gamma="scale", class_weight="balanced", random_state=0)
    ref.fit(X, y)
    np.testing.assert_allclose(det.score_samples(X), ref.decision_function(X), atol=1e-8)
    assert np.array_equal(det.predict(X), ref.predict(X))


def test_svm_subsample_keeps_a_rare_class_and_leaves_a_common_draw_alone() -> None:
    from sidecar.scoring._svm import _subsample

    rng = np.random.default_rng(5)
    X = rng.normal(size=(10_000, M))
    y = np.zeros(10_000, dtype=np.int8)
    y[:3] = 1  # 3 OOD points: a plain draw of 100 misses them (seed 0 does)
    X[:3] += 6.0
    plain = np.random.default_rng(0).choice(10_000, 100, replace=False)
    assert not y[plain].any()
    Xs, ys = _subsample(X, y, 100, seed=0)
    assert len(ys) == 100 and ys.sum() == 1 and len(np.unique(Xs, axis=0)) == 100
    det = SVMDetector(max_samples=100).fit(X, y)  # was: SVC refused a single class
    assert not det.one_class_
    assert det.score_samples(Xs[ys == 1])[0] > np.median(det.score_samples(X[3:]))
    # with both classes in the draw, the draw is the plain one (recorded figures hold)
    y[:3000] = 1
    Xs, ys = _subsample(X, y, 100, seed=0)
    np.testing.assert_array_equal(Xs, X[np.sort(plain)])
    with pytest.raises(DataError, match="max_samples must be at least 2"):
        SVMDetector(max_samples=1).fit(X, y)


def test_one_class_svm_numpy_equals_sklearn() -> None:
    from sklearn.svm import OneClassSVM

    X = np.random.default_rng(4).normal(size=(200, M))
    det = SVMDetector(nu=0.1).fit(X)
    ref = OneClassSVM(gamma="scale", nu=0.1).fit(X)
    np.testing.assert_allclose(det.score_samples(X), -ref.decision_function(X), atol=1e-8)


def test_gmm_numpy_equals_sklearn() -> None:
    from sklearn.mixture import GaussianMixture

    X, y = _labelled()
    det = GMMDetector(n_components=2).fit(X, y)

    def ref(Xc: np.ndarray) -> GaussianMixture:
        return GaussianMixture(2, covariance_type="full", reg_covar=1e-6, random_state=0).fit(Xc)

    g_id, g_ood = ref(X[y == 0]), ref(X[y == 1])
    expected = g_ood.score_samples(X) - g_id.score_samples(X)
    np.testing.assert_allclose(det.score_samples(X), expected, atol=1e-8)
    id_only = GMMDetector(n_components=2).fit(X[y == 0])
    np.testing.assert_allclose(id_only.score_samples(X), -g_id.score_samples(X), atol=1e-8)


@pytest.mark.parametrize(
    "det",
    [
        EpsilonBall(),
        EpsilonCube(),
        EpsilonRect(),
        LogRegDetector(),
        SVMDetector(),
        SVMDetector(kernel="linear"),
        GMMDetector(n_components=2),
    ],
    ids=lambda d: f"{d.kind}-{getattr(d, 'kernel', '')}",
)
def test_state_round_trip_is_bit_exact(det: Any) -> None:
    X, y = _labelled()
    det.fit(X, y)
    params, arrays = det.to_state()
    twin = type(det).from_state(params, {k: v.copy() for k, v in arrays.items()})
    Q = np.random.default_rng(9).normal(size=(50, M)) * 3
    assert np.array_equal(twin.score_samples(Q), det.score_samples(Q))
    assert np.array_equal(twin.predict(Q), det.predict(Q))


def test_from_state_rejects_missing_arrays() -> None:
    from sidecar.errors import InvalidModelState

    X, y = _labelled()
    params, arrays = EpsilonBall().fit(X, y).to_state()
    del arrays["id_points"]
    with pytest.raises(InvalidModelState):
        EpsilonBall.from_state(params, arrays)


def test_wrong_feature_count_is_refused() -> None:
    X, y = _labelled()
    det = LogRegDetector().fit(X, y)
    with pytest.raises(DataError):
        det.score_samples(np.zeros((2, M + 1)))


def test_brute_force_nearest_matches_the_kd_tree_in_every_chunk() -> None:
    from scipy.spatial import cKDTree

    from sidecar.scoring._geometric import _BruteL2

    rng = np.random.default_rng(11)
    P, Q = rng.normal(size=(500, M)), rng.normal(size=(37, M)) * 2
    exact, _ = cKDTree(P).query(Q, k=1)
    got = _BruteL2(P, chunk_cells=500 * 4).nearest(Q)  # 4 queries per product: 10 chunks
    np.testing.assert_allclose(got, exact, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("scan_name", ["rows", "lanes", "auto"])
@pytest.mark.parametrize("leaf", [7, 8, 20, 256])  # blocks below, at and above 8 lanes
def test_linf_scan_matches_the_kd_tree_with_and_without_a_bound(leaf: int, scan_name: str) -> None:
    from scipy.spatial import cKDTree

    from sidecar.scoring._linf import BruteLinf

    rng = np.random.default_rng(12)
    P = rng.normal(size=(600, M)) * np.r_[3.0, 1.0, 0.5, 0.2]
    Q = rng.normal(size=(50, M)) * 4.0
    exact, _ = cKDTree(P).query(Q, k=1, p=np.inf)
    scan = BruteLinf(P, leaf=leaf, scan=scan_name)  # leaf 7: ~128 blocks, most pruned
    np.testing.assert_allclose(scan.nearest(Q, np.inf), exact, rtol=1e-5, atol=1e-5)
    bound = float(np.median(exact))
    got = scan.nearest(Q, bound)
    np.testing.assert_allclose(got, np.minimum(exact, bound), rtol=1e-5, atol=1e-5)
    assert (got == np.float32(bound)).sum() >= len(Q) // 2 - 1  # capped past the bound
    with pytest.raises(ValueError, match="non-empty"):
        BruteLinf(np.zeros((0, M)))
    with pytest.raises(ValueError, match="columns"):
        scan.nearest(np.zeros((1, M + 1)), 1.0)
    with pytest.raises(ValueError, match="unknown L-inf scan 'fast'"):
        BruteLinf(P, scan="fast")


def test_linf_scans_agree_bit_for_bit_and_auto_keeps_one_choice_per_m(monkeypatch) -> None:
    from sidecar.scoring import _linf

    rng = np.random.default_rng(13)
    P, Q = rng.normal(size=(1000, 13)), rng.normal(size=(40, 13)) * 2.0
    Q[0, 0], Q[1, 7] = np.nan, np.nan  # even a NaN goes the same way through both
    scan = _linf.BruteLinf(P, leaf=20)  # blocks of 20: every lanes tail runs too
    rows, lanes = scan.nearest(Q, 1.5, scan="rows"), scan.nearest(Q, 1.5, scan="lanes")
    np.testing.assert_array_equal(rows, lanes)  # max and min are exact in any order
    with pytest.raises(ValueError, match="unknown L-inf scan 'fast'"):
        scan.nearest(Q, 1.5, scan="fast")
    # auto measures both scans once per m (5 alternating rounds), then keeps its choice
    monkeypatch.setattr(_linf, "_CHOSEN", {})
    calls: list[str] = []
    real = _linf.BruteLinf.nearest

    def counted(self, Q, bound, scan=None):
        calls.append(scan or self.scan)
        return real(self, Q, bound, scan)

    monkeypatch.setattr(_linf.BruteLinf, "nearest", counted)
    chosen = _linf.choose_scan(11)
    assert calls == ["rows", "lanes"] * 5 and chosen in _linf.SCANS
    assert _linf.choose_scan(11) == chosen and len(calls) == 10  # not measured again
    np.testing.assert_array_equal(scan.nearest(Q, 1.5), rows)


def test_linf_kernel_compiles_without_a_writable_numba_cache(tmp_path: Any) -> None:
    import os
    import subprocess
    import sys

    # A locator that never applies to a file: numba then has nowhere to cache, as in a
    # read-only container without a writable HOME.
    env = {**os.environ, "NUMBA_CACHE_LOCATOR_CLASSES": "_IPythonCacheLocator"}
    code = (
        "import numpy as np\n"
        "from sidecar.scoring._linf import BruteLinf, kernel\n"
        "assert type(kernel()._cache).__name__ == 'NullCache'\n"
        "P = np.array([[0.0, 0.0], [3.0, 1.0]])\n"
        "print(BruteLinf(P).nearest(np.array([[2.0, 2.0]]), 10.0)[0])\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert float(out.stdout) == 1.0  # max(|2 - 3|, |2 - 1|)


@pytest.mark.skipif(
    platform.machine() not in ("x86_64", "AMD64"), reason="inspects x86 machine code"
)
@pytest.mark.parametrize("cpu", ["haswell", "skylake-avx512"])
def test_linf_rows_scan_compiles_to_vector_max_without_masked_stores(cpu: str) -> None:
    # Updated in place, the running maxima became masked stores (vmaskmovps under AVX2,
    # {%k} stores under AVX-512): microcoded and slow on AMD's AVX2 CPUs. The rows scan
    # must compile to packed max and plain stores for both targets.
    import subprocess
    import sys

    code = (
        "import re, numba, numpy as np\n"
        "from sidecar.scoring import _linf\n"
        "k = numba.njit(nogil=True, fastmath=True)(_linf._nearest_kernel)\n"
        "b = _linf.BruteLinf(np.random.default_rng(0).normal(size=(300, 13)), scan='rows')\n"
        "Q = np.zeros((2, 13), np.float32)\n"
        "k(Q, b._Pt, b._starts, b._lo, b._hi, 1.0, False, np.empty(2))\n"
        "asm = next(iter(k.inspect_asm().values()))\n"
        "print(len(re.findall(r'vmaxps\\s+[^\\n]*[yz]mm', asm)),"
        " len(re.findall(r'vmaskmovps\\s+%[yx]mm', asm)),"
        " len(re.findall(r'vmovups\\s+%[yz]mm[^\\n]*\\{%k', asm)))\n"
    )
    env = {**os.environ, "NUMBA_CPU_NAME": cpu, "NUMBA_CPU_FEATURES": ""}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    packed_max, avx2_masked, avx512_masked = map(int, out.stdout.split())
    assert packed_max > 0, "the rows scan no longer compiles to packed max"
    assert avx2_masked == 0 and avx512_masked == 0, "masked stores are back in the scan"


def test_numba_is_imported_only_when_a_chebyshev_scan_is_built() -> None:
    import subprocess
    import sys

    code = (
        "import sys\n"
        "import numpy as np\n"
        "from sidecar.scoring import EpsilonBall, EpsilonCube, fit_ood_model\n"
        "EpsilonBall().fit(np.random.default_rng(0).normal(size=(50, 3)))\n"
        "assert 'numba' not in sys.modules, 'imported by the ball'\n"
        "EpsilonCube().fit(np.random.default_rng(0).normal(size=(50, 3)))\n"
        "assert 'numba' in sys.modules\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr


@pytest.mark.parametrize("det", [EpsilonBall(), EpsilonCube(), EpsilonRect()])
def test_a_query_with_nan_scores_nan_not_a_distance(det: Any) -> None:
    # The L-inf scan compares with NaN as false: without the guard a NaN on one axis was
    # skipped (a distance from the other axes) and a NaN on the first gave the cap.
    X, y = _labelled()
    det.fit(X, y)
    Q = np.zeros((3, M))
    Q[0, :] = np.nan
    Q[1, 2] = np.nan
    s = det.score_samples(Q)
    assert np.isnan(s[:2]).all() and np.isfinite(s[2])


def test_gmm_scores_an_empty_batch() -> None:
    X, y = _labelled()
    det = GMMDetector(n_components=2).fit(X, y)
    assert det.score_samples(np.zeros((0, M))).shape == (0,)


def test_knn_refit_caps_k_by_the_new_kb_not_the_old_one() -> None:
    rng = np.random.default_rng(4)
    small, big = _unit(rng.normal(size=(8, 16))), _unit(rng.normal(size=(200, 16)))
    det = KNNDetector(n_neighbors=5).fit(small)
    det.set_params(n_neighbors=20).fit(big)
    fresh = KNNDetector(n_neighbors=20).fit(big)
    assert det.offset_ == fresh.offset_
    assert np.array_equal(det.score_samples(big[:5]), fresh.score_samples(big[:5]))


@pytest.mark.parametrize("labels", [[0, 256, 1], [0, 0.7, 1], [0, -1, 1]])
def test_labels_other_than_0_and_1_are_refused_not_wrapped(labels: list[float]) -> None:
    X = np.random.default_rng(0).normal(size=(3, M))
    with pytest.raises(DataError, match="labels must be 0"):
        LogRegDetector().fit(X, np.asarray(labels))


@pytest.mark.parametrize("epsilon", [0.0, -1.0, float("nan")])
def test_a_fixed_epsilon_must_be_positive(epsilon: float) -> None:
    X, y = _labelled()
    with pytest.raises(DataError, match="epsilon must be a positive number"):
        EpsilonBall(epsilon=epsilon).fit(X, y)


def test_array_hyperparameters_survive_the_state_round_trip() -> None:
    X, y = _labelled()
    det = EpsilonRect(half_widths=np.full(M, 1.5)).fit(X, y)
    params, arrays = det.to_state()  # was: TypeError, ndarray is not JSON serializable
    assert params["hyper"]["half_widths"] == [1.5] * M
    back = EpsilonRect.from_state(params, arrays)
    assert np.array_equal(back.score_samples(X[:9]), det.score_samples(X[:9]))


def test_ball_distances_hold_float32_accuracy_away_from_the_origin() -> None:
    # |q|^2 + |x|^2 - 2 q.x cancels in float32 where the points sit far from the origin:
    # 5e-5 off at an offset of 10 spreads before the points were centred
    from scipy.spatial import cKDTree

    from sidecar.scoring._geometric import _BruteL2

    rng = np.random.default_rng(0)
    P = rng.normal(scale=0.1, size=(3000, 13)) + 1.0
    Q = P[:300] + rng.normal(scale=0.02, size=(300, 13))
    exact, _ = cKDTree(P).query(Q)
    assert np.abs(_BruteL2(P).nearest(Q) - exact).max() < 5e-6


def test_neighbour_banks_are_cut_to_bank_max_by_a_seeded_subsample() -> None:
    rng = np.random.default_rng(2)
    A, B = rng.normal(size=(20, 8)), rng.normal(size=(30, 8))
    feats = ["pcs", "neighbours"]
    det = CombinedDetector(features=feats, bank_max=5)
    det.set_banks(A, B)
    assert det.id_bank_.shape == (5, 8) and det.ood_bank_.shape == (5, 8)
    rows = [int(np.flatnonzero((A.astype(np.float32) == r).all(axis=1))[0]) for r in det.id_bank_]
    assert rows == sorted(rows)  # a subset, in order
    again = CombinedDetector(features=feats, bank_max=5)
    again.set_banks(A, B)
    assert np.array_equal(again.id_bank_, det.id_bank_)  # the same seed, the same rows
    whole = CombinedDetector(features=feats)
    whole.set_banks(A, B)
    assert whole.id_bank_.shape == (20, 8) and whole.ood_bank_.shape == (30, 8)
    with pytest.raises(DataError, match="bank_max"):
        CombinedDetector(features=feats, bank_max=0).set_banks(A, B)
