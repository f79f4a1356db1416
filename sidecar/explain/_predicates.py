"""Predicates on an answer: what a rule explains.

A spec string names one (the CLI's ``--predicate`` and the stream's ``"predicate"``)::

    contains:Paris                 the answer contains the word(s) "Paris", in order
                                   (case, punctuation and articles set aside)
    regex:\\bParis\\b                re.search on the answer
    equals:Paris                   normalised answer == normalised reference
    similar:0.8:Paris is the capital   cosine(embed(answer), embed(reference)) >= 0.8
    judge:Is the answer a refusal?     an LLM judge (the same client) says yes
    not:<spec>                     the negation of any of the above
"""

from __future__ import annotations

import asyncio
import re
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from sidecar.errors import ConfigError

if TYPE_CHECKING:
    from sidecar.encoders import Encoder
    from sidecar.explain._client import BlackBox

_ARTICLES = re.compile(r"\b(a|an|the)\b")


class Predicate(Protocol):
    """``await predicate(answer)`` says whether the answer has the property explained."""

    @property
    def spec(self) -> str: ...

    async def __call__(self, answer: str) -> bool: ...


def normalise(text: str, *, punctuation: str = "") -> str:
    """SQuAD-style, beyond ASCII: compatible forms (NFKC: full-width letters, composed
    accents), case folded, punctuation of any script replaced by ``punctuation`` (dropped
    by default: "don’t" -> "dont", "«Paris»" -> "paris"), articles dropped, whitespace
    collapsed."""
    folded = unicodedata.normalize("NFKC", text).casefold()
    kept = "".join(punctuation if unicodedata.category(c).startswith("P") else c for c in folded)
    return " ".join(_ARTICLES.sub(" ", kept).split())


# Scripts written without spaces between words: a needle in them is matched as text.
_UNSPACED = re.compile(
    r"[\u0e00-\u0eff\u1000-\u109f\u1780-\u17ff\u3040-\u30ff\u3400-\u9fff\uf900-\ufaff]"
)


@dataclass(frozen=True)
class Contains:
    text: str

    @property
    def spec(self) -> str:
        return f"contains:{self.text}"

    async def __call__(self, answer: str) -> bool:
        # Whole words: the gold answer "no" is not in "not", "know" or "I cannot tell".
        # Punctuation separates words here ("Paris's", "Paris/Lyon", "COVID-19").
        needle = normalise(self.text, punctuation=" ")
        hay = normalise(answer, punctuation=" ")
        if _UNSPACED.search(needle):
            return needle in hay
        return f" {needle} " in f" {hay} "


@dataclass(frozen=True)
class Regex:
    pattern: str
    _compiled: re.Pattern[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        try:
            object.__setattr__(self, "_compiled", re.compile(self.pattern))
        except re.error as exc:
            raise ConfigError(f"bad regex {self.pattern!r}: {exc}") from exc

    @property
    def spec(self) -> str:
        return f"regex:{self.pattern}"

    async def __call__(self, answer: str) -> bool:
        return self._compiled.search(answer) is not None


@dataclass(frozen=True)
class Equals:
    reference: str

    @property
    def spec(self) -> str:
        return f"equals:{self.reference}"

    async def __call__(self, answer: str) -> bool:
        return normalise(answer) == normalise(self.reference)


class Similar:
    """Cosine similarity of sentence embeddings to a reference, at least ``threshold``.

    The encoder is built on first use (``encoder_factory``; by default the packaged
    all-MiniLM-L6-v2), so parsing a spec never loads a model.
    """

    def __init__(
        self,
        threshold: float,
        reference: str,
        encoder_factory: Callable[[], Encoder] | None = None,
    ) -> None:
        if not -1.0 <= threshold <= 1.0:
            raise ConfigError(f"similarity threshold must be in [-1, 1], got {threshold}")
        self.threshold = threshold
        self.reference = reference
        self._factory = encoder_factory or _default_encoder
        self._encoder: Encoder | None = None
        self._ref: Any = None

    @property
    def spec(self) -> str:
        return f"similar:{self.threshold}:{self.reference}"

    def _similarity(self, answer: str) -> float:
        if self._encoder is None:
            self._encoder = self._factory()
            self._ref = self._encoder.encode([self.reference])[0]
        vec = self._encoder.encode([answer])[0]
        return float(vec @ self._ref)

    async def __call__(self, answer: str) -> bool:
        return await asyncio.to_thread(self._similarity, answer) >= self.threshold


def _default_encoder() -> Encoder:
    from sidecar.encoders import SentenceTransformerEncoder

    return SentenceTransformerEncoder()


JUDGE_SYSTEM = "You are a strict judge. Reply with one word: yes or no."


class Judge:
    """An LLM judge asked ``question`` about the answer; a reply starting "yes" is true."""

    def __init__(self, question: str, black_box: BlackBox, *, seed: int = 0) -> None:
        self.question = question
        self.black_box = black_box
        self.seed = seed

    @property
    def spec(self) -> str:
        return f"judge:{self.question}"

    async def __call__(self, answer: str) -> bool:
        messages = [
            {"role": "system", "content": JUDGE_SYSTEM},
            {
                "role": "user",
                "content": f"Answer under review:\n{answer}\n\n{self.question}\nReply yes or no.",
            },
        ]
        reply = await self.black_box.complete(messages, seed=self.seed)
        return normalise(reply).split()[:1] == ["yes"]  # "Yesterday" is no yes


@dataclass(frozen=True)
class Not:
    inner: Predicate

    @property
    def spec(self) -> str:
        return f"not:{self.inner.spec}"

    async def __call__(self, answer: str) -> bool:
        return not await self.inner(answer)


def parse_predicate(
    spec: str,
    *,
    black_box: BlackBox | None = None,
    encoder_factory: Callable[[], Encoder] | None = None,
    seed: int = 0,
) -> Predicate:
    """Build a predicate from its spec string (see the module docstring).

    Raises
    ------
    ConfigError
        Unknown kind, missing argument, bad regex or threshold, or ``judge`` without a
        black box.
    """
    kind, sep, arg = spec.partition(":")
    kind = kind.strip().lower()
    if not sep or (kind != "not" and not arg.strip()):
        raise ConfigError(f"predicate {spec!r} must look like KIND:ARGUMENT (e.g. contains:Paris)")
    if kind == "not":
        return Not(
            parse_predicate(arg, black_box=black_box, encoder_factory=encoder_factory, seed=seed)
        )
    if kind in ("contains", "equals") and not normalise(arg, punctuation=" "):
        raise ConfigError(f"predicate {spec!r}: nothing is left of {arg!r} to compare once "
                          "case, punctuation and articles are set aside")  # fmt: skip
    if kind == "contains":
        return Contains(arg)
    if kind == "regex":
        return Regex(arg)
    if kind == "equals":
        return Equals(arg)
    if kind == "similar":
        threshold, sep, reference = arg.partition(":")
        try:
            value = float(threshold)
        except ValueError:
            value = float("nan")
        if not sep or not reference or value != value:
            raise ConfigError(f"predicate {spec!r} must look like similar:0.8:reference text")
        return Similar(value, reference, encoder_factory)
    if kind == "judge":
        if black_box is None:
            raise ConfigError("a judge predicate needs a black box (an LLM endpoint)")
        return Judge(arg, black_box, seed=seed)
    raise ConfigError(
        f"unknown predicate kind {kind!r}; use contains, regex, equals, similar, judge or not"
    )
