"""Benchmark loaders (CLINC150, StackExchange, COVID) with the file layouts of ``shared/data``.

Each loader returns a list of :class:`KBTask`: one knowledge base with its training texts
(KB documents, labelled ID and OOD training queries) and its evaluation queries. A missing
file raises :class:`~sidecar.errors.DataError` naming it, so ``--split test`` on a machine
without the test files says exactly what to add; so does a file that is not UTF-8 or whose
JSON has another shape than the loader relies on.
"""

from __future__ import annotations

import logging
import random
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sidecar.errors import ConfigError, DataError
from sidecar.evaluation._readers import (
    read_csv_column,
    read_csv_rows,
    read_domains,
    read_lines,
    read_pairs,
)

log = logging.getLogger(__name__)

_WORDS = re.compile(r"\w+")

STACKEXCHANGE_SITES = (
    "history",
    "crypto",
    "chess",
    "cooking",
    "astronomy",
    "fitness",
    "anime",
    "literature",
)
SPLITS = ("dev", "test")


@dataclass(frozen=True)
class KBTask:
    """One KB of a benchmark.

    ``id_eval`` / ``ood_eval`` are never used for fitting, search or calibration, and no
    training text equals an evaluation text (compared lower-cased, punctuation and spacing
    ignored). When ``cross_fit`` > 1 the benchmark has no separate training queries: the
    harness splits the evaluation queries into that many seeded folds, whole groups at a
    time (``id_eval_groups``, plus near-duplicates), and scores each fold with a model
    trained on the other folds (plus ``id_train`` / ``ood_train``), so no query is scored
    by a model that saw it or a paraphrase of it.
    """

    name: str
    kb_texts: tuple[str, ...]
    id_train: tuple[str, ...]
    ood_train: tuple[str, ...]
    id_eval: tuple[str, ...]
    ood_eval: tuple[str, ...]
    cross_fit: int = 0
    # Cross-fitting keeps each group of evaluation queries in one fold (e.g. a question and
    # its paraphrases), so that no query is scored by a model trained on its paraphrase.
    id_eval_groups: tuple[int, ...] | None = None
    # The same for the ID training queries: the training split keeps each group in one of
    # fit / validation / calibration, so calibration queries are as new as judged ones.
    id_train_groups: tuple[int, ...] | None = None
    # Cross-lingual cross-fitting: the evaluation queries in the language the model is
    # trained in (parallel to id_eval / ood_eval). A fold trains and calibrates on these
    # and judges the originals; None: it trains on the originals.
    id_eval_train: tuple[str, ...] | None = None
    ood_eval_train: tuple[str, ...] | None = None
    # False when the OOD evaluation queries are of a family held out of training (the
    # unseen-OOD protocol): cross-fitting then trains on the other folds' ID queries only.
    ood_eval_trains: bool = True
    # The judged queries' language and the KB's and training texts' (None: the same),
    # ISO 639-1, where the benchmark knows them (xsid, sib200): language centring takes
    # its means by them. None: not known (every text loses the global mean).
    language: str | None = None
    kb_language: str | None = None


def _dedupe(texts: Sequence[str], exclude: set[str] | None = None) -> list[str]:
    seen = set(exclude or ())
    out = []
    for t in texts:
        if t not in seen:
            seen.add(t)
            out.append(t)
    return out


def norm_text(text: str) -> str:
    """The comparison key of a text: lower-cased, punctuation and spacing ignored."""
    return " ".join(_WORDS.findall(text.lower()))


def _without(texts: Sequence[str], held_out: Sequence[str]) -> list[str]:
    """``texts`` minus any that equals a held-out (evaluation) text after :func:`norm_text`."""
    keys = {norm_text(t) for t in held_out}
    return [t for t in texts if norm_text(t) not in keys]


def _split_kb(texts: Sequence[str], kb_fraction: float, seed: int) -> tuple[list[str], list[str]]:
    """Split distinct texts into (KB documents, ID training queries), seeded.

    No text is both: a query that equals a KB document after :func:`norm_text` (the same
    utterance in other case or punctuation) is dropped rather than moved, so the seeded
    split of every other text stays where it was.
    """
    uniq = _dedupe(texts)
    random.Random(seed).shuffle(uniq)
    n_kb = round(len(uniq) * kb_fraction)
    kb = uniq[:n_kb]
    return sorted(kb), sorted(_without(uniq[n_kb:], kb))


def _check_split(split: str) -> None:
    if split not in SPLITS:
        raise ConfigError(f"split must be one of {SPLITS}, not {split!r}")


