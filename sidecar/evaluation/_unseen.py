"""The unseen-OOD protocol: whole OOD families held out of training, one at a time.

The standard protocol trains on OOD queries of the same families it evaluates on. A gate
in front of a RAG service meets OOD of kinds nobody collected, so this protocol removes
one OOD family from every training and calibration set and judges the model on that
family alone:

* ``clinc150``: every KB holds out CLINC's out-of-scope queries, and (one at a time) the
  next domain of ``domains.json`` (each domain is held out by exactly one KB);
* ``stackexchange``: every site holds out the next site of the benchmark's list;
* ``covid``: the KB holds out AdvBench, then CLINC out-of-scope. Besides, an ID-phrasing
  shift: trained and calibrated on the FAQ's own questions, judged on the differently
  worded paraphrases of the similarity set (OOD families as in training).

A held-out family is judged on all of its queries the benchmark has (its evaluation and
its training queries: none of them trains here). Training queries equal to one of them
(:func:`~._datasets.norm_text`) are removed, and so are training queries that nearly copy
one (cosine >= ``NEAR_DUPLICATE_COS``, :func:`drop_near_copies`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from sidecar.errors import ConfigError
from sidecar.evaluation._datasets import (
    STACKEXCHANGE_SITES,
    KBTask,
    _dedupe,
    _is_similar,
    _without,
    norm_text,
)
from sidecar.evaluation._readers import read_csv_column, read_csv_rows, read_domains, read_pairs
from sidecar.training import NEAR_DUPLICATE_COS

OOD_PROTOCOLS = ("standard", "unseen-ood")
# What a holdout changes: an OOD family out of training, or the wording of the ID queries.
OOD_FAMILY, ID_PHRASING = "ood_family", "id_phrasing"
# The KB-only detectors the default must match under this protocol (they never see OOD).
TRAINING_FREE = ("max_cosine", "knn", "residual")

Embed = Callable[[Sequence[str]], np.ndarray]


@dataclass(frozen=True)
class Holdout:
    """One evaluation of the protocol: ``task`` with ``family`` held out of training.

    ``group`` names the kind of family (``"out_of_scope"``, ``"sibling_domain"``, ...)
    that the report averages over; ``kind`` is :data:`OOD_FAMILY` or :data:`ID_PHRASING`.
    """

    task: KBTask
    family: str
    group: str
    kind: str = OOD_FAMILY


def _clinc_families(data_dir: Path) -> tuple[dict[str, str], list[str]]:
    """CLINC150 utterance -> domain (``"out_of_scope"`` for oos), and the domains in order."""
    root = data_dir / "clinc150"
    data = read_pairs(
        root / "data_full.json",
        ("train", "oos_train", "oos_val"),
        optional=("val", "test", "oos_test"),
    )
    domains = read_domains(root / "domains.json")
    intent_domain = {i: d for d, intents in domains.items() for i in intents}
    fam: dict[str, str] = {}
    for key, rows in data.items():
        for text, intent in rows:
            fam[norm_text(text)] = (
                "out_of_scope" if key.startswith("oos") else intent_domain.get(intent, "")
            )
    return fam, list(domains)


def _next(names: Sequence[str], name: str) -> str:
    return names[(list(names).index(name) + 1) % len(names)]


def _stackexchange_families(data_dir: Path, sites: Sequence[str]) -> dict[str, str]:
    """StackExchange title -> site, over the train / dev / test files present."""
    from sidecar.evaluation._readers import read_lines

    root = data_dir / "stackexchange_tweac"
    fam: dict[str, str] = {}
    for site in sites:
        for part in ("train", "dev", "test"):
            path = root / part / f"{site}.stackexchange.com.txt"
            if path.is_file():
                for text in read_lines(path):
                    fam.setdefault(norm_text(text), site)
    return fam


def _covid_families(data_dir: Path) -> dict[str, str]:
    """COVID benchmark OOD query -> ``"advbench"`` or ``"clinc_out_of_scope"``."""
    fam = {
        norm_text(t): "advbench"
        for t in read_csv_column(
            data_dir / "adversarial" / "advbench_harmful_behaviors.csv", "goal"
        )
    }
    for name in ("data_full.json", "data_oos_plus.json"):
        path = data_dir / "clinc150" / name
        if path.is_file():
            rows = read_pairs(path, (), optional=("oos_train", "oos_val", "oos_test"))
            for part in rows.values():
                fam.update({norm_text(t): "clinc_out_of_scope" for t, _ in part})
    return fam


def holdout_task(task: KBTask, family: str, family_of: Mapping[str, str]) -> KBTask:
    """``task`` with the OOD family ``family`` out of training and alone in evaluation.

    ``family_of`` maps :func:`norm_text` keys to family names (texts it lacks belong to
    no held-out family). The family is judged on all of its queries, evaluation and
    training; on a cross-fitted task the other families' evaluation queries become plain
    training queries (as the folds used them), and no fold trains on the held-out ones.
    """

    def of(text: str) -> str | None:
        return family_of.get(norm_text(text))

    held = _dedupe([t for t in (*task.ood_eval, *task.ood_train) if of(t) == family])
    if not held:
        raise ConfigError(f"KB {task.name!r} has no OOD query of family {family!r} to hold out")
    train = [t for t in task.ood_train if of(t) != family]
    if task.cross_fit > 1:
        train += [t for t in task.ood_eval if of(t) != family]
    train = _dedupe(_without(train, held))
    if not train:
        raise ConfigError(f"holding out {family!r} leaves KB {task.name!r} no OOD training query")
    return dataclasses.replace(
        task, ood_train=tuple(train), ood_eval=tuple(held), ood_eval_trains=False
    )


def covid_phrasing_task(task: KBTask, data_dir: Path) -> KBTask:
    """The covid KB trained and calibrated on the FAQ's own questions and judged on the
    paraphrases of the similarity set (another wording of the same questions).

    OOD: trained on CLINC out-of-scope ``oos_train`` and AdvBench, judged on CLINC
    ``oos_val`` (a family seen in training: only the ID wording shifts).
    """
    faq = read_csv_column(data_dir / "covid" / "deepset_faq_covidbert.csv", "question")
    pairs = read_csv_rows(
        data_dir / "covid" / "deepset_eval_question_similarity_en.csv",
        ("question_1", "question_2"),
        where=_is_similar,
    )
    questions = _dedupe(faq)
    paraphrases = _dedupe(_without([q2 for _, q2 in pairs if q2], questions))
    clinc = read_pairs(data_dir / "clinc150" / "data_full.json", ("oos_val",))
    oos_val = [t for t, _ in clinc["oos_val"]]
    ood_train = _dedupe(_without([*task.ood_train, *task.ood_eval], oos_val))
    return KBTask(
        task.name,
        task.kb_texts,
        tuple(questions),
        tuple(ood_train),
        tuple(paraphrases),
        tuple(_dedupe(oos_val)),
    )


def unseen_holdouts(
    benchmark: str, tasks: Sequence[KBTask], data_dir: str | Path, split: str = "dev"
) -> list[Holdout]:
    """The protocol's holdouts for ``tasks`` (a benchmark's KBs, all or some)."""
    root = Path(data_dir)
    out: list[Holdout] = []
    if benchmark == "clinc150":
        fam, domains = _clinc_families(root)
        for t in tasks:
            out.append(
                Holdout(holdout_task(t, "out_of_scope", fam), "out_of_scope", "out_of_scope")
            )
            sibling = _next(domains, t.name)
            out.append(Holdout(holdout_task(t, sibling, fam), sibling, "sibling_domain"))
    elif benchmark == "stackexchange":
        fam = _stackexchange_families(root, STACKEXCHANGE_SITES)
        for t in tasks:
            sibling = _next(STACKEXCHANGE_SITES, t.name)
            out.append(Holdout(holdout_task(t, sibling, fam), sibling, "sibling_site"))
    elif benchmark == "covid":
        fam = _covid_families(root)
        for t in tasks:
            for family in ("advbench", "clinc_out_of_scope"):
                out.append(Holdout(holdout_task(t, family, fam), family, family))
            if split == "dev":
                phrasing = covid_phrasing_task(t, root)
                out.append(Holdout(phrasing, "faq_paraphrases", "faq_paraphrases", ID_PHRASING))
    else:
        raise ConfigError(f"no unseen-OOD holdouts for benchmark {benchmark!r}")
    return out


def drop_near_copies(
    task: KBTask, embed: Embed, cos: float = NEAR_DUPLICATE_COS
) -> tuple[KBTask, int]:
    """``task`` without the OOD training queries that nearly copy a held-out one (cosine
    >= ``cos``), and how many were dropped. A task whose OOD evaluation queries train
    (``ood_eval_trains``) is returned as it is."""
    if task.ood_eval_trains or not task.ood_train:
        return task, 0
    T, H = _unit(embed(task.ood_train)), _unit(embed(task.ood_eval))
    near = np.zeros(len(T), dtype=bool)
    step = max(1, (1 << 24) // max(len(H), 1))
    for lo in range(0, len(T), step):
        near[lo : lo + step] = (T[lo : lo + step] @ H.T).max(axis=1) >= cos
    if not near.any():
        return task, 0
    kept = tuple(t for t, n in zip(task.ood_train, near, strict=True) if not n)
    if not kept:
        raise ConfigError(
            f"every OOD training query of KB {task.name!r} nearly copies a held-out one"
        )
    return dataclasses.replace(task, ood_train=kept), int(near.sum())


def _unit(E: np.ndarray) -> np.ndarray:
    E = np.asarray(E, dtype=np.float32)
    return E / np.maximum(np.linalg.norm(E, axis=1, keepdims=True), 1e-12)
