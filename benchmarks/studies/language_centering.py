"""Does removing each language's mean embedding close the xSID language gaps? (not a test)

Language-specific centering (Libovicky et al. 2020, "On the language neutrality of
pre-trained multilingual representations"): a multilingual sentence embedding carries a
language-identity component, roughly the language's mean; subtracting it (and
re-normalising) should move a query in one language towards its translation in another.
This study runs ``sidecar eval --benchmark xsid`` (same harness, same folds, same
detectors) with every text's embedding transformed before the harness sees it:

- ``none``: the embeddings as the encoder gives them (the recorded baseline);
- ``center``: minus the mean of the text's language, re-normalised to unit length;
- ``center_top1``: as ``center``, then the language's first principal direction removed
  too ("all but the top", Mu and Viswanath 2018), re-normalised;
- ``shift``: minus the mean of the text's language plus the mean of the KB's language,
  re-normalised: a query in the KB's language is left as it is (so is every
  same-language evaluation), a query in another is moved by the difference of the two
  languages' means. The script cannot tell which evaluation a text is embedded for, so
  it shifts every text onto the KB language, the same-language evaluations' too: read
  this variant's cross-lingual figures only.

A language's mean (and direction) is taken over every utterance of its xSID valid file,
unlabelled: transductive (it includes the judged queries' own texts, without labels), so
an upper bound on what a mean estimated from training traffic could do::

    PYTHONPATH=. python benchmarks/studies/language_centering.py --data-dir ../shared/data \\
        --languages ar,it,tr,en --kb-language en --variants none,center \\
        --json /tmp/centering.json --cache-dir /work/cache
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np


def _unit(E: np.ndarray) -> np.ndarray:
    n = np.linalg.norm(E, axis=1, keepdims=True)
    return (E / np.maximum(n, 1e-12)).astype(np.float32)


def main() -> None:
    from threadpoolctl import threadpool_limits

    from sidecar.encoders import load_encoder
    from sidecar.evaluation._evaluate import evaluate_benchmark
    from sidecar.evaluation._languages import evaluate_languages
    from sidecar.evaluation._multilingual import read_xsid
    from sidecar.settings import load_settings
    from sidecar.training import EmbeddingCache

    ap = argparse.ArgumentParser()
    ap.add_argument("--data-dir", type=Path, required=True)
    ap.add_argument("--languages", default="ar,it,tr,en")
    ap.add_argument("--kb-language", default="en")
    ap.add_argument("--encoder", default="use-multilingual-v3")
    ap.add_argument("--variants", default="none,center,center_top1")
    ap.add_argument("--target-frr", type=float, default=0.05)
    ap.add_argument("--detectors", default="combined,max_cosine")
    ap.add_argument("--cache-dir", type=Path, default=None)
    ap.add_argument("--fold-grouping", default="grouped", choices=["grouped", "random"])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path, required=True)
    args = ap.parse_args()

    settings = load_settings()
    enc = load_encoder(settings, name=args.encoder, threads=1)
    cache = EmbeddingCache(enc, args.cache_dir, progress=False)
    langs = args.languages.split(",")
    every = sorted(set(langs) | ({args.kb_language} if args.kb_language else set()))
    # each text's language(s); a text written the same in two languages takes both means
    lang_of: dict[str, set[str]] = {}
    stats: dict[str, dict[str, np.ndarray]] = {}
    for lang in every:
        texts = sorted(
            {it.text for it in read_xsid(args.data_dir / "xsid" / f"{lang}.valid.conll")}
        )
        for t in texts:
            lang_of.setdefault(t, set()).add(lang)
        E = np.asarray(cache.embed(texts), dtype=np.float64)
        mu = E.mean(axis=0)
        top = np.linalg.svd(E - mu, full_matrices=False)[2][0]
        stats[lang] = {"mean": mu, "top": top}
    shared = sum(len(v) > 1 for v in lang_of.values())

    def transform(variant: str, texts: list[str], E: np.ndarray) -> np.ndarray:
        if variant == "none":
            return E
        out = np.asarray(E, dtype=np.float64).copy()
        for i, t in enumerate(texts):
            ls = sorted(lang_of.get(t, ()))
            if not ls:
                raise SystemExit(f"no language for {t!r}")
            mu = np.mean([stats[x]["mean"] for x in ls], axis=0)
            v = out[i] - mu
            if variant == "shift":
                v = v + stats[args.kb_language]["mean"]
            if variant == "center_top1":
                for x in ls:
                    u = stats[x]["top"]
                    v = v - (v @ u) * u
            out[i] = v
        return _unit(out)

    report: dict[str, Any] = {
        "encoder": enc.name,
        "languages": langs,
        "kb_language": args.kb_language,
        "target_frr": args.target_frr,
        "seed": args.seed,
        "texts_in_two_languages": int(shared),
        "fold_grouping": args.fold_grouping,
        "variants": {},
    }
    # Near-duplicate groups (and so the folds) from the first variant's embeddings, reused
    # by the others: centering lowers cosines, and fewer near-duplicates joined would
    # change the folds, not just the geometry.
    group_cache: dict[Any, Any] = {}
    for variant in args.variants.split(","):
        t0 = time.perf_counter()

        def embed(texts: Any, _v: str = variant, **kw: Any) -> np.ndarray:
            texts = list(texts)
            return transform(_v, texts, np.asarray(cache.embed(texts, **kw)))

        def evaluate(benchmark: str, split: str, tasks: Any, _e: Any = embed) -> Any:
            return evaluate_benchmark(
                benchmark,
                split,
                tasks,
                _e,
                encoder={"name": enc.name, "dim": enc.dim},
                detectors=tuple(args.detectors.split(",")),
                seed=args.seed,
                target_frr=args.target_frr,
                progress=False,
                fold_grouping=args.fold_grouping,
                protocol=False,
                group_cache=group_cache,
            )

        with threadpool_limits(limits=1):
            rep = evaluate_languages(
                "xsid",
                args.data_dir,
                "dev",
                language=args.languages,
                kb_language=args.kb_language or None,
                encoder={"name": enc.name, "dim": enc.dim},
                encoder_languages=None,
                evaluate=evaluate,
                seed=args.seed,
                progress=False,
            )
        out = {
            "same_language": {k: v["summary"] for k, v in rep["languages"].items()},
            "crosslingual": {
                k: {"summary": v["summary"], "auroc_gap": v["auroc_gap"]}
                for k, v in (rep["crosslingual"] or {}).items()
            },
            "wall_s": round(time.perf_counter() - t0, 1),
        }
        report["variants"][variant] = out
        args.json.write_text(json.dumps(report, indent=2) + "\n")
        for lang in langs:
            same = out["same_language"][lang]["combined"]["auroc"]
            cross = out["crosslingual"].get(lang, {}).get("summary", {}).get("combined", {})
            print(
                f"{variant:12s} {lang}: same {same:.4f}"
                + (f"  kb-{args.kb_language} {cross['auroc']:.4f}" if cross else ""),
                flush=True,
            )


if __name__ == "__main__":
    main()
