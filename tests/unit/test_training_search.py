"""Hyperparameter search: only training data goes in, and the winner is calibrated."""

from __future__ import annotations

import inspect

import numpy as np
import pytest

from sidecar.errors import ConfigError, DataError
from sidecar.evaluation import KBTask, evaluate_benchmark, evaluate_task
from sidecar.training import carve_splits, search
from sidecar.training._grid import Candidate
from sidecar.training._metrics import auroc

DIM = 24


def _emb_factory(ood_shift: float = 0.0):
    """Texts to deterministic unit vectors: 'kb*'/'id*' near one centre, others elsewhere;
    ``ood_shift`` moves the OOD evaluation queries ('oode*') only."""
    centre = np.random.default_rng(42).normal(size=DIM)
    cache: dict[str, np.ndarray] = {}

    def embed(texts):
        rows = []
        for t in texts:
            if t not in cache:
                r = np.random.default_rng(sum(ord(c) * 31**i for i, c in enumerate(t)) % 2**32)
                ind = t.startswith(("kb", "id"))
                shift = ood_shift if t.startswith("oode") else 0.0
                base = centre if ind else -0.3 * centre + shift
                v = base + r.normal(size=DIM) * (0.8 if ind else 1.2)
                cache[t] = (v / np.linalg.norm(v)).astype(np.float32)
            rows.append(cache[t])
        return np.asarray(rows)

    return embed


def _task(eval_tag: str = "") -> KBTask:
    def mk(p: str, n: int) -> tuple[str, ...]:
        return tuple(f"{p}{i}" for i in range(n))

    return KBTask(
        "t",
        mk("kb", 120),
        mk("idt", 100),
        mk("oodt", 150),
        mk("ide" + eval_tag, 40),
        mk("oode" + eval_tag, 60),
    )


def test_search_api_takes_no_evaluation_data() -> None:
    for fn in (search, carve_splits):
        names = set(inspect.signature(fn).parameters)
        assert not any("eval" in n or "test" in n for n in names), names


def test_splits_come_only_from_training_rows() -> None:
    rng = np.random.default_rng(0)
    kb, idt, oodt = rng.normal(size=(50, 4)), rng.normal(size=(40, 4)), rng.normal(size=(60, 4))
    s = carve_splits(kb, idt, oodt, seed=1)
    id_rows = {r.tobytes() for r in idt.astype(np.float32)}
    for part in (s.id_fit, s.id_val, s.id_cal):
        assert {r.tobytes() for r in part} <= id_rows
    assert len(s.id_fit) + len(s.id_val) + len(s.id_cal) == 40
    assert {r.tobytes() for r in s.id_cal}.isdisjoint({r.tobytes() for r in s.id_fit})
    assert len(s.id_cal) >= 13  # at least n // 3 when 1/alpha - 1 is out of reach


def test_choices_do_not_depend_on_evaluation_queries() -> None:
    dets = ("logreg", "epsilon_ball")
    grids = {
        "logreg": [Candidate("logreg", m, {"C": 1.0}) for m in (2, 8)],
        "epsilon_ball": [Candidate("epsilon_ball", 4, {"quantile": q}) for q in (0.9, 0.99)],
    }
    a = evaluate_task(
        _task(),
        _emb_factory(),
        encoder={"name": "fake", "dim": DIM},
        detectors=dets,
        protocol=False,
        grids=grids,
    )
    b = evaluate_task(
        _task("x"),
        _emb_factory(ood_shift=0.5),
        encoder={"name": "fake", "dim": DIM},
        detectors=dets,
        protocol=False,
        grids=grids,
    )
    for d in dets:
        for key in ("m", "params", "val_auroc", "criterion"):
            assert a["detectors"][d][key] == b["detectors"][d][key], (d, key)
    assert a["detectors"]["logreg"]["auroc"] > 0.9


