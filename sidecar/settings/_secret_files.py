"""Secret files and the names of settings: what :func:`sidecar.settings.load_settings`
reads before it validates anything.

A secret is a file ``<section>__<field>`` in ``SIDECAR_SECRETS_DIR``, never a value in
code, values files or logs.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from sidecar.errors import ConfigError


def read_secret_files(secrets_dir: Path) -> dict[str, dict[str, str]]:
    """Map files named ``<section>__<field>`` to nested values."""
    found: dict[str, dict[str, str]] = {}
    if not secrets_dir.is_dir():
        return found
    for f in sorted(secrets_dir.iterdir()):
        if "__" not in f.name or f.name.startswith("."):
            continue  # Kubernetes' own ..data entries, a CA file named kafka-ca.pem
        _check_regular(f)
        section, name = f.name.split("__", 1)
        try:
            text = f.read_bytes().decode("utf-8")
        except UnicodeDecodeError:
            text = None
        if text is None:
            # Raised outside the except block: the decode error's message quotes a byte of
            # the file, and a chained traceback (--debug, a crash log) would show it.
            raise ConfigError(
                f"secret file {f} is not UTF-8 text; a key must be text, "
                "e.g. hex or base64 (`openssl rand -hex 32`)"
            )
        found.setdefault(section, {})[name] = text.strip()
    return found


def _check_regular(f: Path) -> None:
    """A ``<section>__<field>`` entry that is not a readable file is a mounting mistake
    that would otherwise leave the setting unset: no password, or no signing key."""
    try:
        mode = f.stat().st_mode
    except FileNotFoundError:
        raise ConfigError(f"secret file {f} is a link to nothing") from None
    except OSError as exc:
        raise ConfigError(f"secret file {f} cannot be read ({exc.strerror})") from None
    if not stat.S_ISREG(mode):
        what = "a directory" if stat.S_ISDIR(mode) else "not a regular file"
        raise ConfigError(f"secret file {f} is {what}; a secret is a file holding the value")


def secrets_dir(default: Path) -> Path:
    """``SIDECAR_SECRETS_DIR``, or the default when unset.

    The default may be missing (no secret mounted), even when given explicitly (the chart
    always sets it); any other path that is named but is not a directory is a typo, which
    would otherwise mean running without password or signing key.
    """
    given = os.environ.get("SIDECAR_SECRETS_DIR")
    if given is None:
        return default
    if not given.strip():  # Path("") is the working directory: its files would be secrets
        raise ConfigError("SIDECAR_SECRETS_DIR is empty; unset it if no secrets are mounted")
    path = Path(given)
    if not path.is_dir() and (path != default or path.exists()):
        what = "does not exist" if not path.exists() else "is not a directory"
        raise ConfigError(
            f"SIDECAR_SECRETS_DIR {given!r} {what}; unset it if no secrets are mounted"
        )
    return path


def refuse_unknown_sections(secrets: dict[str, dict[str, str]], known: set[str]) -> None:
    """A variable ``SIDECAR_<SECTION>__<FIELD>`` or a secret file ``<section>__<field>`` for
    a section that does not exist is a typo (``SIDECAR_REDSI__PASSWORD``) that would
    otherwise be ignored without a word. Variables without ``__`` are left alone:
    Kubernetes defines ``SIDECAR_SERVICE_HOST`` and the like for a Service named sidecar.
    """
    unknown = sorted(
        name
        for name in os.environ
        if name.startswith("SIDECAR_")
        and "__" in name
        and name[len("SIDECAR_") :].split("__", 1)[0].lower() not in known
    )
    unknown += sorted(f"secret file {section}__..." for section in secrets if section not in known)
    if unknown:
        where, sections = ", ".join(unknown), ", ".join(sorted(known))
        raise ConfigError(f"unknown settings section in {where}; sections: {sections}")
