"""The multilingual benchmarks: xSID 0.7 (intents, 8 domains) and SIB-200 (7 topics).

Both are parallel: the same item, under the same id, in every language. KB documents,
training queries and evaluation queries are chosen by item id with a seeded split, never
by text, so a KB written in one language (``kb_language``) and queries written in
another are the same split of the same items: no evaluation query is the translation of
a KB document or of a query the model was trained on.

* xSID (``xsid/<lang>.valid.conll``, 300 utterances): each domain is a KB. A seeded share
  of each domain's utterances are its KB documents; the rest are its ID queries and every
  other domain's utterances are its OOD queries. With no training queries of their own,
  the queries are cross-fitted over ``folds`` folds (as covid is). With a KB in another
  language, the KB and every query a fold trains or calibrates on are in ``kb_language``,
  the queries it judges in ``language``. ``--split test`` judges ``<lang>.test.conll``
  with the whole valid file as KB and training queries.
* SIB-200 (``sib200/<code>/{train,dev,test}.tsv``): each topic is a KB; a seeded half of
  its ``train`` sentences are its documents, the other half its ID training queries, the
  other topics' ``train`` its OOD training queries; ``dev`` (or ``test``) is judged.
"""

from __future__ import annotations

import csv
import random
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from sidecar.errors import ConfigError, DataError
from sidecar.evaluation._datasets import SPLITS, KBTask
from sidecar.evaluation._readers import need, read_text, reading

XSID_LANGUAGES = (
    "ar", "da", "de", "de-ba", "de-muc", "de-st", "en", "gsw", "id", "it", "ja", "kk",
    "lt", "nap", "nl", "no", "sr", "tr", "zh",
)  # fmt: skip
# SIB-200's folder per language (FLORES-200 codes) for the ISO 639-1 codes used here.
SIB200_LANGUAGES = {
    "de": "deu_Latn",
    "en": "eng_Latn",
    "es": "spa_Latn",
    "fr": "fra_Latn",
    "it": "ita_Latn",
    "ko": "kor_Hang",
    "nl": "nld_Latn",
}
MULTILINGUAL_LANGUAGES: dict[str, tuple[str, ...]] = {
    "xsid": XSID_LANGUAGES,
    "sib200": tuple(SIB200_LANGUAGES),
}
# xSID's SNIPS intents and the domain each belongs to; the other intents are
# "<domain>/<action>".
_SNIPS_DOMAINS = {
    "AddToPlaylist": "music",
    "PlayMusic": "music",
    "BookRestaurant": "restaurant",
    "RateBook": "books",
    "SearchCreativeWork": "creative_work",
    "SearchScreeningEvent": "movies",
}
XSID_KB_FRACTION = 0.4
XSID_FOLDS = 5
SIB200_KB_FRACTION = 0.5
# Norwegian comes in 11 written variants per utterance; B is Bokmål, the standard one.
_NORWEGIAN_VARIANT = "B"
# A space between two characters outside ASCII: the Japanese file is tokenized.
_CJK_GAP = re.compile(r"(?<=[^\x00-\x7f]) (?=[^\x00-\x7f])")


@dataclass(frozen=True)
class Item:
    """One utterance of a parallel benchmark: its id (the same in every language), its
    label (xSID domain or SIB-200 topic) and its text."""

    id: str
    label: str
    text: str


def _check_language(benchmark: str, language: str) -> str:
    known = MULTILINGUAL_LANGUAGES[benchmark]
    code = {v: k for k, v in SIB200_LANGUAGES.items()}.get(language, language)
    if code not in known:
        raise ConfigError(f"{benchmark} has no language {language!r}; it has {list(known)}")
    return code


def xsid_domain(intent: str) -> str:
    """The domain of an xSID intent (``weather/find`` -> weather, ``PlayMusic`` -> music)."""
    return _SNIPS_DOMAINS.get(intent) or intent.split("/", 1)[0]


def read_xsid(path: Path) -> list[Item]:
    """The utterances of one xSID CoNLL file, in file order.

    A block's ``# id`` is its item id (the English file has none: the position is); the
    Norwegian file's Bokmål variant is kept; the tokenized Japanese text is joined back.
    """
    items: list[Item] = []
    for n, block in enumerate(b for b in re.split(r"\n\s*\n", read_text(path)) if b.strip()):
        meta: dict[str, str] = {}
        for line in block.splitlines():
            m = re.match(r"#\s*([\w-]+)\s*=\s?(.*)$", line)
            if m:
                meta.setdefault(m.group(1), m.group(2).strip())
        if "text" not in meta or "intent" not in meta:
            raise DataError(f"{path}: block {n + 1} has no '# text =' or '# intent =' line")
        item_id = meta.get("id", str(len(items) + 1))
        if "dialect" in meta or "/" in item_id:
            if meta.get("dialect", item_id.rsplit("/", 1)[-1]) != _NORWEGIAN_VARIANT:
                continue
            item_id = item_id.split("/", 1)[0]
        text = _CJK_GAP.sub("", meta["text"])
        items.append(Item(item_id, xsid_domain(meta["intent"]), text))
    if not items:
        raise DataError(f"{path}: no utterances")
    return items