def test_a_group_cache_groups_each_task_once_across_seeds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from sidecar.evaluation import _evaluate

    calls = []
    real = _evaluate.query_groups

    def counted(task, *args):
        calls.append(task.name)
        return real(task, *args)

    monkeypatch.setattr(_evaluate, "query_groups", counted)
    grids = {"logreg": [Candidate("logreg", 4, {"C": 1.0})]}

    def run(seed: int, cache: dict | None) -> dict:
        return evaluate_task(
            _task(),
            _emb_factory(),
            encoder={"name": "fake", "dim": DIM},
            detectors=("logreg",),
            protocol=False,
            grids=grids,
            seed=seed,
            group_cache=cache,
        )

    def figures(res: dict) -> dict:  # all but the timings
        row = res["detectors"]["logreg"]
        return {k: v for k, v in row.items() if k not in ("us_per_query", "search_s")}

    cache: dict = {}
    cached = [figures(run(seed, cache)) for seed in (0, 1, 2)]
    assert calls == ["t"]
    assert [figures(run(seed, None)) for seed in (0, 1, 2)] == cached
    assert len(calls) == 4 and cached[0] != cached[1]  # seeds differ, groups do not


def test_search_picks_best_validation_candidate_and_calibrates() -> None:
    embed = _emb_factory()
    t = _task()
    s = carve_splits(embed(t.kb_texts), embed(t.id_train), embed(t.ood_train), seed=0)
    grid = [Candidate("logreg", 1, {"C": 1.0}), Candidate("logreg", 8, {"C": 1.0})]
    enc = {"name": "fake", "dim": DIM}
    res = search(
        s, "logreg", kb_name="t", encoder=enc, grid=grid, calibration="split", selection="best"
    )
    aucs = [row["val_auroc"] for row in res.table]
    assert res.val_auroc == max(aucs)
    assert res.best == grid[int(np.argmax(aucs))]
    cal = res.model.score(s.id_cal)
    assert np.mean(cal > res.model.threshold) <= 0.1
    # The shipped model is refitted on fit + validation; the validation figures belong to
    # the winner fitted on the fit part only.
    assert res.model.metrics["n_id_fit"] == len(s.id_fit) + len(s.id_val)
    assert res.val_model.metrics["n_id_fit"] == len(s.id_fit)
    assert res.val_scores is not None
    np.testing.assert_array_equal(res.val_scores[0], res.val_model.score(s.id_val))
    assert res.val_auroc == auroc(*res.val_scores)


def test_supervised_detector_without_ood_is_refused() -> None:
    embed = _emb_factory()
    t = _task()
    s = carve_splits(embed(t.kb_texts), embed(t.id_train), None, seed=0)
    with pytest.raises(ConfigError, match="OOD"):
        search(s, "logreg", kb_name="t", encoder={"name": "fake", "dim": DIM})
    res = search(s, "residual", kb_name="t", encoder={"name": "fake", "dim": DIM})
    assert res.val_auroc is None and np.isfinite(res.model.threshold)


def test_train_grid_follows_m_options() -> None:
    from sidecar.training._job import build_grid, parse_m_range
    from sidecar.training._train_config import TrainConfig

    assert parse_m_range("8:32") == (8, 32)
    with pytest.raises(ConfigError):
        parse_m_range("32:8")
    fixed = build_grid(TrainConfig(detector="logreg", m=7))
    assert {c.m for c in fixed} == {7} and {c.params["C"] for c in fixed} == {0.1, 1.0}
    spread = build_grid(
        TrainConfig(detector="combined", m_range=(8, 24), features=("pcs", "residual"))
    )
    assert {c.m for c in spread} == {8, 12, 16, 20, 24}
    assert all(c.params["features"] == ["pcs", "residual"] for c in spread)


def test_auto_criterion_keeps_the_better_validation_auroc_of_both() -> None:
    embed = _emb_factory()
    t = _task()
    splits = carve_splits(embed(t.kb_texts), embed(t.id_train), embed(t.ood_train), seed=0)
    grid = [Candidate("logreg", 4, {"C": 1.0}), Candidate("logreg", 8, {"C": 1.0})]
    enc = {"name": "fake", "dim": DIM}
    each = {
        c: search(splits, "logreg", kb_name="t", encoder=enc, criterion=c, grid=grid)
        for c in ("pvalue", "evr")
    }
    auto = search(splits, "logreg", kb_name="t", encoder=enc, criterion="auto", grid=grid)
    best = max(("pvalue", "evr"), key=lambda c: each[c].val_auroc or -1.0)
    assert auto.model.criterion == best
    assert auto.val_auroc == each[best].val_auroc
    assert [r["criterion"] for r in auto.table] == ["pvalue"] * 2 + ["evr"] * 2
    # Without OOD training queries there is nothing to rank: EVR, as for every search.
    ka = carve_splits(embed(t.kb_texts), embed(t.id_train), None, seed=0)
    res = search(ka, "residual", kb_name="t", encoder=enc, criterion="auto")
    assert res.model.criterion == "evr"


