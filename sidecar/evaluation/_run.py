"""Run the evaluation ``sidecar eval`` describes: one benchmark, its KBs, one or more seeds.

:func:`run_evaluation` reads the benchmark, embeds its queries with the worker's encoder
(cached on disk), evaluates every detector and baseline (:func:`evaluate_benchmark`) at
each seed and returns the report JSON; :class:`EvalConfig` holds what it runs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sidecar.errors import ConfigError
from sidecar.evaluation._datasets import KBTask, load_benchmark
from sidecar.evaluation._evaluate import DETECTORS, evaluate_benchmark
from sidecar.evaluation._languages import run_languages
from sidecar.evaluation._multilingual import (
    MULTILINGUAL_BENCHMARKS,
    languages_of,
    load_multilingual,
)
from sidecar.evaluation._spread import seed_spread
from sidecar.evaluation._targets import targets
from sidecar.scoring import DEFAULT_TARGET_FRR
from sidecar.settings import Settings


@dataclass(frozen=True)
class EvalConfig:
    """One evaluation run.

    ``detectors`` None evaluates every detector; ``kbs`` is a comma-separated subset of
    the benchmark's KBs (None: all). ``max_train_per_kb`` / ``max_eval_per_kb`` subsample
    stackexchange only. ``n_seeds`` > 1 also evaluates seeds ``seed + 1`` ... without the
    protocol refits and reports the spread. ``features`` (comma-separated blocks, recorded
    as given) and ``neighbour_bank`` change the combined detector's candidates as they
    would for ``sidecar train``, and so do ``floor`` and ``deny_topics`` (every detector
    then screens for the topics). ``blas_threads`` caps the BLAS threads.
    """

    benchmark: str
    data_dir: Path
    split: str = "dev"
    detectors: tuple[str, ...] | None = None
    kbs: str | None = None
    encoder: str | None = None
    criterion: str = "pvalue"
    target_frr: float = DEFAULT_TARGET_FRR
    threshold_rule: str = "frr"
    calibration: str | None = None
    seed: int = 0
    cache_dir: Path | None = None
    blas_threads: int = 1
    max_train_per_kb: int | None = None
    max_eval_per_kb: int | None = None
    fold_grouping: str = "grouped"
    n_seeds: int = 1
    protocol: bool = True
    features: str | None = None
    neighbour_bank: int | None = None
    # floor the combined detector with its OOD-free evidence (TrainConfig.floor; None:
    # the default, floored; False: not)
    floor: bool | None = None
    # denied topics every model screens for: "builtin" or a file (None: none)
    deny_topics: str | None = None
    # xsid / sib200: the query language(s) ("all" or a comma list) and the KB's language
    language: str | None = None
    kb_language: str | None = None
    # "standard", or "unseen-ood": OOD families held out of training (evaluation._unseen)
    ood_protocol: str = "standard"
    # centre by language, each fold's means from its training texts (evaluation._centering)
    center_languages: bool = False


def select_kbs(tasks: Sequence[KBTask], kbs: str | None, benchmark: str) -> list[KBTask]:
    """The benchmark's tasks named in ``kbs`` (comma-separated; None or "": all of them).

    Raises ConfigError naming the KBs the benchmark does not have, and the ones it has.
    """
    wanted = [k.strip() for k in (kbs or "").split(",") if k.strip()]
    if not wanted:
        return list(tasks)
    missing = sorted(set(wanted) - {t.name for t in tasks})
    if missing:
        raise ConfigError(f"{benchmark} has no KB {missing}; it has {[t.name for t in tasks]}")
    return [t for t in tasks if t.name in wanted]


def _grids(cfg: EvalConfig, detectors: Sequence[str]) -> dict[str, Any] | None:
    """The combined candidates `sidecar train` would search with the same features,
    neighbour bank and floor; None when none is given (the default grids, floored)."""
    if cfg.features is None and cfg.neighbour_bank is None and cfg.floor is None:
        return None
    from sidecar.training import TrainConfig, check_config, combined_grid

    if "combined" not in detectors:
        raise ConfigError(
            "--features / --neighbour-bank / --floor / --no-floor apply to the combined detector"
        )
    # as `sidecar train --features` reads them: None when not given
    blocks = (
        tuple(f.strip() for f in cfg.features.split(",") if f.strip()) if cfg.features else None
    )
    check_config(TrainConfig(features=blocks, neighbour_bank=cfg.neighbour_bank, floor=cfg.floor))
    floored = cfg.floor is not False
    return {"combined": combined_grid(blocks, cfg.neighbour_bank, floor=floored)}


def _grid_record(cfg: EvalConfig) -> dict[str, Any]:
    """How the combined detector's candidates were changed, for the report."""
    floored = cfg.floor is not False
    return {"features": cfg.features, "neighbour_bank": cfg.neighbour_bank, "floor": floored}


