"""Recognisable secrets and a scan of everything a run wrote for any trace of them.

A secret leaks in more shapes than its plain text: %-encoded in a URL, base64 in a
header or a dead letter's payload, hex in a debug dump, or cut short. :func:`find_leaks`
looks for each of those shapes in every output it is given.
"""

from __future__ import annotations

import base64
import json
import secrets
import urllib.parse
from collections.abc import Iterable, Mapping

# A window this long of a secret's random part appearing anywhere is a leak (a truncated
# or partly masked secret is still a leak).
WINDOW = 12


def recognisable_secret(kind: str) -> str:
    """``kind`` and 24 random hex digits, with ``+`` and ``/`` so that the %-encoded and
    base64 forms differ from the plain one; printable, as a secret file must be."""
    return f"{kind}+{secrets.token_hex(6)}/{secrets.token_hex(6)}"


def _b64_cores(raw: bytes) -> set[bytes]:
    """The base64 characters that depend on ``raw`` alone, for each of the three byte
    alignments ``raw`` can have inside a longer base64-encoded message."""
    cores: set[bytes] = set()
    for pad in range(3):
        encoded = base64.b64encode(b"\0" * pad + raw)
        first = -(-8 * pad // 6)  # the first character with no bit of the padding
        last = 8 * (pad + len(raw)) // 6  # past the last character with only secret bits
        core = encoded[first:last]
        cores |= {core, core.replace(b"+", b"-").replace(b"/", b"_")}
    return cores


def forms(secret: str) -> dict[str, bytes]:
    """Every shape of ``secret`` to look for, by name."""
    raw = secret.encode()
    out: dict[str, bytes] = {
        "plain": raw,
        "url-encoded": urllib.parse.quote(secret, safe="").encode(),
        "form-encoded": urllib.parse.quote_plus(secret).encode(),
        "json-escaped": json.dumps(secret)[1:-1].encode(),
        "hex": raw.hex().encode(),
        "HEX": raw.hex().upper().encode(),
    }
    for i, core in enumerate(sorted(_b64_cores(raw))):
        out[f"base64#{i}"] = core
    for i in range(len(raw) - WINDOW + 1):
        out[f"plain[{i}:{i + WINDOW}]"] = raw[i : i + WINDOW]
    return out


def find_leaks(secrets_by_name: Mapping[str, str], outputs: Mapping[str, bytes]) -> list[str]:
    """``"<output> holds <secret> (<form>)"`` for every trace found; empty when clean."""
    found: list[str] = []
    for name, secret in secrets_by_name.items():
        shapes = forms(secret)
        for where, data in outputs.items():
            hits = [form for form, needle in shapes.items() if needle in data]
            if hits:
                excerpt = _excerpt(data, shapes[hits[0]])
                found.append(f"{where} holds {name} ({', '.join(hits[:4])}): ...{excerpt}...")
    return found


def _excerpt(data: bytes, needle: bytes, around: int = 80) -> str:
    i = data.find(needle)
    return data[max(0, i - around) : i + len(needle) + around].decode("utf-8", "replace")


def as_bytes(parts: Iterable[bytes | str | None]) -> bytes:
    """Join a record's parts (key, value, header values) for the scan."""
    return b"\n".join(p.encode() if isinstance(p, str) else p for p in parts if p is not None)