def load_clinc150(
    data_dir: str | Path, split: str = "dev", *, kb_fraction: float = 0.5, seed: int = 0
) -> list[KBTask]:
    """Each of the 10 CLINC150 domains as a KB (``clinc150/data_full.json``, ``domains.json``).

    KB documents and ID training queries are a seeded split of the domain's ``train``
    utterances; OOD training queries are the other domains' ``train`` plus ``oos_train``.
    Evaluation: ``val`` / ``oos_val`` (dev) or ``test`` / ``oos_test`` (test).
    """
    _check_split(split)
    root = Path(data_dir) / "clinc150"
    eval_key, oos_key = ("val", "oos_val") if split == "dev" else ("test", "oos_test")
    data = read_pairs(
        root / "data_full.json",
        ("train", "oos_train", eval_key, oos_key),
        why=f" (needed for --split {split})",
    )
    domains = read_domains(root / "domains.json")
    intent_domain = {intent: d for d, intents in domains.items() for intent in intents}
    # Every evaluation utterance is ID for one KB and OOD for the others: none may train.
    held_out = {norm_text(t) for t, _ in data[eval_key]} | {norm_text(t) for t, _ in data[oos_key]}
    train = [(t, i) for t, i in data["train"] if norm_text(t) not in held_out]
    tasks = []
    for domain in domains:
        in_train = [t for t, i in train if intent_domain.get(i) == domain]
        other_train = [t for t, i in train if intent_domain.get(i) != domain]
        kb, id_train = _split_kb(in_train, kb_fraction, seed)
        id_eval = [t for t, i in data[eval_key] if intent_domain.get(i) == domain]
        ood_eval = [t for t, i in data[eval_key] if intent_domain.get(i) != domain]
        ood_eval += [t for t, _ in data[oos_key]]
        ood_train = other_train + [t for t, _ in data["oos_train"] if norm_text(t) not in held_out]
        tasks.append(
            KBTask(
                domain,
                tuple(kb),
                tuple(id_train),
                tuple(_dedupe(ood_train)),
                tuple(id_eval),
                tuple(ood_eval),
            )
        )
    return tasks


def _cap(texts: list[str], cap: int | None, seed: int) -> list[str]:
    """A seeded random subset of at most ``cap`` texts, in file order (all when None)."""
    if cap is None or len(texts) <= cap:
        return texts
    keep = sorted(random.Random(seed).sample(range(len(texts)), cap))
    return [texts[i] for i in keep]


def load_stackexchange(
    data_dir: str | Path,
    split: str = "dev",
    *,
    kb_fraction: float = 0.5,
    seed: int = 0,
    sites: Sequence[str] = STACKEXCHANGE_SITES,
    max_train_per_kb: int | None = None,
    max_eval_per_kb: int | None = None,
) -> list[KBTask]:
    """Each StackExchange site as a KB (``stackexchange_tweac/{train,dev,test}/<site>.txt``).

    KB documents and ID training queries are a seeded split of the site's ``train`` titles;
    the other sites' ``train`` titles are OOD training queries. Evaluation: the site's
    ``dev`` (or ``test``) titles are ID, the other sites' are OOD. ``max_train_per_kb`` /
    ``max_eval_per_kb`` take a seeded subset of each site's titles (None: all).
    """
    _check_split(split)
    root = Path(data_dir) / "stackexchange_tweac"

    def site_file(part: str, site: str) -> Path:
        return root / part / f"{site}.stackexchange.com.txt"

    absent = [str(site_file(split, s)) for s in sites if not site_file(split, s).exists()]
    if split == "test" and absent:  # say every missing file at once, not the first
        raise DataError(f"missing for --split test: {'; '.join(absent)}")
    evals = {s: _cap(read_lines(site_file(split, s)), max_eval_per_kb, seed) for s in sites}
    # A site's evaluation titles are ID for it and OOD for the others: none may train.
    held_out = [t for titles in evals.values() for t in titles]
    train = {
        s: _cap(_without(read_lines(site_file("train", s)), held_out), max_train_per_kb, seed)
        for s in sites
    }
    tasks = []
    for site in sites:
        kb, id_train = _split_kb(train[site], kb_fraction, seed)
        ood_train = [t for s in sites if s != site for t in train[s]]
        ood_eval = [t for s in sites if s != site for t in evals[s]]
        tasks.append(
            KBTask(
                site,
                tuple(kb),
                tuple(id_train),
                tuple(_dedupe(ood_train)),
                tuple(evals[site]),
                tuple(ood_eval),
            )
        )
    return tasks


