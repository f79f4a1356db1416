"""Each query's language: the one its client gave (the record's ``language`` field or its
``sidecar-language`` header), else the language detector's.

A client's language is read as a BCP-47 tag and kept as its primary subtag
(:mod:`sidecar._language_tags`), the code the detector tells and the per-language
thresholds are keyed on. The detector reads only the queries whose client gave none, so a
client that always says the language saves the detector's cost; one whose detector fails
costs those queries their language (they meet the global threshold), never their verdict.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from sidecar._language_tags import language_code
from sidecar.errors import DataError

log = logging.getLogger(__name__)

# The Kafka header that may say a record's language (the "language" field wins).
LANGUAGE_HEADER = "sidecar-language"
# The verdict field that says who told the query's language, and its two values.
LANGUAGE_SOURCE = "language_source"
CLIENT, DETECTED = "client", "detected"
LANGUAGE_SOURCES = (CLIENT, DETECTED)


def client_language(value: Any, headers: Sequence[tuple[str, bytes | None]]) -> str | None:
    """The language code of a record's ``language`` field (``value``; None: absent), else
    of its ``sidecar-language`` header; None when neither gives one.

    Raises :class:`~sidecar.errors.DataError`, whose message becomes the dead letter's
    detail, for a value that is not a language tag.
    """
    if value is not None:
        return language_code(value)
    for key, header in headers:
        if key != LANGUAGE_HEADER:
            continue
        try:
            text = header.decode("utf-8") if isinstance(header, bytes | bytearray) else None
        except UnicodeDecodeError:
            text = None
        if text is None:
            raise DataError(f"the {LANGUAGE_HEADER} header is not UTF-8 text")
        return language_code(text, f"the {LANGUAGE_HEADER} header")
    return None


async def tell_languages(
    given: Sequence[str | None],
    texts: Sequence[str],
    detect: Callable[[list[str]], Awaitable[list[str]]] | None,
) -> tuple[dict[int, str], frozenset[int]]:
    """Each query's language: the client's where it gave one, else the detector's.

    Parameters
    ----------
    given : sequence of str or None, length n
        The language each query's client gave (None: none).
    texts : sequence of str, length n
        The queries' texts; only those without a given language are detected.
    detect : async callable, optional
        Tells the language of a list of texts; None: no detector.

    Returns
    -------
    languages : dict of int to str
        Position -> language code, for the queries that have one (a query whose client
        gave none is missing without a detector, or when the detector failed).
    told : frozenset of int
        The positions whose language the client gave.
    """
    out = {i: lang for i, lang in enumerate(given) if lang is not None}
    told = frozenset(out)
    todo = [i for i in range(len(texts)) if i not in told]
    if detect is None or not todo:
        return out, told
    try:
        detected = await detect([texts[i] for i in todo])
    except Exception as exc:  # a detector failure must not drop the batch
        log.warning("language detection of %s texts failed: %s", len(todo), exc)
        return out, told
    if len(detected) != len(todo):
        log.warning(
            "the language detector told %s languages for %s texts", len(detected), len(todo)
        )
        return out, told
    out.update(zip(todo, detected, strict=True))
    return out, told