def read_sib200(path: Path) -> list[Item]:
    """The rows of one SIB-200 TSV file (``index_id``, ``category``, ``text``)."""
    with need(path).open(newline="", encoding="utf-8") as fh, reading(path):
        reader = csv.DictReader(fh, delimiter="\t", quoting=csv.QUOTE_NONE)
        cols = ("index_id", "category", "text")
        if reader.fieldnames is None or any(c not in reader.fieldnames for c in cols):
            raise DataError(f"{path} has no columns {list(cols)} (columns: {reader.fieldnames})")
        items = [
            Item(row["index_id"].strip(), row["category"].strip(), row["text"].strip())
            for row in reader
            if (row.get("text") or "").strip()
        ]
    if not items:
        raise DataError(f"{path}: no rows")
    return items


def _kb_ids(items: Sequence[Item], fraction: float, seed: int) -> set[str]:
    """A seeded ``fraction`` of each label's item ids (at least one, never all)."""
    by_label: dict[str, list[str]] = {}
    for it in items:
        by_label.setdefault(it.label, []).append(it.id)
    chosen: set[str] = set()
    for label in sorted(by_label):
        ids = sorted(set(by_label[label]), key=_id_order)
        random.Random(f"{seed}:{label}").shuffle(ids)
        n = min(max(1, round(len(ids) * fraction)), len(ids) - 1)
        chosen.update(ids[:n])
    return chosen


def _id_order(item_id: str) -> tuple[int, str]:
    return (int(item_id), "") if item_id.isdigit() else (0, item_id)


def _aligned(query: Sequence[Item], other: Sequence[Item], what: str) -> dict[str, Item]:
    """``other`` by id, refusing ids ``query`` has and ``other`` lacks."""
    by_id = {it.id: it for it in other}
    missing = sorted({it.id for it in query} - set(by_id), key=_id_order)
    if missing:
        raise DataError(f"{what} lacks items {missing[:5]} of the query language")
    return by_id


def _texts(items: Sequence[Item]) -> tuple[str, ...]:
    return tuple(it.text for it in items)


def load_xsid(
    data_dir: str | Path,
    split: str = "dev",
    *,
    language: str = "en",
    kb_language: str | None = None,
    seed: int = 0,
    folds: int = XSID_FOLDS,
    kb_fraction: float = XSID_KB_FRACTION,
) -> list[KBTask]:
    """Each xSID domain as a KB, queries in ``language``, KB (and training) in
    ``kb_language`` (default: the same); see the module docstring."""
    if split not in SPLITS:
        raise ConfigError(f"split must be one of {SPLITS}, not {split!r}")
    lang = _check_language("xsid", language)
    kb_lang = _check_language("xsid", kb_language or lang)
    root = Path(data_dir) / "xsid"
    valid = read_xsid(root / f"{lang}.valid.conll")
    kb_valid = valid if kb_lang == lang else read_xsid(root / f"{kb_lang}.valid.conll")
    # Japanese has the first 150 utterances only: every language keeps the shared items.
    shared = {it.id for it in valid} & {it.id for it in kb_valid}
    valid = [it for it in valid if it.id in shared]
    kb_by_id = _aligned(valid, kb_valid, f"xsid {kb_lang}")
    kb_ids = _kb_ids(valid, kb_fraction, seed)
    domains = sorted({it.label for it in valid})
    if split == "test":
        test_path = root / f"{lang}.test.conll"
        if not test_path.is_file():
            raise DataError(f"missing for --split test: {test_path}")
        test = read_xsid(test_path)
        train = [kb_by_id[it.id] for it in valid]
        return [
            KBTask(
                d,
                _texts([it for it in train if it.label == d and it.id in kb_ids]),
                _texts([it for it in train if it.label == d and it.id not in kb_ids]),
                _texts([it for it in train if it.label != d]),
                _texts([it for it in test if it.label == d]),
                _texts([it for it in test if it.label != d]),
                language=lang,
                kb_language=kb_lang,
            )
            for d in domains
        ]
    tasks = []
    for d in domains:
        kb = [kb_by_id[it.id] for it in valid if it.label == d and it.id in kb_ids]
        id_eval = [it for it in valid if it.label == d and it.id not in kb_ids]
        ood_eval = [it for it in valid if it.label != d]
        cross = kb_lang != lang
        tasks.append(
            KBTask(
                d,
                _texts(kb),
                (),
                (),
                _texts(id_eval),
                _texts(ood_eval),
                cross_fit=folds,
                id_eval_train=_texts([kb_by_id[it.id] for it in id_eval]) if cross else None,
                ood_eval_train=_texts([kb_by_id[it.id] for it in ood_eval]) if cross else None,
                language=lang,
                kb_language=kb_lang,
            )
        )
    return tasks


