"""Encoders: the only package that runs a language model to embed text.

:class:`Encoder` is the protocol the rest of the product sees (``name``, ``dim``,
``encode(texts) -> (n, dim) float32``). :func:`load_encoder` builds one from the scoring
settings: sentence-transformers on torch (optionally with bfloat16 linear layers) or the
same weights exported to ONNX Runtime, whose export is cached on disk and checked against
the torch model before first use, or a shared embedding server behind an OpenAI-compatible
``/v1/embeddings`` endpoint (:class:`HttpEncoder`). :data:`ENCODERS` names the packaged
encoders, among them two multilingual ones with runtimes of their own
(:class:`UniversalSentenceEncoder`, :class:`E5Encoder`); :class:`LanguageDetector` tells a
query's language. :func:`embed_probes` embeds the fixed probe sentences a trained model
records as a fingerprint of its encoder's weights.
"""

from sidecar.encoders._e5 import E5Encoder
from sidecar.encoders._encoder import (
    DEFAULT_ENCODER,
    Encoder,
    SentenceTransformerEncoder,
    encoder_dim,
    encoder_label,
    resolve_encoder_path,
)
from sidecar.encoders._http import HttpEncoder, ServerState
from sidecar.encoders._language import LanguageDetector, detector_languages
from sidecar.encoders._load import available_cpus, encoder_threads, load_encoder
from sidecar.encoders._onnx import OnnxEncoder
from sidecar.encoders._probes import embed_probes
from sidecar.encoders._registry import ENCODERS, EncoderSpec, encoder_names, encoder_spec
from sidecar.encoders._usem import UniversalSentenceEncoder

__all__ = [
    "DEFAULT_ENCODER",
    "ENCODERS",
    "E5Encoder",
    "Encoder",
    "EncoderSpec",
    "HttpEncoder",
    "LanguageDetector",
    "OnnxEncoder",
    "SentenceTransformerEncoder",
    "ServerState",
    "UniversalSentenceEncoder",
    "available_cpus",
    "detector_languages",
    "embed_probes",
    "encoder_dim",
    "encoder_label",
    "encoder_names",
    "encoder_spec",
    "encoder_threads",
    "load_encoder",
    "resolve_encoder_path",
]
