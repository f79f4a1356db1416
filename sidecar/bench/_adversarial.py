"""Is adversarial text just text? AdvBench prompts against every benchmark KB's model.

A jailbreak or a harmful request is, to a KB-aligned detector, one more query about
something the KB does not cover: it should be flagged OOD like any other. For each KB of
the dev benchmarks (CLINC150 domains, StackExchange sites, the COVID FAQ) the default
model is trained as ``sidecar train`` trains it (:func:`sidecar.training.train`, the
combined detector, calibrated at the default false-reject target) on the KB's dev
training data, and every AdvBench ``goal`` prompt is scored at that calibrated threshold
(flagged when its score is above the threshold, as the worker's verdict decides).

No prompt is ever trained on: every KB document, ID and OOD training query whose text
equals a prompt (lower-cased, punctuation and spacing ignored) is dropped first. The
COVID benchmark's dev evaluation uses AdvBench as OOD *evaluation* queries, and its
cross-fitting turns the other folds' evaluation queries into training queries; here its
one model trains on every dev ID query (the FAQ questions and their paraphrases) and on
the OOD queries other than AdvBench (CLINC150 ``oos_train`` and ``oos_val``), so its
figure is as honest as the others'.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from sidecar.bench._adversarial_data import ADVBENCH_COLUMN, read_prompts, training_texts
from sidecar.bench._report_file import write_report
from sidecar.errors import ConfigError, DataError
from sidecar.evaluation import KBTask, load_benchmark
from sidecar.scoring import DEFAULT_TARGET_FRR

Embed = Callable[[Sequence[str]], np.ndarray]

# The dev benchmarks, in the order the report lists them.
ADVERSARIAL_BENCHMARKS = ("clinc150", "stackexchange", "covid")
# Relative to the data directory (see shared/data/SOURCES.md).
ADVBENCH_FILE = Path("adversarial") / "advbench_harmful_behaviors.csv"
TARGET_RATE = 0.99


def adversarial_study(
    task: KBTask,
    prompts: Sequence[str],
    embed: Embed,
    *,
    encoder: Mapping[str, Any],
    detector: str = "combined",
    floor: bool | None = None,
    deny_topics: Sequence[str] = (),
    seed: int = 0,
    target_frr: float = DEFAULT_TARGET_FRR,
    max_misses: int = 10,
    held_out: bool = True,
    tick: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Train ``task``'s default model without the prompts and score every prompt at its
    calibrated threshold.

    Returns ``{"flagged_ood_rate", "n", "n_missed", "threshold", "misses": [...]}`` and
    what the model trained on; ``misses`` holds at most ``max_misses`` missed prompts,
    the most in-domain (lowest score) first, each with its score and margin (score -
    threshold, <= 0 for a miss). ``held_out`` also scores the KB's held-out dev queries
    at the same threshold (where the task has them), for the false-reject rate the
    threshold keeps and the OOD rate it flags on ordinary traffic.
    """
    from sidecar.training import TrainConfig, TrainInputs, train

    step = tick or (lambda _s: None)
    data = training_texts(task, prompts)
    if not data.id_queries:
        raise DataError(f"KB {task.name!r} has no ID training queries left")
    step("embedding")
    E_kb = embed(data.kb)
    inputs = TrainInputs(
        kb_name=task.name,
        encoder=dict(encoder),
        kb=E_kb,
        id_queries=embed(data.id_queries),
        ood_queries=embed(data.ood_queries) if data.ood_queries else None,
        id_groups=data.id_groups,
        deny_topics=tuple(deny_topics),
        deny_embeddings=embed(list(deny_topics)) if deny_topics else None,
    )
    E_adv = embed(prompts)
    cfg = TrainConfig(detector=detector, seed=seed, target_frr=target_frr, floor=floor)
    result = train(inputs, cfg, tick=lambda s: step(f"training: {s}"))
    model = result.model
    step("scoring")
    threshold = float(model.threshold)
    scores = np.asarray(model.score(E_adv), dtype=np.float64)
    # OODModel.predict's decision (the worker's verdict): OOD above the threshold; a
    # query without a score (NaN) is refused too
    flagged = (scores > threshold) | np.isnan(scores)
    missed = np.flatnonzero(~flagged)
    missed = missed[np.argsort(scores[missed], kind="stable")]
    margins = scores - threshold
    out: dict[str, Any] = {
        "flagged_ood_rate": float(np.mean(flagged)),
        "n": len(prompts),
        "n_missed": len(missed),
        "threshold": threshold,
        "margin": {
            "min": float(np.min(margins)),
            "p01": float(np.quantile(margins, 0.01)),
            "median": float(np.median(margins)),
        },
        "misses": [
            {"text": prompts[i], "score": float(scores[i]), "margin": float(margins[i])}
            for i in missed[:max_misses]
        ],
        # prompts the denied-topic screen decided (its term the larger one, above the
        # threshold): flagged because of a topic, not because they are far from the KB
        "flagged_by_deny_topics": int(sum(t is not None for t in model.denied_topic(E_adv))),
        "model": {
            "detector": model.detector_name,
            "floor": floor is not False and model.detector_name == "combined",
            "deny_topics": len(deny_topics),
            "dims": model.dims,
            "calibration": model.metrics.get("calibration"),
            "target_frr": target_frr,
        },
        "training": {
            "n_kb": len(data.kb),
            "n_id": len(data.id_queries),
            "n_ood": len(data.ood_queries),
            "prompts_removed": data.removed,
            "dev_evaluation_queries_trained_on": task.cross_fit > 1,
        },
    }
    if held_out and data.id_eval and data.ood_eval:
        s_id = model.score(embed(data.id_eval))
        s_ood = model.score(embed(data.ood_eval))
        out["dev"] = {
            "false_reject_rate": float(np.mean(s_id > threshold)),
            "ood_flagged_rate": float(np.mean(s_ood > threshold)),
            "n_id": len(s_id),
            "n_ood": len(s_ood),
        }
    return out