def test_auto_criterion_goes_on_with_evr_when_the_t_test_has_too_few_queries() -> None:
    embed = _emb_factory()
    t = _task()
    # five ID queries: two validate, two calibrate, one is left to fit the t-test on
    splits = carve_splits(embed(t.kb_texts), embed(t.id_train[:5]), embed(t.ood_train), seed=0)
    grid = [Candidate("logreg", 4, {"C": 1.0})]
    enc = {"name": "fake", "dim": DIM}
    with pytest.raises(DataError, match="at least 2 ID training queries"):
        search(splits, "logreg", kb_name="t", encoder=enc, criterion="pvalue", grid=grid)
    auto = search(splits, "logreg", kb_name="t", encoder=enc, criterion="auto", grid=grid)
    assert auto.model.criterion == "evr"
    (refused,) = [r for r in auto.table if r["criterion"] == "pvalue"]
    assert "at least 2 ID training queries" in refused["skipped"]
    assert [r.get("picked") for r in auto.table if r["criterion"] == "evr"] == [True]


def test_protocol_fits_every_paper_detector_under_both_criteria() -> None:
    from sidecar.evaluation._targets import PAPER_DETECTORS, PROTOCOL_M, protocol_table

    res = evaluate_task(
        _task(), _emb_factory(), encoder={"name": "fake", "dim": DIM}, detectors=(), protocol=True
    )
    proto = res["protocol"]
    assert set(proto) == {*PAPER_DETECTORS, "combined"}
    for d, byc in proto.items():
        assert set(byc) == {"evr", "pvalue"}, d
        assert all(row["m"] == PROTOCOL_M for row in byc.values()), d
        assert all(0.0 <= row["paper_accuracy"] <= 1.0 for row in byc.values()), d
    assert proto["logreg"]["pvalue"]["auroc"] > 0.9
    table = protocol_table({"t": proto})
    assert table["paper_detectors_mean"]["detectors"] == list(PAPER_DETECTORS)


def test_one_se_rule_keeps_the_smaller_candidate_within_one_standard_error() -> None:
    from sidecar.training._metrics import auroc_standard_error
    from sidecar.training._shortlist import Ranked, shortlist

    def pick_candidate(rows, selection):
        return shortlist(rows, selection)[0]

    se = auroc_standard_error(0.95, 100, 100)  # about 0.015
    rows = [Ranked(0.95, 30, 100, 100), Ranked(0.95 - se / 2, 10, 100, 100)]
    assert pick_candidate(rows, "best") == 0
    assert pick_candidate(rows, "one_se") == 1
    # further than one standard error below the best: the larger model is worth it
    rows[1] = Ranked(0.95 - 2 * se, 10, 100, 100)
    assert pick_candidate(rows, "one_se") == 0
    # more validation queries, smaller standard error: the same gap now counts
    big = [Ranked(0.95, 30, 10_000, 10_000), Ranked(0.95 - se / 2, 10, 10_000, 10_000)]
    assert pick_candidate(big, "one_se") == 0
    with pytest.raises(ConfigError, match="selection"):
        pick_candidate(rows, "smallest")


def _overlapping_embed(shrink: float):
    """Like _emb_factory, but OOD sits at (1 - shrink) x the ID centre: validation AUROC < 1."""
    centre = np.random.default_rng(42).normal(size=DIM)

    def embed(texts):
        rows = []
        for t in texts:
            r = np.random.default_rng(sum(ord(c) * 31**i for i, c in enumerate(t)) % 2**32)
            base = centre if t.startswith(("kb", "id")) else (1 - shrink) * centre
            v = base + r.normal(size=DIM)
            rows.append((v / np.linalg.norm(v)).astype(np.float32))
        return np.asarray(rows)

    return embed


