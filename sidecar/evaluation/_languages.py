"""``sidecar eval`` on a multilingual benchmark: one evaluation per language, one report.

Every language is embedded by the same encoder, loaded once, through one cache, and
evaluated exactly as a monolingual benchmark is (``evaluate_benchmark``). With a KB
language, each other language is evaluated twice, with the KB (and training queries) in
its own language and in the KB's, which gives the cross-lingual gap. The report keeps, per
language, the figures of every detector and its per-KB table, and judges the targets of
the multilingual issue against the encoder's own English figure.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from sidecar.evaluation._datasets import KBTask
from sidecar.evaluation._evaluate import evaluate_benchmark
from sidecar.evaluation._multilingual import (
    language_summary,
    languages_of,
    load_multilingual,
)

# The multilingual issue's targets.
SAME_AS_ENGLISH = 0.01  # a language's mean AUROC at most this far below English
XSID_MIN_AUROC = 0.98
CROSS_LINGUAL_GAP = 0.02  # English KB, queries in L: at most this below same-language
PRODUCT_DETECTOR = "combined"

Evaluate = Callable[..., dict[str, Any]]


def _lean_row(row: Mapping[str, Any]) -> dict[str, Any]:
    """A detector's row without the ROC samples and the per-fold search records (the
    PCs each fold chose stay, as ``fold_m``)."""
    out = {k: v for k, v in row.items() if k not in ("roc", "folds")}
    if "folds" in row:
        out["fold_m"] = [f.get("m") for f in row["folds"]]
    return out


def _lean(report: Mapping[str, Any]) -> dict[str, Any]:
    """A language's report: every figure per KB and on average, without the bulk."""
    kbs = {kb: {d: _lean_row(row) for d, row in dets.items()} for kb, dets in report["kbs"].items()}
    return {"kbs": kbs, "mean": report["mean"], "wall_s": report["wall_s"]}


def evaluate_languages(
    benchmark: str,
    data_dir: Any,
    split: str,
    *,
    language: str,
    kb_language: str | None,
    encoder: Mapping[str, Any],
    encoder_languages: Sequence[str] | None,
    evaluate: Evaluate,
    select: Callable[[list[Any]], list[Any]] = lambda tasks: tasks,
    seed: int = 0,
    progress: bool = True,
) -> dict[str, Any]:
    """Evaluate ``benchmark`` in every language ``language`` names (``all`` or a comma
    list) and assemble the report.

    ``evaluate(benchmark, split, tasks, **kw)`` is :func:`evaluate_benchmark` with the
    run's embedding, detectors and options bound; ``select`` picks the KBs.
    ``encoder_languages``: the ISO 639-1 codes the encoder was trained on (None: every
    language is judged by the targets).
    """
    from tqdm.auto import tqdm

    langs = languages_of(benchmark, language)
    kb_lang = languages_of(benchmark, kb_language)[0] if kb_language else None
    t0 = time.perf_counter()
    per_lang: dict[str, Any] = {}
    cross: dict[str, Any] = {}
    for lang in tqdm(langs, desc=f"{benchmark} languages", unit="lang", disable=not progress):
        tasks = load_multilingual(benchmark, data_dir, split, language=lang, seed=seed)
        same = evaluate(benchmark, split, select(tasks))
        per_lang[lang] = {"summary": language_summary(same), **_lean(same)}
        if kb_lang is not None and kb_lang != lang:
            tasks = load_multilingual(
                benchmark, data_dir, split, language=lang, kb_language=kb_lang, seed=seed
            )
            other = evaluate(benchmark, split, select(tasks))
            summary = language_summary(other)
            cross[lang] = {
                "kb_language": kb_lang,
                "summary": summary,
                "auroc_gap": {
                    d: round(per_lang[lang]["summary"][d]["auroc"] - row["auroc"], 4)
                    for d, row in summary.items()
                },
                **_lean(other),
            }
    report: dict[str, Any] = {
        "benchmark": benchmark,
        "split": split,
        "encoder": encoder["name"],
        "encoder_languages": list(encoder_languages) if encoder_languages else None,
        "kb_language": kb_lang,
        "seed": seed,
        "languages": per_lang,
        "crosslingual": cross or None,
        "wall_s": round(time.perf_counter() - t0, 1),
    }
    report["targets"] = language_targets(report)
    return report


def supported(lang: str, encoder_languages: Sequence[str] | None) -> bool:
    """Whether the encoder was trained on ``lang`` (a dialect code such as ``de-ba`` is
    not its base language)."""
    return encoder_languages is None or lang in encoder_languages