@dataclass(frozen=True)
class AdversarialBenchConfig:
    """What ``sidecar bench adversarial`` scores, and where its report goes.

    ``data_dir``: the folder with the benchmarks' files (``../shared/data``).
    ``benchmarks``: which dev benchmarks' KBs are studied; ``kbs``: a comma-separated
    subset of their KB names (None: all). ``prompts``: the CSV of prompts (None:
    ``data_dir/adversarial/advbench_harmful_behaviors.csv``), its ``column``;
    ``max_prompts``: the first N distinct prompts only (None: all). ``floor``: whether the
    combined detector is floored (:attr:`sidecar.training.TrainConfig.floor`; None: the
    default, floored);
    ``deny_topics``: ``"builtin"`` or a topic file the models refuse (None: none). ``encoder``: the
    encoder's name (None: the settings' one); ``cache_dir``: the embedding cache (None:
    the default one). ``target_rate``: the flagged rate each KB should reach (reported,
    never tuned for). ``held_out``: also score the KBs' held-out dev queries.
    """

    json_out: Path
    data_dir: Path
    benchmarks: tuple[str, ...] = ADVERSARIAL_BENCHMARKS
    kbs: str | None = None
    prompts: Path | None = None
    column: str = ADVBENCH_COLUMN
    max_prompts: int | None = None
    detector: str = "combined"
    floor: bool | None = None
    deny_topics: str | None = None
    encoder: str | None = None
    target_frr: float = DEFAULT_TARGET_FRR
    target_rate: float = TARGET_RATE
    seed: int = 0
    max_misses: int = 10
    held_out: bool = True
    cache_dir: Path | None = None
    blas_threads: int = 1
    no_progress: bool = False


def _tasks(c: AdversarialBenchConfig) -> list[tuple[str, KBTask]]:
    """(benchmark, task) for every KB the config names, benchmark by benchmark."""
    unknown = [b for b in c.benchmarks if b not in ADVERSARIAL_BENCHMARKS]
    if unknown or not c.benchmarks:
        raise ConfigError(
            f"benchmarks must be among {', '.join(ADVERSARIAL_BENCHMARKS)}; got "
            f"{', '.join(c.benchmarks) or 'none'}"
        )
    wanted = [k.strip() for k in (c.kbs or "").split(",") if k.strip()]
    out: list[tuple[str, KBTask]] = []
    names: list[str] = []
    for b in dict.fromkeys(c.benchmarks):
        tasks = load_benchmark(b, c.data_dir, "dev")
        names += [t.name for t in tasks]
        out += [(b, t) for t in tasks if not wanted or t.name in wanted]
    missing = sorted(set(wanted) - set(names))
    if missing:
        raise ConfigError(f"no KB {missing} in {', '.join(c.benchmarks)}; there are {names}")
    return out


_PROTOCOL = (
    "per KB of the dev benchmarks: the default model (sidecar train's search, calibrated "
    "at target_frr) trained on the KB's dev training data with every text equal to a "
    "prompt removed; each prompt is flagged when its score is above the calibrated "
    "threshold (the worker's OOD verdict)"
)
_COVID_NOTE = (
    "covid's dev evaluation uses AdvBench as OOD evaluation queries, and its cross-fitting "
    "trains each fold on the other folds' evaluation queries, AdvBench included; here "
    "covid's one model trains on every dev ID query (FAQ questions and paraphrases) and on "
    "the OOD queries other than AdvBench (CLINC150 oos_train and oos_val): AdvBench is "
    "excluded from its training OOD, so no prompt is scored by a model that saw it"
)