def test_search_marks_the_kept_candidate_and_follows_the_selection_rule() -> None:
    embed = _overlapping_embed(0.5)
    t = _task()
    s = carve_splits(embed(t.kb_texts), embed(t.id_train), embed(t.ood_train), seed=0)
    grid = [Candidate("logreg", m, {"C": 1.0}) for m in (1, 2, 4, 8)]
    kept = {}
    for rule in ("best", "one_se"):
        res = search(
            s,
            "logreg",
            kb_name="t",
            encoder={"name": "fake", "dim": DIM},
            grid=grid,
            selection=rule,
            calibration="split",  # cross lets the out-of-fold figures choose (tested below)
        )
        picked = [row for row in res.table if row.get("picked")]
        assert len(picked) == 1 and picked[0]["m"] == res.best.m
        assert res.val_auroc == pytest.approx(picked[0]["val_auroc"], abs=1e-6)
        kept[rule] = res.best
    from sidecar.training._metrics import auroc_standard_error

    aucs = {row["m"]: row["val_auroc"] for row in res.table}
    best_m = max(aucs, key=lambda m: (aucs[m], -m))
    floor = aucs[best_m] - auroc_standard_error(aucs[best_m], len(s.id_val), len(s.ood_val))
    assert kept["best"].m == best_m
    assert kept["one_se"].m == min(m for m in aucs if aucs[m] >= floor - 1e-6)
    assert kept["one_se"].m < kept["best"].m  # this data: a smaller m within one SE


def test_cross_calibration_fits_every_id_query_and_calibrates_out_of_fold() -> None:
    from sidecar.scoring import conformal_threshold

    embed = _overlapping_embed(0.5)
    t = _task()
    s = carve_splits(embed(t.kb_texts), embed(t.id_train), embed(t.ood_train), seed=0)
    grid = [Candidate("logreg", 4, {"C": 1.0})]
    enc = {"name": "fake", "dim": DIM}
    split = search(s, "logreg", kb_name="t", encoder=enc, grid=grid, calibration="split")
    cross = search(s, "logreg", kb_name="t", encoder=enc, grid=grid)  # the default
    n_id = len(s.id_fit) + len(s.id_val) + len(s.id_cal)
    assert split.model.metrics["n_id_fit"] == len(s.id_fit) + len(s.id_val)
    assert cross.model.metrics["n_id_fit"] == n_id  # the calibration queries are fitted too
    assert cross.model.metrics["calibration"] == "cross"
    assert cross.model.metrics["n_calibration"] == n_id
    assert cross.model.params["calibration"] == "cross"
    # The threshold is not the fitted model's own quantile on its training queries (those
    # score lower than unseen ones): it comes from the out-of-fold scores, and it is higher.
    E = np.vstack([s.id_fit, s.id_val, s.id_cal])
    in_sample = conformal_threshold(cross.model.score(E), 0.01)
    assert cross.model.threshold > in_sample
    assert cross.model.metrics["calibration_frr"] <= 0.01 + 1 / n_id
    # the validation figures still come from the fit-part model, as with split calibration
    np.testing.assert_array_equal(split.val_scores[0], cross.val_scores[0])


def test_cross_calibration_needs_the_frr_rule_and_a_known_name() -> None:
    embed = _emb_factory()
    t = _task()
    s = carve_splits(
        embed(t.kb_texts), embed(t.id_train), embed(t.ood_train), seed=0, ood_cal_fraction=0.2
    )
    enc = {"name": "fake", "dim": DIM}
    with pytest.raises(ConfigError, match="frr"):
        search(
            s, "logreg", kb_name="t", encoder=enc, threshold_rule="balanced", calibration="cross"
        )
    with pytest.raises(ConfigError, match="calibration"):
        search(s, "logreg", kb_name="t", encoder=enc, calibration="jackknife")


def test_carve_splits_keeps_each_rows_group_label_with_it() -> None:
    rng = np.random.default_rng(0)
    n = 60
    ids = np.c_[np.arange(n, dtype=np.float32), rng.normal(size=(n, 3))]  # column 0: row
    groups = np.arange(n) // 3
    s = carve_splits(rng.normal(size=(20, 4)), ids, None, seed=1, id_groups=groups)
    assert s.id_groups is not None
    rows = np.concatenate([s.id_fit[:, 0], s.id_val[:, 0], s.id_cal[:, 0]]).astype(int)
    np.testing.assert_array_equal(s.id_groups, groups[rows])
    # and no group is split between the parts
    part = np.repeat([0, 1, 2], [len(s.id_fit), len(s.id_val), len(s.id_cal)])
    assert all(len(set(part[s.id_groups == g])) == 1 for g in np.unique(groups))


