"""The scoring worker with a poisoned encoder, for the fault benchmark's poison query only.

``python -m sidecar.bench._faults_worker --poison-marker MARK`` runs what ``sidecar worker``
runs (settings from the environment, the topics ensured, :func:`create_app`, faust's
worker) with one difference: the encoder is wrapped so that it raises on any batch with
a text containing ``MARK``, as a real encoder does on an input it chokes on. The wrapper
goes in through :func:`create_app`'s ``encoder`` argument; no setting of the product can
turn it on, and ``sidecar worker`` never loads this module.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np


class PoisonedEncoder:
    """The real encoder, except that it raises ``ValueError`` on a batch holding ``marker``."""

    def __init__(self, inner: Any, marker: str) -> None:
        if not marker.strip():
            raise ValueError("the poison marker must not be blank")
        self.inner, self.marker = inner, marker
        self.name, self.dim = inner.name, inner.dim
        self.backend = getattr(inner, "backend", None)

    def encode(self, texts: Sequence[str], *, batch_size: int = 64) -> np.ndarray:
        if any(self.marker in t for t in texts):
            raise ValueError("poisoned input (fault benchmark)")
        return np.asarray(self.inner.encode(texts, batch_size=batch_size))


def main(argv: Sequence[str] | None = None) -> None:
    import faust

    from sidecar.encoders import load_encoder
    from sidecar.settings import load_settings
    from sidecar.stream import create_app, ensure_topics

    p = argparse.ArgumentParser(prog="python -m sidecar.bench._faults_worker")
    p.add_argument("--poison-marker", required=True)
    p.add_argument("--log-level", default="INFO")
    args = p.parse_args(argv)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.getLogger().handlers[:] = [handler]
    logging.getLogger().setLevel(args.log_level)

    settings = load_settings()
    asyncio.run(ensure_topics(settings))
    encoder = PoisonedEncoder(load_encoder(settings.scoring), args.poison_marker)
    app = create_app(settings, encoder=encoder)
    faust.Worker(
        app,
        loglevel=args.log_level,
        override_logging=False,
        redirect_stdouts=False,
        quiet=True,
    ).execute_from_commandline()


if __name__ == "__main__":
    main()