def load_sib200(
    data_dir: str | Path,
    split: str = "dev",
    *,
    language: str = "en",
    kb_language: str | None = None,
    seed: int = 0,
    kb_fraction: float = SIB200_KB_FRACTION,
    live_fraction: float = 0.0,
) -> list[KBTask]:
    """Each SIB-200 topic as a KB, queries in ``language``, KB and training queries in
    ``kb_language`` (default: the same); see the module docstring. ``live_fraction`` of
    each topic's non-KB ``train`` items are left out of training (:func:`sib200_live`
    gives them, as live traffic to calibrate on)."""
    if split not in SPLITS:
        raise ConfigError(f"split must be one of {SPLITS}, not {split!r}")
    lang = _check_language("sib200", language)
    kb_lang = _check_language("sib200", kb_language or lang)
    root = Path(data_dir) / "sib200"
    judged = read_sib200(root / SIB200_LANGUAGES[lang] / f"{split}.tsv")
    train = read_sib200(root / SIB200_LANGUAGES[kb_lang] / "train.tsv")
    kb_ids, live = _sib200_parts(train, kb_fraction, live_fraction, seed)
    topics = sorted({it.label for it in train})
    return [
        KBTask(
            t,
            _texts([it for it in train if it.label == t and it.id in kb_ids]),
            _texts([it for it in train if it.label == t and it.id not in kb_ids | live]),
            _texts([it for it in train if it.label != t and it.id not in live]),
            _texts([it for it in judged if it.label == t]),
            _texts([it for it in judged if it.label != t]),
            language=lang,
            kb_language=kb_lang,
        )
        for t in topics
    ]


def _sib200_parts(
    train: Sequence[Item], kb_fraction: float, live_fraction: float, seed: int
) -> tuple[set[str], set[str]]:
    """The KB item ids and the live item ids (a share of the rest) of SIB-200's train."""
    kb_ids = _kb_ids(train, kb_fraction, seed)
    rest = [it for it in train if it.id not in kb_ids]
    live = _kb_ids(rest, live_fraction, seed + 1) if live_fraction > 0 else set()
    return kb_ids, live


def sib200_live(
    data_dir: str | Path,
    *,
    language: str,
    seed: int = 0,
    kb_fraction: float = SIB200_KB_FRACTION,
    live_fraction: float,
) -> dict[str, tuple[str, ...]]:
    """Per topic, the ``train`` items :func:`load_sib200` with the same ``live_fraction``
    leaves out of training, in ``language``: in-domain traffic no model was fitted on."""
    lang = _check_language("sib200", language)
    train = read_sib200(Path(data_dir) / "sib200" / SIB200_LANGUAGES[lang] / "train.tsv")
    _, live = _sib200_parts(train, kb_fraction, live_fraction, seed)
    topics = sorted({it.label for it in train})
    return {t: _texts([it for it in train if it.label == t and it.id in live]) for t in topics}


MULTILINGUAL_BENCHMARKS: dict[str, Callable[..., list[KBTask]]] = {
    "xsid": load_xsid,
    "sib200": load_sib200,
}


def load_multilingual(
    name: str,
    data_dir: str | Path,
    split: str = "dev",
    *,
    language: str,
    kb_language: str | None = None,
    seed: int = 0,
) -> list[KBTask]:
    """Load multilingual benchmark ``name`` (``xsid`` or ``sib200``) for one language."""
    try:
        loader = MULTILINGUAL_BENCHMARKS[name]
    except KeyError:
        raise ConfigError(
            f"unknown multilingual benchmark {name!r}; "
            f"choose from {sorted(MULTILINGUAL_BENCHMARKS)}"
        ) from None
    if not Path(data_dir).is_dir():
        raise DataError(f"data directory not found: {data_dir}")
    return loader(data_dir, split, language=language, kb_language=kb_language, seed=seed)


def languages_of(name: str, spec: str) -> list[str]:
    """The languages ``spec`` names for benchmark ``name``: ``all`` or a comma list."""
    known = MULTILINGUAL_LANGUAGES[name]
    if spec.strip() == "all":
        return list(known)
    langs = [_check_language(name, s.strip()) for s in spec.split(",") if s.strip()]
    if not langs:
        raise ConfigError("--language names no language")
    return list(dict.fromkeys(langs))


def language_summary(report: Mapping[str, object]) -> dict[str, dict[str, float]]:
    """The per-detector figures one language's report is judged by."""
    keys = (
        "auroc",
        "fpr_at_95tpr",
        "balanced_accuracy",
        "false_reject_rate",
        "ood_accept_rate",
    )
    mean = report["mean"]
    assert isinstance(mean, Mapping)
    return {d: {k: round(float(row[k]), 4) for k in keys if k in row} for d, row in mean.items()}
