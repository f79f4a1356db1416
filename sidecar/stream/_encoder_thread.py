"""The encoder's own thread: every encoder (and language detector) call of the scoring
path runs there, off the event loop, and the protocols the batch needs of both."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol

import numpy as np


class LanguageTeller(Protocol):
    """What the batch needs of ``sidecar.encoders.LanguageDetector``."""

    def detect(self, texts: Sequence[str]) -> list[str]: ...


class TextEncoder(Protocol):
    """The part of ``sidecar.scoring.Encoder`` used here."""

    def encode(self, texts: Sequence[str], *, batch_size: int = 64) -> np.ndarray: ...


class EncoderThread:
    """Runs every encoder call on one dedicated thread, off the event loop.

    Always the same thread, not a pool: torch keeps a team of intra-op (OpenMP) threads
    per calling thread, and calls from a rotating pool grew several teams that competed
    for the same cores (all-MiniLM-L6-v2, batches of 8, 2 cores: 259 queries/s through
    ``asyncio.to_thread`` against 348 through one thread).
    """

    def __init__(self, encoder: TextEncoder) -> None:
        self.encoder = encoder
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sidecar-encoder")

    async def encode(self, texts: Sequence[str], *, batch_size: int) -> np.ndarray:
        call = functools.partial(self.encoder.encode, texts, batch_size=batch_size)
        return await asyncio.get_running_loop().run_in_executor(self._executor, call)

    async def detect(self, teller: LanguageTeller, texts: Sequence[str]) -> list[str]:
        """``teller.detect(texts)`` on the same thread, off the event loop."""
        call = functools.partial(teller.detect, texts)
        return await asyncio.get_running_loop().run_in_executor(self._executor, call)

    def close(self) -> None:
        self._executor.shutdown(wait=False)


def language_detector(scoring: Any, encoder_name: str) -> LanguageTeller | None:
    """The language detector ``scoring`` (a ``ScoringSettings``) asks for, choosing among
    the languages of the encoder named ``encoder_name``; None when it is switched off."""
    if not scoring.detect_language:
        return None
    from sidecar.encoders import LanguageDetector, detector_languages

    return LanguageDetector(detector_languages(encoder_name, scoring.languages))