def load_covid(data_dir: str | Path, split: str = "dev", *, folds: int = 5) -> list[KBTask]:
    """The COVID-19 FAQ as one KB (answers of ``covid/deepset_faq_covidbert.csv``).

    dev: ID = the FAQ questions and the ``question_2`` of similar pairs; OOD = CLINC150
    ``oos_val`` and AdvBench ``goal``. There are no separate training queries, so the
    harness cross-fits over ``folds`` folds; CLINC150 ``oos_train`` adds OOD training data
    (the 250 of ``data_oos_plus.json`` where that file is present, else the 100 of
    ``data_full.json``).
    test: ID = COVID-Q ``Question``; OOD = CLINC150 ``oos_test`` and JailbreakHub
    ``question``; the dev queries above serve as training queries.
    """
    _check_split(split)
    root = Path(data_dir)
    faq = root / "covid" / "deepset_faq_covidbert.csv"
    kb = _dedupe(read_csv_column(faq, "answer"))
    similar = root / "covid" / "deepset_eval_question_similarity_en.csv"
    pairs = read_csv_rows(similar, ("question_1", "question_2"), where=_is_similar)
    paraphrased = [q2 for _, q2 in pairs if q2]
    dev_id = _dedupe(read_csv_column(faq, "question") + paraphrased)
    # One group per FAQ question and its paraphrases (a paraphrase joins the group of the
    # question it rephrases), so cross-fitting never splits them over folds.
    group = {norm_text(q): g for g, q in enumerate(dev_id)}
    for q1, q2 in pairs:
        a, b = group.get(norm_text(q1)), group.get(norm_text(q2))
        if q2 and a is not None and b is not None and a != b:
            # one text may paraphrase two questions: join the groups, transitively
            group = {t: (a if g == b else g) for t, g in group.items()}
    full = root / "clinc150" / "data_full.json"
    plus = root / "clinc150" / "data_oos_plus.json"
    # oos_test only for --split test, where its absence is reported with the other files
    needed = ("oos_val",) if plus.is_file() else ("oos_val", "oos_train")
    clinc = read_pairs(full, needed, optional=("oos_train", "oos_test"))
    dev_ood = _dedupe(
        [t for t, _ in clinc["oos_val"]]
        + read_csv_column(root / "adversarial" / "advbench_harmful_behaviors.csv", "goal")
    )
    # CLINC150's larger out-of-scope training set, where present: the KB has no training
    # queries of its own, and the OOD side gains most from more of them.
    oos_pairs = read_pairs(plus, ("oos_train",)) if plus.is_file() else clinc
    oos_train = [t for t, _ in oos_pairs["oos_train"]]
    if split == "dev":
        return [
            KBTask(
                "covid",
                tuple(kb),
                (),
                tuple(_dedupe(_without(oos_train, dev_ood))),
                tuple(dev_id),
                tuple(dev_ood),
                cross_fit=folds,
                id_eval_groups=tuple(group[norm_text(q)] for q in dev_id),
            )
        ]
    covidq = root / "covid" / "covidq_final_master_dataset.csv"
    jailbreak = root / "adversarial" / "jailbreakhub_forbidden_question_set.csv"
    missing = [str(p) for p in (covidq, jailbreak) if not p.is_file()]
    if "oos_test" not in clinc:
        missing.append(f"the 'oos_test' key of {full}")
    if missing:
        raise DataError(f"missing for --split test: {'; '.join(missing)}")
    test_id = read_csv_column(covidq, "Question")
    test_ood = [t for t, _ in clinc["oos_test"]] + read_csv_column(jailbreak, "question")
    held_out = test_id + test_ood
    train_id = _without(dev_id, held_out)
    return [
        KBTask(
            "covid",
            tuple(kb),
            tuple(train_id),
            tuple(_dedupe(_without(oos_train + dev_ood, held_out))),
            tuple(_dedupe(test_id)),
            tuple(_dedupe(test_ood)),
            id_train_groups=tuple(group[norm_text(q)] for q in train_id),
        )
    ]


def _is_similar(row: dict[str, str]) -> bool:
    # A short row has None, not "", in its missing columns.
    return (row.get("similar") or "").strip() == "1"


BENCHMARKS: dict[str, Callable[..., list[KBTask]]] = {
    "clinc150": load_clinc150,
    "stackexchange": load_stackexchange,
    "covid": load_covid,
}


def load_benchmark(
    name: str, data_dir: str | Path, split: str = "dev", **options: Any
) -> list[KBTask]:
    """Load benchmark ``name`` (``clinc150``, ``stackexchange`` or ``covid``).

    ``options`` go to the loader (e.g. ``max_train_per_kb`` for StackExchange).
    """
    try:
        loader = BENCHMARKS[name]
    except KeyError:
        raise ConfigError(f"unknown benchmark {name!r}; choose from {sorted(BENCHMARKS)}") from None
    if not Path(data_dir).is_dir():
        if Path(data_dir).exists():
            raise DataError(f"data directory {data_dir} is a file, not a directory")
        raise DataError(f"data directory not found: {data_dir}")
    return loader(data_dir, split, **options)
