"""Score a few record values once, as the worker would, without Kafka (``sidecar score``).

The values go through the worker's own :class:`BatchScorer` (same parsing, input policy,
encoder backend and threshold), so the verdicts are the ones the stream would write and a
malformed value gets the dead-letter reason the stream would give it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from sidecar.settings import Settings
from sidecar.stream._batch import BatchOutcome, BatchScorer
from sidecar.stream._encoder_thread import language_detector
from sidecar.stream._records import InputPolicy, Raw

if TYPE_CHECKING:  # the worker imports this package; scoring loads with the first model
    from sidecar.scoring import OODModel


def score_once(
    settings: Settings, model: OODModel, version: str, values: Sequence[bytes]
) -> BatchOutcome:
    """Run the worker's batch scorer once over ``values`` with ``model`` (store ``version``).

    The encoder is the worker's (``settings.scoring``), checked against the model's
    (name, width and probes) before anything is scored. Value ``i`` is the record at
    offset ``i`` of topic ``cli``, partition 0.
    """
    from sidecar.encoders import embed_probes, load_encoder
    from sidecar.hotswap import LoadedModel

    kb = model.kb
    # The worker's encoder: the model records only its name, which for a local directory
    # is the folder's name, not a path to load it from.
    encoder = load_encoder(settings)
    model.check_encoder(encoder.name, encoder.dim, probes=embed_probes(encoder.encode))
    loaded = LoadedModel(kb=kb, version=version, model=model, loaded_at=time.time())

    class _One:
        def snapshot(self) -> dict[str, LoadedModel]:
            return {kb: loaded}

    sc = settings.scoring
    policy = InputPolicy(
        kbs=(kb,), default_kb=kb, max_text_chars=sc.max_text_chars, overlong=sc.overlong
    )
    scorer = BatchScorer(
        encoder,
        _One(),
        policy,
        fail_mode=sc.fail_mode,
        languages=language_detector(sc, encoder.name),
        embedding_fallback=sc.embedding_fallback,
    )
    raws = [Raw(value=v, topic="cli", partition=0, offset=i) for i, v in enumerate(values)]
    try:
        return asyncio.run(scorer.score(raws))
    finally:
        scorer.encoder_thread.close()
