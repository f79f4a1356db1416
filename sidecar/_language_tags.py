"""A language tag a client gives (``nl``, ``NL``, ``nl-NL``, ``pt_BR``, ``zh-Hant``) as the
code the language detector tells and the per-language thresholds are keyed on.

A RAG service often knows its user's language (the UI locale, ``Accept-Language``) better
than a detector reading a few words; it may say so on a query record, or on a training or
calibration query row. The tag is read as BCP-47 (RFC 5646) is written: a primary
language subtag of 2 or 3 letters, then subtags of 1 to 8 letters or digits after ``-``
(``_`` too, as POSIX locales write it). Only the primary subtag is kept, lowercased,
because that is what the detector tells and what a model's thresholds are keyed on:
``pt-BR`` and ``pt-PT`` meet the ``pt`` threshold, ``zh-Hant`` and ``zh-Hans`` the ``zh``
one (py3langid tells both scripts as ``zh``). The IANA registry's deprecated codes that
platforms still write (Java wrote ``iw``, ``in`` and ``ji`` for Hebrew, Indonesian and
Yiddish before JDK 17) and Norwegian Bokmål's ``nb`` become the codes the detector tells.

A language the detector does not know is still a language: its queries meet the global
threshold, as a detected language without a threshold of its own does. ``und`` (BCP-47's
"undetermined") is accepted and calibrates nothing, as the detector's ``und`` does.
"""

from __future__ import annotations

import re

from sidecar._json_types import json_type
from sidecar.errors import DataError

# RFC 5646 (section 4.4.1) asks implementations to hold tags of at least 35 characters,
# which covers language, extended language, script and region; a longer value is not a
# tag a client means, and is refused before the pattern reads it.
MAX_TAG_CHARS = 35
# ASCII only ([A-Za-z], not \w): a primary subtag of 2-3 letters, then 1-8 alphanumerics
# per subtag. Grandfathered tags ("i-klingon") and private use ("x-...") are not read.
_TAG = re.compile(r"([A-Za-z]{2,3})(?:[-_][A-Za-z0-9]{1,8})*")
# Primary subtags written otherwise than the detector tells them: Norwegian Bokmål (the
# detector says "no"), and the registry's deprecated codes with their preferred values.
ALIASES = {"nb": "no", "iw": "he", "in": "id", "ji": "yi", "jw": "jv", "mo": "ro"}


def language_code(tag: object, what: str = "'language'") -> str:
    """The language code of a client's language tag: its primary subtag, lowercased.

    Parameters
    ----------
    tag : object
        The value as given (a JSON value, a header decoded as UTF-8).
    what : str
        How an error names where the value came from.

    Returns
    -------
    str
        2 or 3 lowercase ASCII letters (``"nl"`` for ``"nl-NL"``, ``"no"`` for ``"nb"``).

    Raises
    ------
    DataError
        When ``tag`` is not a string, is empty or longer than :data:`MAX_TAG_CHARS`, or
        is not a tag (an ``Accept-Language`` list, a locale with an encoding); the
        message says which.
    """
    if not isinstance(tag, str):
        raise DataError(f"{what} is {json_type(tag)}, expected a language tag such as 'nl'")
    if not tag.strip():
        raise DataError(f"{what} is empty; leave it out to have the language detected")
    if len(tag) > MAX_TAG_CHARS:
        raise DataError(
            f"{what} has {len(tag)} characters; a language tag has at most {MAX_TAG_CHARS}"
        )
    m = _TAG.fullmatch(tag)
    if m is None:
        raise DataError(
            f"{what} {tag!r} is not a language tag: expected one BCP-47 tag such as 'nl', "
            "'pt-BR' or 'zh-Hant'"
        )
    primary = m.group(1).lower()
    return ALIASES.get(primary, primary)
