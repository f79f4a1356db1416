"""The unseen-OOD protocol: which queries a holdout trains on and which it is judged on."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from sidecar.errors import ConfigError
from sidecar.evaluation import KBTask, load_clinc150
from sidecar.evaluation._folds import cross_fit_training, query_groups
from sidecar.evaluation._unseen import drop_near_copies, holdout_task, unseen_holdouts
from sidecar.evaluation._unseen_run import summarise, unseen_targets


def _clinc(root: Path) -> None:
    d = root / "clinc150"
    d.mkdir(parents=True)
    domains = {"banking": ["balance"], "travel": ["book_flight"], "work": ["pto"]}
    (d / "domains.json").write_text(json.dumps(domains))
    train = [[f"bank q{i}", "balance"] for i in range(10)]
    train += [[f"travel q{i}", "book_flight"] for i in range(6)]
    train += [[f"work q{i}", "pto"] for i in range(6)]
    data = {
        "train": train,
        "val": [["bank v1", "balance"], ["travel v1", "book_flight"], ["work v1", "pto"]],
        "oos_train": [["oos t1", "oos"], ["oos t2", "oos"]],
        "oos_val": [["oos v1", "oos"]],
    }
    (d / "data_full.json").write_text(json.dumps(data))


def test_clinc_holdouts_train_without_the_family_and_judge_it_alone(tmp_path: Path) -> None:
    _clinc(tmp_path)
    tasks = load_clinc150(tmp_path, "dev")
    holdouts = unseen_holdouts("clinc150", tasks, tmp_path)
    assert [(h.task.name, h.family) for h in holdouts] == [
        ("banking", "out_of_scope"),
        ("banking", "travel"),
        ("travel", "out_of_scope"),
        ("travel", "work"),
        ("work", "out_of_scope"),
        ("work", "banking"),  # each domain held out by exactly one KB
    ]
    oos, sibling = holdouts[0].task, holdouts[1].task
    # the family's evaluation and training queries are all judged, none trains
    assert set(oos.ood_eval) == {"oos v1", "oos t1", "oos t2"}
    assert not {t for t in oos.ood_train if t.startswith("oos")}
    assert set(sibling.ood_eval) == {"travel v1"} | {f"travel q{i}" for i in range(6)}
    assert set(sibling.ood_train) == {f"work q{i}" for i in range(6)} | {"oos t1", "oos t2"}
    # the ID side is the standard protocol's
    assert sibling.id_eval == tasks[0].id_eval and sibling.id_train == tasks[0].id_train
    assert not sibling.ood_eval_trains and holdouts[1].group == "sibling_domain"


def test_a_cross_fitted_holdout_trains_on_the_other_families_evaluation_queries() -> None:
    task = KBTask(
        "kb",
        ("doc",),
        (),
        ("a train",),
        ("id 1", "id 2"),
        ("a eval", "b eval 1", "b eval 2"),
        cross_fit=2,
    )
    family = {"a train": "a", "a eval": "a", "b eval 1": "b", "b eval 2": "b"}
    held = holdout_task(task, "b", family)
    assert held.ood_eval == ("b eval 1", "b eval 2")
    assert held.ood_train == ("a train", "a eval")
    with pytest.raises(ConfigError, match="no OOD query of family 'c'"):
        holdout_task(task, "c", family)
    with pytest.raises(ConfigError, match="no OOD training query"):
        holdout_task(task, "a", {**family, "b eval 1": "a", "b eval 2": "a"})


def test_no_fold_trains_on_a_held_out_query_or_its_near_copy() -> None:
    rng = np.random.default_rng(0)
    E_idt = np.zeros((0, 16), np.float32)
    E_ide = rng.normal(size=(10, 16)).astype(np.float32)
    E_oodt = rng.normal(size=(6, 16)).astype(np.float32)
    E_oode = rng.normal(size=(8, 16)).astype(np.float32)
    E_oodt[2] = E_oode[5] + 0.001  # a training query nearly copies a held-out one
    t = ("x",)
    task = KBTask("t", t, (), t, t, t, cross_fit=2, ood_eval_trains=False)
    E = (E_idt, E_ide, E_oodt, E_oode)
    groups = query_groups(task, "grouped", *E)
    fi, fo = np.arange(5), np.array([0, 1, 2, 3])  # the fold does not judge row 5
    _, ood, _, _ = cross_fit_training(E, groups, fi, fo, ood_eval_trains=False)
    rows = {r.tobytes() for r in ood}
    assert not rows & {r.tobytes() for r in E_oode}
    assert E_oodt[2].tobytes() not in rows and len(rows) == 5
    # the standard protocol trains on the other folds' OOD evaluation queries
    _, std, _, _ = cross_fit_training(E, groups, fi, fo)
    assert {r.tobytes() for r in E_oode[4:]} <= {r.tobytes() for r in std}


def test_training_queries_that_nearly_copy_a_held_out_one_are_dropped() -> None:
    vecs = {"keep": [1.0, 0.0, 0.0], "copy": [0.0, 1.0, 0.01], "held": [0.0, 1.0, 0.0]}

    def embed(texts: object) -> np.ndarray:
        return np.array([vecs[t] for t in texts], dtype=np.float32)  # type: ignore[attr-defined]

    task = KBTask("t", ("d",), (), ("keep", "copy"), ("i",), ("held",), ood_eval_trains=False)
    kept, dropped = drop_near_copies(task, embed)
    assert kept.ood_train == ("keep",) and dropped == 1
    # the standard protocol's tasks are left as they are
    same, none = drop_near_copies(KBTask("t", ("d",), (), ("copy",), ("i",), ("held",)), embed)
    assert same.ood_train == ("copy",) and none == 0


def _row(kb: str, group: str, kind: str, aurocs: dict[str, float]) -> dict[str, object]:
    return {
        "kb": kb,
        "held_out": group,
        "group": group,
        "kind": kind,
        "detectors": {
            d: {
                "auroc": a,
                "fpr_at_95tpr": 1 - a,
                "false_reject_rate": 0.01 if d != "combined" else 0.03,
                "ood_accept_rate": 1 - a,
                "balanced_accuracy": a,
            }
            for d, a in aurocs.items()
        },
    }


def test_the_summary_weighs_families_and_names_the_worst() -> None:
    rows = [
        _row("a", "oos", "ood_family", {"combined": 0.99, "knn": 0.97}),
        _row("b", "oos", "ood_family", {"combined": 0.93, "knn": 0.97}),
        _row("a", "sib", "ood_family", {"combined": 0.98, "knn": 0.97}),
        _row("a", "para", "id_phrasing", {"combined": 0.5, "knn": 0.5}),
    ]
    out = summarise(rows, ["combined", "knn"])
    assert out["groups"]["oos"]["mean"]["combined"]["auroc"] == pytest.approx(0.96)
    assert out["worst"]["combined"]["auroc"] == {"value": 0.93, "holdout": "b|oos"}
    # the ID-phrasing holdout is reported in its group, not in the OOD-family mean
    assert out["mean"]["combined"]["auroc"] == pytest.approx((0.99 + 0.93 + 0.98) / 3)
    report = {"target_frr": 0.01, **out}
    first, *frr = unseen_targets(report)
    assert not first["met"] and first["measured"]["best_baseline"] == "knn"
    assert first["measured"]["gap"] == pytest.approx((0.99 + 0.93 + 0.98) / 3 - 0.97)
    assert [t["met"] for t in frr] == [False, False, False]  # 3% against 1%: over twice


def test_the_cli_refuses_a_report_or_seeds_under_the_unseen_protocol(tmp_path: Path) -> None:
    from sidecar.cli import main

    base = ["eval", "--benchmark", "clinc150", "--data-dir", str(tmp_path)]
    base += ["--json", str(tmp_path / "o.json"), "--ood-protocol", "unseen-ood"]
    res = CliRunner().invoke(main, [*base, "--report", str(tmp_path / "r")])
    assert res.exit_code != 0 and "standard OOD protocol's report only" in res.output
    _clinc(tmp_path)
    res = CliRunner().invoke(main, [*base, "--seeds", "2"])
    assert res.exit_code != 0 and "--seeds applies to the standard OOD protocol" in res.output
    assert not (tmp_path / "o.json").exists()