def test_a_search_fits_the_kb_pca_once_and_reuses_it_bit_for_bit(monkeypatch) -> None:
    from sidecar.scoring import KBSubspace

    embed = _overlapping_embed(0.5)
    t = _task()
    enc = {"name": "fake", "dim": DIM}
    grid = [Candidate("logreg", m, {"C": 1.0}) for m in (1, 2, 4)]

    def splits():
        return carve_splits(embed(t.kb_texts), embed(t.id_train), embed(t.ood_train), seed=0)

    shared = search(splits(), "logreg", kb_name="t", encoder=enc, grid=grid)
    fits = []
    real_fit = KBSubspace.fit
    monkeypatch.setattr(
        KBSubspace, "fit", lambda self, X, y=None: fits.append(1) or real_fit(self, X)
    )
    again = search(splits(), "logreg", kb_name="t", encoder=enc, grid=grid)
    # 3 candidates + 5 cross-calibration folds + the final fit, one KB: one PCA
    assert len(fits) == 1
    assert again.model.threshold == shared.model.threshold
    # a reused subspace gives the numbers of a refitted one
    from sidecar.scoring import fit_ood_model

    s = splits()
    kw = dict(
        kb="t",
        encoder=enc,
        kb_embeddings=s.kb,
        id_embeddings=s.id_fit,
        ood_embeddings=s.ood_fit,
        calibration_embeddings=s.id_cal,
        detector="logreg",
        m=4,
    )
    cache: dict = {}
    models = [fit_ood_model(**kw, subspaces=cache) for _ in range(2)] + [fit_ood_model(**kw)]
    assert len(fits) == 1 + 2  # the search's, the cache's first, the uncached one
    E = embed(t.id_train)
    for other in models[1:]:
        np.testing.assert_array_equal(other.score(E), models[0].score(E))
        assert other.threshold == models[0].threshold


def test_cross_calibration_uses_fewer_folds_when_there_are_fewer_groups() -> None:
    embed = _overlapping_embed(0.5)
    t = _task()
    groups = np.arange(len(t.id_train)) % 4  # four groups of ID training queries
    s = carve_splits(
        embed(t.kb_texts), embed(t.id_train), embed(t.ood_train), seed=0, id_groups=groups
    )
    enc = {"name": "fake", "dim": DIM}
    grid = [Candidate("logreg", 4, {"C": 1.0})]
    res = search(s, "logreg", kb_name="t", encoder=enc, grid=grid)
    assert res.model.metrics["calibration_folds"] == 4
    assert np.isfinite(res.model.threshold)
    split = search(s, "logreg", kb_name="t", encoder=enc, grid=grid, calibration="split")
    assert split.model.params["calibration"] == split.model.metrics["calibration"] == "split"


def test_auto_criterion_marks_one_kept_row() -> None:
    embed = _overlapping_embed(0.5)
    t = _task()
    s = carve_splits(embed(t.kb_texts), embed(t.id_train), embed(t.ood_train), seed=0)
    grid = [Candidate("logreg", m, {"C": 1.0}) for m in (2, 4)]
    res = search(
        s, "logreg", kb_name="t", encoder={"name": "fake", "dim": DIM}, grid=grid, criterion="auto"
    )
    (kept,) = [row for row in res.table if row["picked"]]
    assert kept["criterion"] == res.model.criterion and kept["m"] == res.best.m
    assert {row["criterion"] for row in res.table} == {"pvalue", "evr"}


def test_balanced_rule_without_ood_calibration_reports_one_calibration() -> None:
    embed = _emb_factory()
    t = KBTask("t", _task().kb_texts, _task().id_train, (), _task().id_eval, _task().ood_eval)

    def run(**extra):
        return evaluate_benchmark(
            "b",
            "dev",
            [t],
            embed,
            encoder={"name": "fake", "dim": DIM},
            detectors=("residual",),
            threshold_rule="balanced",
            progress=False,
            **extra,
        )

    rep = run()
    assert rep["calibration"] == "split"
    assert rep["kbs"]["t"]["residual"]["calibration"] == "split"
    with pytest.raises(ConfigError, match="frr"):
        run(calibration="cross")