def _deny_record(cfg: EvalConfig, topics: tuple[str, ...]) -> dict[str, Any] | None:
    """The denied topics every model screened for, for the report."""
    return {"source": cfg.deny_topics, "n": len(topics)} if topics else None


def _check_ood_protocol(cfg: EvalConfig) -> None:
    from sidecar.evaluation._unseen import OOD_PROTOCOLS

    if cfg.ood_protocol not in OOD_PROTOCOLS:
        raise ConfigError(f"OOD protocol must be one of {OOD_PROTOCOLS}, not {cfg.ood_protocol!r}")
    if cfg.ood_protocol != "standard" and cfg.n_seeds > 1:
        raise ConfigError("--seeds applies to the standard OOD protocol only")


def _unseen(
    cfg: EvalConfig,
    tasks: Sequence[KBTask],
    embed: Any,
    encoder: dict[str, Any],
    dets: Sequence[str],
    grids: dict[str, Any] | None,
    progress: bool,
    deny: Any = None,
) -> dict[str, Any]:
    """The unseen-OOD protocol on ``tasks`` (see :mod:`sidecar.evaluation._unseen`)."""
    from sidecar.evaluation._unseen import unseen_holdouts
    from sidecar.evaluation._unseen_run import evaluate_unseen

    report = evaluate_unseen(
        cfg.benchmark,
        cfg.split,
        unseen_holdouts(cfg.benchmark, tasks, cfg.data_dir, cfg.split),
        embed,
        encoder=encoder,
        detectors=dets,
        criterion=cfg.criterion,
        seed=cfg.seed,
        target_frr=cfg.target_frr,
        threshold_rule=cfg.threshold_rule,
        fold_grouping=cfg.fold_grouping,
        calibration=cfg.calibration,
        grids=grids,
        progress=progress,
        deny_topics=deny,
    )
    if grids is not None:
        report["combined_grid"] = _grid_record(cfg)
    return report


