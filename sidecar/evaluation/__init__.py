"""The evaluation harness: benchmark datasets and their readers, the paper's protocol
(cross-validated folds, seeds), targets and the evaluation report; :func:`run_evaluation`
runs one benchmark as an :class:`EvalConfig` describes it. The multilingual benchmarks
(xSID, SIB-200) are evaluated language by language (:func:`evaluate_languages`), with the
KB in the queries' language or in another.

It uses the retraining job (:mod:`sidecar.training`); training never uses it.
"""

from sidecar.evaluation._datasets import (
    BENCHMARKS,
    KBTask,
    load_benchmark,
    load_clinc150,
    load_covid,
    load_stackexchange,
)
from sidecar.evaluation._eval_json import read_eval_json
from sidecar.evaluation._evaluate import DETECTORS, evaluate_benchmark, evaluate_task
from sidecar.evaluation._languages import evaluate_languages
from sidecar.evaluation._multilingual import (
    MULTILINGUAL_BENCHMARKS,
    load_multilingual,
    load_sib200,
    load_xsid,
    read_sib200,
    read_xsid,
)
from sidecar.evaluation._report import write_eval_report
from sidecar.evaluation._run import EvalConfig, run_evaluation, select_kbs
from sidecar.evaluation._spread import seed_spread
from sidecar.evaluation._targets import targets
from sidecar.evaluation._unseen import Holdout, unseen_holdouts
from sidecar.evaluation._unseen_run import evaluate_unseen

__all__ = [
    "BENCHMARKS",
    "DETECTORS",
    "MULTILINGUAL_BENCHMARKS",
    "EvalConfig",
    "Holdout",
    "KBTask",
    "evaluate_benchmark",
    "evaluate_languages",
    "evaluate_task",
    "evaluate_unseen",
    "load_benchmark",
    "load_clinc150",
    "load_covid",
    "load_multilingual",
    "load_sib200",
    "load_stackexchange",
    "load_xsid",
    "read_eval_json",
    "read_sib200",
    "read_xsid",
    "run_evaluation",
    "seed_spread",
    "select_kbs",
    "targets",
    "unseen_holdouts",
    "write_eval_report",
]
