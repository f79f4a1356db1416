"""Encoders: the only package that runs a language model to embed text.

:class:`Encoder` is the protocol the rest of the product sees (``name``, ``dim``,
``encode(texts) -> (n, dim) float32``). :func:`load_encoder` builds one from the scoring
settings: sentence-transformers on torch (optionally with bfloat16 linear layers) or the
same weights exported to ONNX Runtime, whose export is cached on disk and checked against
the torch model before first use, or a shared embedding server behind an OpenAI-compatible
``/v1/embeddings`` endpoint (:class:`HttpEncoder`). :func:`embed_probes` embeds the fixed
probe sentences a trained model records as a fingerprint of its encoder's weights.
"""

from sidecar.encoders._encoder import (
    DEFAULT_ENCODER,
    Encoder,
    SentenceTransformerEncoder,
    encoder_dim,
    encoder_label,
    resolve_encoder_path,
)
from sidecar.encoders._http import HttpEncoder, ServerState
from sidecar.encoders._load import available_cpus, encoder_threads, load_encoder
from sidecar.encoders._onnx import OnnxEncoder
from sidecar.encoders._probes import embed_probes

__all__ = [
    "DEFAULT_ENCODER",
    "Encoder",
    "HttpEncoder",
    "OnnxEncoder",
    "SentenceTransformerEncoder",
    "ServerState",
    "available_cpus",
    "embed_probes",
    "encoder_dim",
    "encoder_label",
    "encoder_threads",
    "load_encoder",
    "resolve_encoder_path",
]
