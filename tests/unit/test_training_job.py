"""The training job: its validation figures come from models that never saw the validation split."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from sidecar.errors import DataError
from sidecar.evaluation._evaluate import PROTOCOL_CANDIDATES
from sidecar.scoring import OODModel
from sidecar.training._fitting import fixed_fit
from sidecar.training._grid import Candidate, default_grid
from sidecar.training._job import _splits, grouped_splits, train
from sidecar.training._metrics import auroc, balanced_accuracy, paper_accuracy
from sidecar.training._report import write_report
from sidecar.training._train_config import TrainConfig, TrainInputs
from sidecar.training._train_report import report_data

DIM = 16


def _inputs() -> TrainInputs:
    """Unit vectors: KB and ID queries around one centre, OOD queries overlapping them."""
    rng = np.random.default_rng(7)
    centre = rng.normal(size=DIM)

    def cloud(base: np.ndarray, n: int) -> np.ndarray:
        v = base + rng.normal(size=(n, DIM)) * 0.6
        return (v / np.linalg.norm(v, axis=1, keepdims=True)).astype(np.float32)

    away = centre + 0.5 * rng.normal(size=DIM)
    return TrainInputs(
        "t", {"name": "fake", "dim": DIM}, cloud(centre, 60), cloud(centre, 80), cloud(away, 80)
    )


def _fit(
    inputs: TrainInputs, cfg: TrainConfig, cand: Candidate, criterion: str, *, final: bool
) -> OODModel:
    return fixed_fit(
        _splits(inputs, cfg),
        cand,
        kb_name=inputs.kb_name,
        encoder=inputs.encoder,
        criterion=criterion,
        seed=cfg.seed,
        target_frr=cfg.target_frr,
        final=final,
    )


def _scores(
    model: OODModel, inputs: TrainInputs, cfg: TrainConfig
) -> tuple[np.ndarray, np.ndarray]:
    s = _splits(inputs, cfg)
    return model.score(s.id_val), model.score(s.ood_val)


def test_validation_metrics_come_from_the_fit_only_model() -> None:
    inputs, cfg = _inputs(), TrainConfig(detector="epsilon_ball", m=4, calibration="split")
    result = train(inputs, cfg)
    best, crit = result.search.best, result.model.criterion
    fit_only = _fit(inputs, cfg, best, crit, final=False)
    refit = _fit(inputs, cfg, best, crit, final=True)
    # The premise: the ball memorises its training points, so the refit scores 1.0 in sample.
    assert auroc(*_scores(refit, inputs, cfg)) == 1.0
    s_id, s_ood = _scores(fit_only, inputs, cfg)
    val = result.validation
    assert val["val_auroc"] == pytest.approx(auroc(s_id, s_ood))
    assert val["val_auroc"] < 0.99
    assert val["val_auroc"] == pytest.approx(result.search.val_auroc)
    assert val["val_balanced_accuracy"] == pytest.approx(
        balanced_accuracy(s_id, s_ood, fit_only.threshold)
    )
    assert result.model.metrics["val_auroc"] == val["val_auroc"]
    # What ships (split calibration) is the refit on fit + validation, calibrated apart.
    assert result.model.threshold == refit.threshold
    splits = _splits(inputs, cfg)
    assert result.model.metrics["n_id_fit"] == len(splits.id_fit) + len(splits.id_val)
    # The default (cross) ships a model fitted on every ID training query; the validation
    # figures are those of the same fit-part model.
    cross_cfg = TrainConfig(detector="epsilon_ball", m=4)
    cross = train(inputs, cross_cfg)
    n_id = len(splits.id_fit) + len(splits.id_val) + len(splits.id_cal)
    assert cross.model.metrics["n_id_fit"] == n_id
    assert cross.model.metrics["calibration"] == "cross"
    # (cross may pick another finalist, by out-of-fold balanced accuracy)
    picked = _fit(inputs, cross_cfg, cross.search.best, cross.model.criterion, final=False)
    assert cross.validation["val_auroc"] == pytest.approx(auroc(*_scores(picked, inputs, cfg)))


def test_report_validation_figures_come_from_fit_only_models() -> None:
    inputs, cfg = _inputs(), TrainConfig(detector="epsilon_ball", m=4)
    result = train(inputs, cfg)
    data = report_data(inputs, cfg, result)
    crit = result.model.criterion
    logreg = replace(default_grid("logreg")[0], m=4)
    want = _scores(_fit(inputs, cfg, logreg, crit, final=False), inputs, cfg)
    for got, exp in zip(data.roc["logreg"], want, strict=True):
        np.testing.assert_allclose(got, exp)
    shipped = data.roc["epsilon_ball (shipped)"]
    assert auroc(*shipped) == pytest.approx(result.validation["val_auroc"])
    mm = _fit(inputs, cfg, replace(result.search.best, m=8), "pvalue", final=False)
    assert dict(data.m_curve["pvalue"])[8] == pytest.approx(
        paper_accuracy(*_scores(mm, inputs, cfg), mm.threshold)
    )
    assert data.histogram is not None
    assert data.histogram[3] == result.search.val_model.threshold
    assert data.summary["val_auroc"] == result.validation["val_auroc"]
    assert data.summary["threshold"] == result.model.threshold
    assert data.summary["calibration"] == "cross"


def test_report_lists_every_search_candidate_and_marks_the_kept_one(tmp_path: Path) -> None:
    inputs = _inputs()
    cfg = TrainConfig(detector="logreg", m_range=(2, 8))
    result = train(inputs, cfg)
    page = write_report(report_data(inputs, cfg, result), tmp_path).read_text()
    section = page.split("## Search (validation split)")[1].split("\n## ")[0]
    rows = [line for line in section.splitlines() if line.startswith("| ") and "---" not in line]
    assert len(rows) - 1 == len(result.search.table) >= 2  # the header, then each candidate
    (kept,) = [row for row in rows if "**picked**" in row]
    assert kept.split(" | ")[1] == str(result.search.best.m)
    # one criterion searched: every row names it (the column was blank)
    assert {r.split(" | ")[0].lstrip("| ") for r in rows[1:]} == {result.model.criterion}
    # cross-calibrated: the finalists' out-of-fold balanced accuracy is a column, and the
    # kept row has the best of them
    assert "out-of-fold bal. acc." in rows[0]
    col = rows[0].split(" | ").index("out-of-fold bal. acc.")
    shown = [float(r.split(" | ")[col]) for r in rows[1:] if r.split(" | ")[col].strip()]
    assert len(shown) >= 2 and float(kept.split(" | ")[col]) == max(shown)


def test_balanced_rule_reports_the_fit_only_model_at_its_balanced_threshold() -> None:
    inputs, cfg = _inputs(), TrainConfig(detector="logreg", m=4, threshold_rule="balanced")
    result = train(inputs, cfg)
    val_model = result.search.val_model
    assert val_model.params["threshold_rule"] == "balanced"
    s_id, s_ood = _scores(val_model, inputs, cfg)
    assert result.validation["val_paper_accuracy"] == pytest.approx(
        paper_accuracy(s_id, s_ood, val_model.threshold)
    )
    assert result.model.params["threshold_rule"] == "balanced"
    # the report's accuracy against m uses the same rule: at the shipped m and criterion
    # it is the summary's figure (it was the frr threshold's)
    data = report_data(inputs, cfg, result)
    at_m = dict(data.m_curve[result.model.criterion])[4]
    assert at_m == pytest.approx(result.validation["val_paper_accuracy"])


def _paraphrased_inputs(rng: np.random.Generator) -> tuple[TrainInputs, np.ndarray]:
    """ID training queries in groups of 5 near copies (cosine > 0.99) of 80 intents, and
    1,000 queries of new intents: live traffic shares no near copy with the training set."""

    def unit(v: np.ndarray) -> np.ndarray:
        return (v / np.linalg.norm(v, axis=1, keepdims=True)).astype(np.float32)

    centre = rng.normal(size=DIM)
    away = centre + rng.normal(size=DIM)
    copies = np.repeat(centre + rng.normal(size=(80, DIM)), 5, axis=0)
    inputs = TrainInputs(
        "t",
        {"name": "fake", "dim": DIM},
        unit(centre + rng.normal(size=(200, DIM))),
        unit(copies + 0.05 * rng.normal(size=copies.shape)),
        unit(away + rng.normal(size=(300, DIM))),
    )
    return inputs, unit(centre + rng.normal(size=(1000, DIM)))


def test_near_duplicate_groups_keep_the_false_reject_rate_on_new_queries_near_target() -> None:
    inputs, new_id = _paraphrased_inputs(np.random.default_rng(0))
    grouped = train(inputs, TrainConfig(m=6))
    row_by_row = train(inputs, TrainConfig(m=6, group_near_duplicates=False))
    assert 60 <= grouped.stats["n_id_groups"] <= 80  # the copies joined (two intents may be too)
    assert row_by_row.stats["n_id_groups"] == 400
    # Row by row, every calibration query has its near copies fitted and scores as more
    # in-domain than any new query does: the threshold then refuses most new ID traffic.
    frr = {
        name: float(np.mean(r.model.score(new_id) > r.model.threshold))
        for name, r in (("grouped", grouped), ("row_by_row", row_by_row))
    }
    assert frr["row_by_row"] > 0.5
    assert frr["grouped"] < 0.1


def test_given_query_groups_are_kept_whole_without_near_duplicate_joining() -> None:
    inputs, _ = _paraphrased_inputs(np.random.default_rng(1))
    given = [i // 10 for i in range(len(inputs.id_queries))]  # pairs of intents, as labelled
    inputs = replace(inputs, id_groups=given)
    splits = _splits(inputs, TrainConfig(group_near_duplicates=False))
    assert splits.id_groups is not None and len(np.unique(splits.id_groups)) == 40
    parts = np.split(splits.id_groups, np.cumsum([len(splits.id_fit), len(splits.id_val)]))
    assert not set(parts[0]) & set(parts[1]) and not set(parts[1]) & set(parts[2])
    assert not set(parts[0]) & set(parts[2])
    with pytest.raises(DataError, match="group labels"):
        _splits(replace(inputs, id_groups=given[:-1]), TrainConfig(group_near_duplicates=False))


def test_a_small_set_whose_near_duplicates_cannot_be_split_falls_back(
    caplog: pytest.LogCaptureFixture,
) -> None:
    rng = np.random.default_rng(4)
    inputs, _ = _paraphrased_inputs(rng)
    ids = inputs.id_queries[::5][:6].copy()  # six distinct intents ...
    ids[1:4] = ids[0]  # ... four of them copies of one: a group of 4 in 6 (any size)
    small = replace(inputs, id_queries=ids)
    grouped = grouped_splits(small, TrainConfig())
    assert not grouped.near_duplicates_grouped and grouped.n_id_groups == 6
    assert "split without near-duplicate groups" in caplog.text
    with pytest.raises(DataError, match="at least 5 ID training queries"):
        grouped_splits(replace(inputs, id_queries=ids[:4]), TrainConfig())
    big = grouped_splits(inputs, TrainConfig())
    assert inputs.ood_queries is not None
    assert big.near_duplicates_grouped and big.n_ood_groups <= len(inputs.ood_queries)


def test_stats_count_the_training_queries_the_capped_split_parts_leave_out() -> None:
    inputs = _inputs()
    rng = np.random.default_rng(3)
    # 20% (at most 2,000) validate, at most 4,000 of the rest fit: 6,000 of 11,000 used
    many = rng.normal(size=(11_000, DIM)).astype(np.float32)
    res = train(replace(inputs, ood_queries=many), TrainConfig(m=4, group_near_duplicates=False))
    assert res.stats["n_ood_queries"] == 11_000 and res.stats["n_ood_used"] == 6000
    assert res.stats["n_id_used"] == res.stats["n_id_queries"] == 80


def test_train_names_its_steps_and_the_grouping_as_it_goes() -> None:
    steps: list[str] = []
    train(_inputs(), TrainConfig(m=4), tick=steps.append)
    assert steps[0] == "split" and steps[-1] == "search"
    assert "grouping ID queries 80/80" in steps and "grouping OOD queries 80/80" in steps


def _search_rows(page: str) -> list[str]:
    section = page.split("## Search (validation split)")[1].split("\n## ")[0]
    return [line for line in section.splitlines() if line.startswith("| ") and "---" not in line]


def test_auto_report_marks_each_criterions_pick_and_says_how_they_were_compared(
    tmp_path: Path,
) -> None:
    inputs = _inputs()
    cfg = TrainConfig(detector="logreg", m_range=(2, 8), criterion="auto")
    result = train(inputs, cfg)
    data = report_data(inputs, cfg, result)
    page = write_report(data, tmp_path).read_text()
    rows = _search_rows(page)
    shipped = result.model.criterion
    other = {"evr": "pvalue", "pvalue": "evr"}[shipped]
    (kept,) = [r for r in rows if "**picked**" in r]
    (beaten,) = [r for r in rows if f"*best {other}*" in r]
    assert kept.split(" | ")[0] == f"| {shipped}" and beaten.split(" | ")[0] == f"| {other}"
    assert "each criterion was searched on its own" in page
    assert data.summary["criterion"] == shipped
    assert data.summary["criterion_requested"] == "auto"


def test_report_without_ood_says_no_auroc_ranked_the_candidates(tmp_path: Path) -> None:
    inputs = replace(_inputs(), ood_queries=None)
    cfg = TrainConfig(detector="epsilon_ball", m=4)  # criterion pvalue, the default
    result = train(inputs, cfg)
    data = report_data(inputs, cfg, result)
    page = write_report(data, tmp_path).read_text()
    assert "there is no validation AUROC" in page
    assert "within one standard error" not in page
    assert "Score histograms (validation, ID only: no OOD queries)" in page
    assert data.summary["criterion"] == "evr"
    assert data.summary["criterion_requested"] == "pvalue"
    assert any("p-value selection needs OOD training queries" in n for n in data.notes)


def test_the_input_budget_is_judged_as_the_kb_clips_the_candidates() -> None:
    from sidecar.errors import ConfigError
    from sidecar.training._job import check_config

    cfg = TrainConfig(detector="combined", m=30, features=("pcs", "residual"))
    with pytest.raises(ConfigError, match="add at least 3 features"):
        check_config(cfg)  # 30 PCs and residuals at k = 16, 32, 64: 33 inputs
    # 31 documents: residual ks 16 and 30 (32 and 64 clip to 30), 30 PCs: 32 inputs
    check_config(cfg, (31, 384))
    with pytest.raises(ConfigError, match="add at least 3 features"):
        check_config(cfg, (200, 384))
    fitted = Candidate("combined", 30, {"knn_ks": [1, 50]}, (16, 32, 64)).fitted_to_kb(31, 384)
    assert (fitted.m, fitted.residual_ks, fitted.params["knn_ks"]) == (30, (16, 30), [1, 31])


@pytest.mark.parametrize(
    ("detector", "param"),
    [
        ("epsilon_ball", "quantile"),  # the radius
        ("epsilon_cube", "quantile"),  # the half-width
        ("epsilon_rect", "quantile"),  # the sides
        ("logreg", "C"),
        ("svm", "C"),
        ("gmm", "n_components"),
    ],
)
def test_each_paper_detector_searches_m_and_its_own_parameter(detector: str, param: str) -> None:
    grid = default_grid(detector)
    assert len({c.m for c in grid}) >= 2
    assert len({c.params[param] for c in grid}) >= 2
    assert len({(c.m, repr(sorted(c.params.items()))) for c in grid}) == len(grid)
    # The paper's protocol runs one of the candidates the search tries.
    protocol = next(p for p in PROTOCOL_CANDIDATES if p.detector == detector)
    assert protocol.params in [c.params for c in grid]