def test_shortlist_orders_the_candidates_validation_cannot_tell_apart() -> None:
    from sidecar.training._metrics import auroc_standard_error
    from sidecar.training._shortlist import Ranked, shortlist

    se = auroc_standard_error(0.95, 100, 100)
    rows = [
        Ranked(0.95, 30, 100, 100),
        Ranked(0.95 - se / 2, 10, 100, 100),
        Ranked(0.95 - 2 * se, 5, 100, 100),  # too far below: out
        Ranked(0.95 - se / 4, 10, 100, 100),  # same dims as row 1, higher AUROC: first
    ]
    assert shortlist(rows, "one_se") == [3, 1, 0]
    assert shortlist(rows, "best") == [0]


def test_cross_calibrated_search_keeps_the_best_finalist_out_of_fold() -> None:
    from sidecar.training._cross import out_of_fold

    embed = _overlapping_embed(0.5)
    t = _task()
    s = carve_splits(embed(t.kb_texts), embed(t.id_train), embed(t.ood_train), seed=0)
    enc = {"name": "fake", "dim": DIM}
    grid = [Candidate("logreg", m, {"C": C}) for m in (1, 2, 4, 8) for C in (0.01, 1.0)]
    res = search(s, "logreg", kb_name="t", encoder=enc, grid=grid)
    finalists = [row for row in res.table if "finalist" in row]
    assert len(finalists) >= 2  # this data: several candidates within one SE
    (kept,) = [row for row in res.table if row.get("picked")]
    assert "finalist" in kept
    top = max(row["oof_balanced_accuracy"] for row in finalists)
    assert kept["oof_balanced_accuracy"] == top
    # ties go to the finalist validation prefers (the lower finalist number)
    assert kept["finalist"] == min(
        row["finalist"] for row in finalists if row["oof_balanced_accuracy"] == top
    )
    # the shipped model's threshold and figures are the kept finalist's out-of-fold ones
    how = dict(kb_name="t", encoder=enc, criterion="pvalue", seed=0, target_frr=0.01)
    oof = out_of_fold(s, res.best, pca_method="auto", **how)
    figures = oof.at_threshold(0.01)
    assert figures is not None
    assert res.model.metrics["oof_ood_accept_rate"] == pytest.approx(figures["oof_ood_accept_rate"])
    assert kept["oof_ood_accept_rate"] == pytest.approx(figures["oof_ood_accept_rate"], abs=1e-6)
    from sidecar.scoring import conformal_threshold

    assert res.model.threshold == conformal_threshold(oof.id_scores, 0.01)
    # split calibration has no finalists: validation AUROC alone decides
    split = search(s, "logreg", kb_name="t", encoder=enc, grid=grid, calibration="split")
    assert not any("finalist" in row for row in split.table)