def language_targets(report: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The multilingual targets, judged on the product detector, each with its figure."""
    langs: Mapping[str, Any] = report["languages"]
    enc_langs = report.get("encoder_languages")
    out: list[dict[str, Any]] = []

    def auroc(entry: Mapping[str, Any]) -> float | None:
        row = entry["summary"].get(PRODUCT_DETECTOR)
        return None if row is None else float(row["auroc"])

    english = auroc(langs["en"]) if "en" in langs else None
    judged = {
        lang: a
        for lang, entry in langs.items()
        if supported(lang, enc_langs) and (a := auroc(entry)) is not None
    }
    if english is not None and judged:
        worst = min(judged, key=lambda k: judged[k])
        out.append(
            {
                "target": f"{PRODUCT_DETECTOR} mean AUROC within {SAME_AS_ENGLISH} of English "
                "in every language the encoder supports",
                "measured": f"English {english:.4f}; lowest {worst} {judged[worst]:.4f} "
                f"(gap {english - judged[worst]:.4f}) over {len(judged)} languages",
                "met": all(english - a <= SAME_AS_ENGLISH for a in judged.values()),
                "per_language": {k: round(english - a, 4) for k, a in judged.items()},
            }
        )
    if report["benchmark"] == "xsid" and judged:
        worst = min(judged, key=lambda k: judged[k])
        out.append(
            {
                "target": f"{PRODUCT_DETECTOR} mean AUROC >= {XSID_MIN_AUROC} on xSID in every "
                "language the encoder supports",
                "measured": f"lowest {worst} {judged[worst]:.4f}; mean "
                f"{float(np.mean(list(judged.values()))):.4f}",
                "met": all(a >= XSID_MIN_AUROC for a in judged.values()),
            }
        )
    cross = report.get("crosslingual") or {}
    gaps = {
        lang: float(entry["auroc_gap"][PRODUCT_DETECTOR])
        for lang, entry in cross.items()
        if supported(lang, enc_langs) and PRODUCT_DETECTOR in entry["auroc_gap"]
    }
    if gaps:
        worst = max(gaps, key=lambda k: gaps[k])
        out.append(
            {
                "target": f"cross-lingual {PRODUCT_DETECTOR} AUROC (KB in "
                f"{report['kb_language']}) within {CROSS_LINGUAL_GAP} of same-language",
                "measured": f"largest gap {worst} {gaps[worst]:.4f} over {len(gaps)} languages",
                "met": all(g <= CROSS_LINGUAL_GAP for g in gaps.values()),
                "per_language": {k: round(g, 4) for k, g in gaps.items()},
            }
        )
    return out


def run_languages(
    settings: Any,
    cfg: Any,
    enc: Any,
    embed: Any,
    dets: Sequence[str],
    grids: dict[str, Any] | None,
    progress: bool,
    select: Callable[[list[KBTask]], list[KBTask]],
) -> dict[str, Any]:
    """``sidecar eval`` on a multilingual benchmark (xsid, sib200): every language of
    ``cfg`` (an ``EvalConfig``) embedded by ``enc`` through ``embed``; on SIB-200 with a
    KB language, also the per-language calibration of :mod:`._language_calibration`."""
    from sidecar.encoders import encoder_spec

    spec = encoder_spec(enc.name)

    def evaluate(benchmark: str, split: str, tasks: list[KBTask]) -> dict[str, Any]:
        return evaluate_benchmark(
            benchmark,
            split,
            tasks,
            embed,
            encoder={"name": enc.name, "dim": enc.dim},
            detectors=dets,
            criterion=cfg.criterion,
            seed=cfg.seed,
            target_frr=cfg.target_frr,
            progress=False,
            threshold_rule=cfg.threshold_rule,
            fold_grouping=cfg.fold_grouping,
            protocol=cfg.protocol,
            calibration=cfg.calibration,
            grids=grids,
            center_languages=cfg.center_languages,
        )

    report = evaluate_languages(
        cfg.benchmark,
        cfg.data_dir,
        cfg.split,
        language=cfg.language or "en",
        kb_language=cfg.kb_language,
        encoder={"name": enc.name, "dim": enc.dim},
        encoder_languages=spec.languages if spec is not None else None,
        evaluate=evaluate,
        select=select,
        seed=cfg.seed,
        progress=progress,
    )
    report.update(
        {
            "criterion": cfg.criterion,
            "target_frr": cfg.target_frr,
            "threshold_rule": cfg.threshold_rule,
            "fold_grouping": cfg.fold_grouping,
            "detectors": list(dets),
            # each fold's means from its own training texts (evaluation._centering); the
            # per-language calibration below (SIB-200 with a KB language) is not centred
            "center_languages": cfg.center_languages,
        }
    )
    if cfg.kb_language and cfg.benchmark == "sib200":
        report["language_calibration"] = _by_language(settings, cfg, enc, embed, dets, select)
        report["targets"].append(report["language_calibration"]["target"])
    return report


def _by_language(
    settings: Any,
    cfg: Any,
    enc: Any,
    embed: Any,
    dets: Sequence[str],
    select: Callable[[list[KBTask]], list[KBTask]],
) -> dict[str, Any]:
    """One model per KB trained in the KB language, judged in every language under its
    trained, globally recalibrated and per-language thresholds (see
    :mod:`._language_calibration`)."""
    from sidecar.encoders import LanguageDetector, detector_languages
    from sidecar.evaluation._language_calibration import LIVE_FRACTION, calibrate_by_language
    from sidecar.evaluation._multilingual import load_sib200, sib200_live

    assert cfg.kb_language is not None
    langs = languages_of(cfg.benchmark, cfg.language or "en")
    kb_lang = languages_of(cfg.benchmark, cfg.kb_language)[0]

    def tasks(lang: str) -> list[KBTask]:
        loaded = load_sib200(
            cfg.data_dir,
            cfg.split,
            language=lang,
            kb_language=kb_lang,
            seed=cfg.seed,
            live_fraction=LIVE_FRACTION,
        )
        return select(loaded)

    def live(lang: str) -> dict[str, tuple[str, ...]]:
        return sib200_live(cfg.data_dir, language=lang, seed=cfg.seed, live_fraction=LIVE_FRACTION)

    detector = LanguageDetector(detector_languages(enc.name, settings.scoring.languages))
    return calibrate_by_language(
        tasks(kb_lang),
        {lang: (live(lang), tasks(lang)) for lang in langs},
        embed,
        detector.detect,
        encoder={"name": enc.name, "dim": enc.dim},
        detector="combined" if "combined" in dets else dets[0],
        target_frr=cfg.target_frr,
        seed=cfg.seed,
        criterion=cfg.criterion,
    )