def run_evaluation(settings: Settings, cfg: EvalConfig, *, progress: bool = True) -> dict[str, Any]:
    """Evaluate every detector of ``cfg`` on its benchmark and return the report JSON.

    The encoder is the worker's (``settings.scoring``, or ``cfg.encoder``), on every CPU;
    ``progress`` shows the encoding and evaluation bars. The options are checked before
    any data is read.
    """
    from threadpoolctl import threadpool_limits

    from sidecar.encoders import available_cpus, load_encoder
    from sidecar.training import EmbeddingCache

    caps = {
        k: v
        for k, v in (
            ("max_train_per_kb", cfg.max_train_per_kb),
            ("max_eval_per_kb", cfg.max_eval_per_kb),
        )
        if v is not None
    }
    if caps and cfg.benchmark != "stackexchange":
        raise ConfigError("--max-train-per-kb / --max-eval-per-kb apply to stackexchange only")
    multilingual = cfg.benchmark in MULTILINGUAL_BENCHMARKS
    if not multilingual and (cfg.language or cfg.kb_language):
        raise ConfigError("--language / --kb-language apply to xsid and sib200")
    if multilingual and cfg.n_seeds > 1:
        raise ConfigError("--seeds applies to the monolingual benchmarks")
    if multilingual and cfg.ood_protocol != "standard":
        raise ConfigError("--ood-protocol unseen-ood applies to the monolingual benchmarks")
    _check_ood_protocol(cfg)
    if cfg.center_languages and cfg.ood_protocol != "standard":
        raise ConfigError("--center-languages applies to the standard OOD protocol")
    dets = DETECTORS if cfg.detectors is None else cfg.detectors
    grids = _grids(cfg, dets)
    topics: tuple[str, ...] = ()
    if cfg.deny_topics:
        if multilingual:
            raise ConfigError("--deny-topics applies to the monolingual benchmarks")
        from sidecar.training import read_deny_topics

        topics = read_deny_topics(cfg.deny_topics)
    if multilingual:  # every file read (and refused) before the encoder loads
        for lang in languages_of(cfg.benchmark, cfg.language or "en"):
            tasks = load_multilingual(
                cfg.benchmark,
                cfg.data_dir,
                cfg.split,
                language=lang,
                kb_language=cfg.kb_language,
                seed=cfg.seed,
            )
            select_kbs(tasks, cfg.kbs, cfg.benchmark)
    else:
        tasks = load_benchmark(cfg.benchmark, cfg.data_dir, cfg.split, **caps)
        tasks = select_kbs(tasks, cfg.kbs, cfg.benchmark)
    # The worker's backend (ONNX Runtime under `auto`), on every CPU.
    enc = load_encoder(settings, name=cfg.encoder, threads=available_cpus())
    cache = EmbeddingCache(enc, cfg.cache_dir, progress=progress)
    deny = None
    if topics:
        from sidecar.scoring import DenyTopics

        deny = DenyTopics(topics, cache.embed(list(topics), desc="encoding denied topics"))
    groups: dict[Any, Any] = {}  # near-duplicate groups: the same for every seed
    if cfg.ood_protocol == "unseen-ood":
        with threadpool_limits(limits=cfg.blas_threads):
            encoder = {"name": enc.name, "dim": enc.dim}
            report = _unseen(cfg, tasks, cache.embed, encoder, dets, grids, progress, deny)
        report["subsample"] = caps or None
        report["deny_topics"] = _deny_record(cfg, topics)
        return report

    def run(at: int, with_protocol: bool) -> dict[str, Any]:
        return evaluate_benchmark(
            cfg.benchmark,
            cfg.split,
            tasks,
            cache.embed,
            encoder={"name": enc.name, "dim": enc.dim},
            detectors=dets,
            criterion=cfg.criterion,
            seed=at,
            target_frr=cfg.target_frr,
            progress=progress,
            threshold_rule=cfg.threshold_rule,
            fold_grouping=cfg.fold_grouping,
            protocol=with_protocol,
            calibration=cfg.calibration,
            group_cache=groups,
            grids=grids,
            deny_topics=deny,
            center_languages=cfg.center_languages,
        )

    if multilingual:
        with threadpool_limits(limits=cfg.blas_threads):
            return run_languages(
                settings,
                cfg,
                enc,
                cache.embed,
                dets,
                grids,
                progress,
                select=lambda tasks: select_kbs(tasks, cfg.kbs, cfg.benchmark),
            )
    with threadpool_limits(limits=cfg.blas_threads):
        report = run(cfg.seed, cfg.protocol)
        if cfg.n_seeds > 1:
            extra = [run(cfg.seed + i, False) for i in range(1, cfg.n_seeds)]
            report["seed_spread"] = seed_spread([report, *extra])
            report["wall_s"] = round(report["wall_s"] + sum(r["wall_s"] for r in extra), 1)
            report["targets"] = targets(report)
    report["subsample"] = caps or None
    report["deny_topics"] = _deny_record(cfg, topics)
    if grids is not None:
        report["combined_grid"] = _grid_record(cfg)
    return report
