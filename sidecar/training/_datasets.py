"""Benchmark loaders (CLINC150, StackExchange, COVID) with the file layouts of ``shared/data``.

Each loader returns a list of :class:`KBTask`: one knowledge base with its training texts
(KB documents, labelled ID and OOD training queries) and its evaluation queries. A missing
file raises :class:`~sidecar.errors.DataError` naming it, so ``--split test`` on a machine
without the test files says exactly what to add; so does a file that is not UTF-8 or whose
JSON has another shape than the loader relies on.
"""

from __future__ import annotations

import csv
import json
import logging
import random
import re
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sidecar.errors import ConfigError, DataError

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


def _need(path: Path) -> Path:
    if not path.is_file():
        raise DataError(f"missing benchmark file: {path}")
    return path


@contextmanager
def _reading(path: Path) -> Iterator[None]:
    """Turn a decoding or CSV failure while reading ``path`` into a DataError naming it."""
    try:
        yield
    except UnicodeDecodeError as exc:
        # The offset is within the decoder's chunk, not the file: name the reason only.
        raise DataError(f"{path}: not UTF-8 text ({exc.reason})") from exc
    except csv.Error as exc:
        raise DataError(f"{path}: not a readable CSV file ({exc})") from exc


def _read_text(path: Path) -> str:
    with _reading(path):
        return _need(path).read_text(encoding="utf-8")


def _read_json(path: Path) -> Any:
    text = _read_text(path)
    try:
        return json.loads(text)
    except ValueError as exc:
        raise DataError(f"{path} is not valid JSON: {exc}") from exc


def _read_lines(path: Path) -> list[str]:
    text = _read_text(path)
    return [ln.strip() for ln in text.splitlines() if ln.strip()]


def _is_pair(row: Any) -> bool:
    return isinstance(row, list) and len(row) == 2 and all(isinstance(x, str) for x in row)


def _read_pairs(
    path: Path, keys: Sequence[str], *, optional: Sequence[str] = (), why: str = ""
) -> dict[str, list[tuple[str, str]]]:
    """The ``keys`` (and those of ``optional`` present) of a CLINC150 ``data_*.json``.

    Each is a list of ``[text, intent]`` pairs of strings; anything else raises DataError
    naming the file, the key and the first bad entry, before any loader code trips on it.
    """
    data = _read_json(path)
    if not isinstance(data, dict):
        raise DataError(f"{path}: expected an object of split -> list of [text, intent] pairs")
    for key in keys:
        if key not in data:
            raise DataError(f"{path} has no {key!r} key{why}")
    out = {}
    for key in [*keys, *(k for k in optional if k in data)]:
        rows = data[key]
        if not isinstance(rows, list):
            raise DataError(f"{path}: {key!r} must be a list of [text, intent] pairs")
        bad = next((n for n, row in enumerate(rows) if not _is_pair(row)), None)
        if bad is not None:
            raise DataError(
                f"{path}: {key!r}[{bad}] is {json.dumps(rows[bad])[:60]}, "
                "not a [text, intent] pair of strings"
            )
        out[key] = [(t, i) for t, i in rows]
    return out


def _read_domains(path: Path) -> dict[str, list[str]]:
    """CLINC150 ``domains.json``: an object of domain -> list of intent names."""
    domains = _read_json(path)
    if not isinstance(domains, dict) or not all(
        isinstance(v, list) and all(isinstance(i, str) for i in v) for v in domains.values()
    ):
        raise DataError(f"{path}: expected an object of domain -> list of intent names")
    return domains


def _read_csv_column(
    path: Path, column: str, where: Callable[[dict[str, str]], bool] | None = None
) -> list[str]:
    with _need(path).open(newline="", encoding="utf-8") as fh, _reading(path):
        reader = csv.DictReader(fh)
        if reader.fieldnames is None or column not in reader.fieldnames:
            raise DataError(f"{path} has no column {column!r} (columns: {reader.fieldnames})")
        return [
            row[column].strip()
            for row in reader
            if (row.get(column) or "").strip() and (where is None or where(row))
        ]


def _read_csv_rows(
    path: Path, columns: Sequence[str], where: Callable[[dict[str, str]], bool] | None = None
) -> list[tuple[str, ...]]:
    """The stripped ``columns`` of every row (``where`` it holds), in file order."""
    with _need(path).open(newline="", encoding="utf-8") as fh, _reading(path):
        reader = csv.DictReader(fh)
        missing = [c for c in columns if c not in (reader.fieldnames or ())]
        if missing:
            raise DataError(f"{path} has no column {missing} (columns: {reader.fieldnames})")
        return [
            tuple((row.get(c) or "").strip() for c in columns)
            for row in reader
            if where is None or where(row)
        ]


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
    """Split distinct texts into (KB documents, ID training queries), seeded."""
    uniq = _dedupe(texts)
    random.Random(seed).shuffle(uniq)
    n_kb = round(len(uniq) * kb_fraction)
    return sorted(uniq[:n_kb]), sorted(uniq[n_kb:])


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
    data = _read_pairs(
        root / "data_full.json",
        ("train", "oos_train", eval_key, oos_key),
        why=f" (needed for --split {split})",
    )
    domains = _read_domains(root / "domains.json")
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

    evals = {s: _cap(_read_lines(site_file(split, s)), max_eval_per_kb, seed) for s in sites}
    # A site's evaluation titles are ID for it and OOD for the others: none may train.
    held_out = [t for titles in evals.values() for t in titles]
    train = {
        s: _cap(_without(_read_lines(site_file("train", s)), held_out), max_train_per_kb, seed)
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
    kb = _dedupe(_read_csv_column(faq, "answer"))
    similar = root / "covid" / "deepset_eval_question_similarity_en.csv"
    pairs = _read_csv_rows(similar, ("question_1", "question_2"), where=_is_similar)
    paraphrased = [q2 for _, q2 in pairs if q2]
    dev_id = _dedupe(_read_csv_column(faq, "question") + paraphrased)
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
    clinc = _read_pairs(full, needed, optional=("oos_train", "oos_test"))
    dev_ood = _dedupe(
        [t for t, _ in clinc["oos_val"]]
        + _read_csv_column(root / "adversarial" / "advbench_harmful_behaviors.csv", "goal")
    )
    # CLINC150's larger out-of-scope training set, where present: the KB has no training
    # queries of its own, and the OOD side gains most from more of them.
    oos_pairs = _read_pairs(plus, ("oos_train",)) if plus.is_file() else clinc
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
    test_id = _read_csv_column(covidq, "Question")
    test_ood = [t for t, _ in clinc["oos_test"]] + _read_csv_column(jailbreak, "question")
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
        raise DataError(f"data directory not found: {data_dir}")
    return loader(data_dir, split, **options)
