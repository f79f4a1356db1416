"""``sidecar eval --center-languages``: each fold's means come from its training texts
alone, in the benchmark's languages, and its judged queries are centred by them."""

from __future__ import annotations

import zlib
from collections.abc import Sequence

import numpy as np

from sidecar.evaluation import KBTask, evaluate_benchmark
from sidecar.evaluation._centering import centre_fold
from sidecar.scoring import MIN_LANGUAGE_TEXTS, DenyTopics


def _unit(X: np.ndarray) -> np.ndarray:
    return (X / np.linalg.norm(X, axis=1, keepdims=True)).astype(np.float32)


def _task(language: str | None, kb_language: str | None) -> KBTask:
    return KBTask("kb", ("d",), (), (), ("q",), ("o",), language=language, kb_language=kb_language)


def test_the_means_are_the_training_texts_and_judged_queries_meet_them() -> None:
    rng = np.random.default_rng(0)
    n = MIN_LANGUAGE_TEXTS
    kb, idt, oodt = (_unit(rng.normal(size=(n, 8)) + 1.0) for _ in range(3))
    judged = _unit(rng.normal(size=(5, 8)) - 3.0)  # far from the training texts
    deny = DenyTopics(("harm",), _unit(rng.normal(size=(1, 8))))
    # cross-lingual: KB and training in English, judged queries in Italian
    fold = centre_fold(_task("it", "en"), kb, idt, oodt, deny)
    train = np.vstack([kb, idt, oodt])
    np.testing.assert_allclose(fold.centering.global_mean, train.mean(axis=0), atol=1e-6)
    assert fold.centering.languages == ("en",)
    assert fold.centering.counts == {"en": 3 * n, "*": 3 * n}
    np.testing.assert_allclose(fold.kb, _unit(kb - train.mean(axis=0)), atol=1e-6)
    # Italian has no training text: the global mean (here the English one), never the
    # judged queries' own
    np.testing.assert_allclose(fold.judged(judged), _unit(judged - train.mean(axis=0)), atol=1e-6)
    assert fold.deny is not None and fold.deny.texts == ("harm",)
    np.testing.assert_allclose(
        fold.deny.embeddings, _unit(deny.embeddings - train.mean(axis=0)), atol=1e-6
    )
    # no language known (the English benchmarks): one global mean for everything
    plain = centre_fold(_task(None, None), kb, idt, None, None)
    assert plain.centering.languages == () and plain.ood_train is None
    np.testing.assert_allclose(
        plain.centering.global_mean, np.vstack([kb, idt]).mean(axis=0), atol=1e-6
    )


def _embed(texts: Sequence[str]) -> np.ndarray:
    """Two topics, a shared language offset along the last axis."""
    rows = []
    for t in texts:
        r = np.random.default_rng(zlib.crc32(t.encode())).normal(scale=0.7, size=8)
        r[0 if t.startswith("in") else 1] += 1.5
        r[7] += 2.0
        rows.append(r)
    return _unit(np.array(rows))


def test_a_centred_evaluation_runs_every_fold_and_says_so() -> None:
    task = KBTask(
        "kb",
        tuple(f"in doc {i}" for i in range(20)),
        (),
        (),
        tuple(f"in q {i}" for i in range(30)),
        tuple(f"out q {i}" for i in range(30)),
        cross_fit=3,
        language="en",
    )
    kw = dict(encoder={"name": "fake", "dim": 8}, detectors=["max_cosine"], protocol=False)
    kw.update(target_frr=0.2, fold_grouping="random", progress=False)
    centred = evaluate_benchmark("toy", "dev", [task], _embed, center_languages=True, **kw)
    plain = evaluate_benchmark("toy", "dev", [task], _embed, **kw)
    assert centred["center_languages"] is True and plain["center_languages"] is False
    row, base = centred["kbs"]["kb"]["max_cosine"], plain["kbs"]["kb"]["max_cosine"]
    assert row["n_id"] == base["n_id"] == 30 and row["n_ood"] == 30
    # the geometry changed: max-cosine's scores are not those of the raw embeddings
    assert 0.5 < base["auroc"] < 1.0 and row["auroc"] != base["auroc"]