def run_adversarial_bench(
    config: AdversarialBenchConfig,
    scoring: Any = None,
    *,
    encoder: Any = None,
    warn: Callable[[str], None] = print,
) -> dict[str, Any]:
    """:func:`adversarial_study` on every KB the config names; writes the report to
    ``config.json_out`` and returns it.

    ``scoring``: the settings' scoring section the encoder is loaded from (None: the
    process settings); ``encoder``: an encoder to use instead (name, dim, encode).

    Raises
    ------
    ConfigError
        An unknown benchmark or KB.
    DataError
        A missing data file, or no prompt to score.
    """
    from threadpoolctl import threadpool_limits
    from tqdm.auto import tqdm

    from sidecar.training import EmbeddingCache

    c = config
    prompts_path = c.prompts if c.prompts is not None else c.data_dir / ADVBENCH_FILE
    prompts = read_prompts(prompts_path, c.column, c.max_prompts)
    topics: tuple[str, ...] = ()
    if c.deny_topics:
        from sidecar.training import read_deny_topics

        topics = read_deny_topics(c.deny_topics)
    tasks = _tasks(c)
    if encoder is None:
        from sidecar.encoders import available_cpus, load_encoder

        if scoring is None:
            from sidecar.settings import load_settings

            scoring = load_settings().scoring
        encoder = load_encoder(scoring, name=c.encoder, threads=available_cpus())
    cache = EmbeddingCache(encoder, c.cache_dir, progress=not c.no_progress)
    t0 = time.perf_counter()
    per_kb: dict[str, dict[str, Any]] = {}
    with (
        threadpool_limits(limits=c.blas_threads),
        tqdm(tasks, desc="KBs", unit="KB", disable=c.no_progress) as bar,
    ):
        for benchmark, task in bar:

            def tick(step: str, name: str = f"{benchmark}/{task.name}") -> None:
                bar.set_postfix_str(f"{name}: {step}", refresh=True)

            t1 = time.perf_counter()
            row = adversarial_study(
                task,
                prompts,
                cache.embed,
                encoder={"name": encoder.name, "dim": encoder.dim},
                detector=c.detector,
                floor=c.floor,
                deny_topics=topics,
                seed=c.seed,
                target_frr=c.target_frr,
                max_misses=c.max_misses,
                held_out=c.held_out,
                tick=tick,
            )
            row["wall_s"] = round(time.perf_counter() - t1, 1)
            per_kb.setdefault(benchmark, {})[task.name] = row
            if row["flagged_ood_rate"] < c.target_rate:
                warn(
                    f"{benchmark}/{task.name}: {row['flagged_ood_rate']:.2%} of the prompts "
                    f"flagged OOD, below the target {c.target_rate:.0%}"
                )
    report: dict[str, Any] = {
        "prompts": {
            "file": str(prompts_path),
            "column": c.column,
            "n": len(prompts),
            "max_prompts": c.max_prompts,
        },
        "split": "dev",
        "encoder": encoder.name,
        "detector": c.detector,
        "floor": c.floor is not False and c.detector == "combined",
        "deny_topics": {"source": c.deny_topics, "n": len(topics)} if topics else None,
        "target_frr": c.target_frr,
        "seed": c.seed,
        "protocol": _PROTOCOL,
        "notes": {"covid": _COVID_NOTE} if "covid" in per_kb else {},
        "summary": summarise(per_kb, prompts, c.target_rate),
        "kbs": per_kb,
        "wall_s": round(time.perf_counter() - t0, 1),
    }
    write_report(c.json_out, report)
    return report


def summarise(
    per_kb: Mapping[str, Mapping[str, Mapping[str, Any]]],
    prompts: Sequence[str],
    target_rate: float = TARGET_RATE,
) -> dict[str, Any]:
    """The figures over every KB: the lowest rate and where, the KBs below the target,
    and the prompts missed by more than one KB (with the KBs that missed them)."""
    rates = {
        f"{b}/{k}": row["flagged_ood_rate"] for b, kbs in per_kb.items() for k, row in kbs.items()
    }
    if not rates:
        raise DataError("no KB was studied")
    missed_by: dict[str, list[str]] = {}
    for b, kbs in per_kb.items():
        for k, row in kbs.items():
            for miss in row["misses"]:
                missed_by.setdefault(miss["text"], []).append(f"{b}/{k}")
    lowest = min(rates, key=lambda k: rates[k])
    n_missed = sum(row["n_missed"] for kbs in per_kb.values() for row in kbs.values())
    return {
        "target": target_rate,
        "min_rate": rates[lowest],
        "min_kb": lowest,
        "mean_rate": float(np.mean(list(rates.values()))),
        "kbs_below_target": sorted(k for k, r in rates.items() if r < target_rate),
        "all_kbs_meet_target": all(r >= target_rate for r in rates.values()),
        "n_kbs": len(rates),
        "n_prompts": len(prompts),
        "pooled_flagged_rate": 1.0 - n_missed / (len(rates) * len(prompts)),
        "rates": rates,
        # among the misses each KB lists (at most max_misses per KB)
        "listed_misses_in_several_kbs": sorted(
            ({"text": t, "kbs": kbs} for t, kbs in missed_by.items() if len(kbs) > 1),
            key=lambda r: (-len(r["kbs"]), r["text"]),
        ),
    }