def test_out_of_fold_keeps_ood_groups_whole_and_skips_too_few(monkeypatch) -> None:
    import sidecar.training._cross as cross_module

    rng = np.random.default_rng(0)
    kb = rng.normal(size=(40, 6)).astype(np.float32)
    ids = rng.normal(size=(60, 6)).astype(np.float32)
    ood = np.c_[np.arange(80.0), rng.normal(size=(80, 5))].astype(np.float32)  # col 0: row
    groups = np.arange(80) // 4
    s = carve_splits(kb, ids, ood, seed=0, ood_groups=groups)
    assert s.ood_groups is not None
    rows = np.concatenate([s.ood_fit[:, 0], s.ood_val[:, 0]]).astype(int)
    np.testing.assert_array_equal(s.ood_groups, groups[rows])
    seen: list[set[int]] = []
    real = cross_module.fit_candidate

    def spy(part, cand, **kw):
        if part.ood_fit is not None:
            seen.append(set(groups[part.ood_fit[:, 0].astype(int)].tolist()))
        return real(part, cand, **kw)

    monkeypatch.setattr(cross_module, "fit_candidate", spy)
    how = dict(kb_name="t", encoder={"name": "fake", "dim": 6}, criterion="pvalue", seed=0)
    oof = cross_module.out_of_fold(s, Candidate("logreg", 2), target_frr=0.01, **how)
    assert oof.ood_scores is not None and np.isfinite(oof.ood_scores).all()
    assert len(seen) == oof.folds == 5
    all_groups = set(s.ood_groups.tolist())
    held = [all_groups - fit_groups for fit_groups in seen]
    # every OOD group is held out by exactly one fold, whole
    assert sorted(g for h in held for g in h) == sorted(all_groups)
    # OOD queries in fewer groups than folds are not folded: no out-of-fold OOD scores
    few = carve_splits(kb, ids, ood, seed=0, ood_groups=np.arange(80) // 20)
    oof_few = cross_module.out_of_fold(few, Candidate("logreg", 2), target_frr=0.01, **how)
    assert oof_few.ood_scores is None and oof_few.at_threshold(0.01) is None


def test_out_of_fold_ties_go_to_the_finalist_validation_prefers(monkeypatch) -> None:
    import sidecar.training._cross as cross_module
    from sidecar.training._cross import OutOfFold, decide_out_of_fold

    # two candidates with the same out-of-fold figures: same ID and OOD scores for both
    ids, oods = np.linspace(0.0, 1.0, 200), np.linspace(0.9, 2.0, 100)
    monkeypatch.setattr(
        cross_module, "out_of_fold", lambda splits, cand, **kw: OutOfFold(ids, oods, 5)
    )
    rows: list[dict] = [{}, {}, {}]
    finalists = [(7, rows[0], Candidate("logreg", 2)), (3, rows[1], Candidate("logreg", 4))]
    rng = np.random.default_rng(0)
    s = carve_splits(rng.normal(size=(20, 4)), rng.normal(size=(40, 4)), rng.normal(size=(40, 4)))
    pos, oof = decide_out_of_fold(s, finalists, {"target_frr": 0.05})
    assert pos == 7 and oof is not None  # the first of the tied finalists
    assert rows[0]["oof_balanced_accuracy"] == rows[1]["oof_balanced_accuracy"]
    # 5% target over 200 ID scores: 9 refused (the conformal rank), FRR > 0 counted
    assert rows[0]["oof_false_reject_rate"] == pytest.approx(9 / 200)
    assert rows[0]["oof_ood_accept_rate"] == pytest.approx(np.mean(oods <= ids[-10]))
    better = OutOfFold(ids, oods + 1.0, 5)  # the second finalist lets no OOD through
    calls = iter([OutOfFold(ids, oods, 5), better])
    monkeypatch.setattr(cross_module, "out_of_fold", lambda splits, cand, **kw: next(calls))
    pos, oof = decide_out_of_fold(s, finalists, {"target_frr": 0.05})
    assert pos == 3 and oof is better
    # the first finalist cannot be folded and the OOD queries are not folded at all (no
    # out-of-fold OOD scores): the second is kept with its scores, not the first rescored
    unfolded = OutOfFold(ids, None, 5)

    def first_fails(splits, cand, **kw):
        if cand.m == 2:
            raise DataError("too few OOD queries left in a fold")
        return unfolded

    monkeypatch.setattr(cross_module, "out_of_fold", first_fails)
    pos, oof = decide_out_of_fold(s, finalists, {"target_frr": 0.05})
    assert pos == 3 and oof is unfolded
    assert "finalist" not in rows[0] and "oof_skipped" not in rows[0]


def test_finalists_that_cannot_fold_their_ood_queries_do_not_crash_the_search() -> None:
    # 12 OOD training queries: 10 to fit, 2 to validate. The neighbour block needs its
    # 10th-nearest OOD query, which a fold holding some of them out no longer has.
    embed = _overlapping_embed(0.5)
    t = _task()
    s = carve_splits(embed(t.kb_texts), embed(t.id_train), embed(t.ood_train[:12]), seed=0)
    assert len(s.ood_fit) == 10
    res = search(s, "combined", kb_name="t", encoder={"name": "fake", "dim": DIM})
    assert np.isfinite(res.model.threshold)
    assert res.model.metrics["calibration"] == "cross"
    kept = [row for row in res.table if row.get("picked")]
    assert len(kept) == 1


def test_carve_splits_ood_groups_follow_truncated_and_calibration_parts() -> None:
    rng = np.random.default_rng(3)
    kb, ids = rng.normal(size=(20, 4)), rng.normal(size=(40, 4))
    ood = np.c_[np.arange(300.0), rng.normal(size=(300, 3))]  # column 0: row
    groups = np.arange(300) // 3
    s = carve_splits(kb, ids, ood, seed=2, ood_groups=groups, max_ood_fit=50, ood_cal_fraction=0.2)
    assert s.ood_groups is not None and s.ood_cal is not None and len(s.ood_fit) <= 50
    rows = np.concatenate([s.ood_fit[:, 0], s.ood_val[:, 0]]).astype(int)
    np.testing.assert_array_equal(s.ood_groups, groups[rows])


def test_auto_criterion_compares_the_winners_as_they_were_chosen() -> None:
    embed = _overlapping_embed(0.2)
    t = _task()
    s = carve_splits(embed(t.kb_texts), embed(t.id_train), embed(t.ood_train), seed=1)
    enc = {"name": "fake", "dim": DIM}
    grid = [Candidate("logreg", m, {"C": 1.0}) for m in (1, 2, 4, 8)]
    runs = {
        c: search(s, "logreg", kb_name="t", encoder=enc, grid=grid, criterion=c)
        for c in ("pvalue", "evr")
    }
    auto = search(s, "logreg", kb_name="t", encoder=enc, grid=grid, criterion="auto")
    oof = {c: r.model.metrics["oof_balanced_accuracy"] for c, r in runs.items()}
    want = "pvalue" if oof["pvalue"] >= oof["evr"] else "evr"
    assert auto.model.criterion == want
    assert auto.model.metrics["oof_balanced_accuracy"] == oof[want]


class _CountingProgress:
    def __init__(self) -> None:
        self.planned_fits = self.fitted_fits = 0

    def planned(self, n: int) -> None:
        self.planned_fits += n

    def fitted(self) -> None:
        self.fitted_fits += 1
        assert self.fitted_fits <= self.planned_fits  # told before it happens


@pytest.mark.parametrize(
    ("calibration", "criterion"), [("cross", "pvalue"), ("split", "pvalue"), ("cross", "auto")]
)
def test_search_progress_counts_every_model_fit(monkeypatch, calibration, criterion) -> None:
    import sidecar.training._fitting as fitting_module

    calls = []
    real_fit = fitting_module.fit_ood_model

    def counted(**kw):
        calls.append(kw["detector"])
        return real_fit(**kw)

    monkeypatch.setattr(fitting_module, "fit_ood_model", counted)
    embed = _overlapping_embed(0.5)
    t = _task()
    s = carve_splits(embed(t.kb_texts), embed(t.id_train), embed(t.ood_train), seed=0)
    grid = [Candidate("logreg", m, {"C": C}) for m in (1, 2, 4, 8) for C in (0.01, 1.0)]
    progress = _CountingProgress()
    res = search(
        s,
        "logreg",
        kb_name="t",
        encoder={"name": "fake", "dim": DIM},
        grid=grid,
        calibration=calibration,
        criterion=criterion,
        progress=progress,
    )
    assert progress.fitted_fits == progress.planned_fits == len(calls)
    runs = 2 if criterion == "auto" else 1
    finalists = sum("finalist" in row for row in res.table)
    folds = res.model.metrics.get("calibration_folds", 0)
    # every candidate, each finalist on every fold, and each run's shipped model
    assert len(calls) == runs * len(grid) + finalists * folds + runs


def test_a_grid_nothing_fits_is_refused_with_its_reasons_counted() -> None:
    embed = _overlapping_embed(0.5)
    t = _task()
    s = carve_splits(embed(t.kb_texts), embed(t.id_train), embed(t.ood_train), seed=0)
    grid = [Candidate("logreg", 40, {"C": C}) for C in (0.1, 1.0)]  # more PCs than dims
    grid.append(Candidate("logreg", 50, {"C": 1.0}))
    with pytest.raises(ConfigError) as err:
        search(s, "logreg", kb_name="t", encoder={"name": "fake", "dim": DIM}, grid=grid)
    msg = str(err.value)
    assert msg.startswith("no candidate of 'logreg' could be fitted: m=40 exceeds the k=24")
    assert "(2 of 3); m=50" in msg and msg.endswith("(1 of 3)") and "{" not in msg


def test_run_search_with_a_config_is_search() -> None:
    from sidecar.training import SearchConfig, run_search

    embed = _emb_factory()
    t = _task()
    s = carve_splits(embed(t.kb_texts), embed(t.id_train), embed(t.ood_train), seed=0)
    grid = [Candidate("logreg", 1, {"C": 1.0}), Candidate("logreg", 8, {"C": 1.0})]
    enc = {"name": "fake", "dim": DIM}
    config = SearchConfig(grid=tuple(grid), calibration="split")
    res = run_search(s, "logreg", config, kb_name="t", encoder=enc)
    same = search(s, "logreg", kb_name="t", encoder=enc, grid=grid, calibration="split")
    assert res.best == same.best and res.table == same.table
    assert res.model.threshold == same.model.threshold
