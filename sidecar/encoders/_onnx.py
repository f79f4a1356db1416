"""ONNX Runtime backend for mean-pooled sentence-transformers encoders.

The same model, exported once to ONNX (transformer, mean pooling and L2 normalisation in
one graph) and run by ONNX Runtime in float32. Embeddings match the torch backend to a
cosine of 0.9999996 (all-MiniLM-L6-v2, measured), and every load checks it again on
probe texts before the encoder is used, so models trained with either backend serve with
the other. Why: one ONNX Runtime call per batch instead of hundreds of torch operator
dispatches, each taking the GIL back from the event loop; on one core a batch of 1 took
4.3 ms against 14.3 ms with torch, a batch of 8 24 against 35 ms, a batch of 64 201
against 233 ms.

The export needs torch and the ``onnx`` package and takes a few seconds; the file is
cached under ``cache_dir`` keyed by the model's content hash, written atomically, so
replicas sharing a volume export once. Beside it goes the torch embedding of the probe
texts: a later load with both files present checks the export against that reference
and never imports torch (tokenising with the model's own ``tokenizer.json``), which
saves the worker several hundred MB and seconds of start-up. Anything off on that path
(a stale or damaged reference, an unusual tokenizer) falls back to the full check
against torch.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
import threading
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from sidecar.encoders._encoder import LocalEncoder, resolve_encoder_path
from sidecar.encoders._registry import encoder_spec
from sidecar.errors import ConfigError

log = logging.getLogger(__name__)

DEFAULT_ONNX_CACHE = Path("~/.cache/ood-sidecar/onnx")

# Texts every load embeds with both backends; the ONNX one is refused if they disagree.
_PROBES = (
    "How do I reset my password?",
    "What are the symptoms of a common cold in children?",
    "Write a poem about the sea",
    "x",
    "Crème brûlée à la CAFÉ: ÜBER-long words, numbers 3.14 & emoji 🙂?",
    # longer than any max_seq_length: checks truncation
    " ".join(["symptom", "insurance", "claim", "clinic"] * 200),
)
_MIN_PROBE_COSINE = 0.99999
# Exports hold public model weights: readable by every user, so that an export made at
# image build (as root) or by one replica serves workers running under another uid.
_SHARED_MODE = 0o644


class OnnxEncoder(LocalEncoder):
    """A sentence encoder run by ONNX Runtime (see the module docstring).

    Parameters
    ----------
    name : str
        ``"all-MiniLM-L6-v2"`` (packaged) or a local sentence-transformers directory whose
        pipeline is Transformer, mean Pooling and (optionally) Normalize.
    threads : int, optional
        ONNX Runtime intra-op threads (default: its own choice).
    cache_dir : path, optional
        Where exported models are kept (default ``~/.cache/ood-sidecar/onnx``).
    prebuilt_dir : path, optional
        A directory, read-only is fine, holding an export and its probe reference made
        beforehand (``sidecar prepare-encoder``, e.g. at image build). Tried first; without
        a usable export there, ``cache_dir`` serves as usual.

    Attributes
    ----------
    export_path : Path
        The ONNX file in use.
    reference_path : Path
        The torch embeddings of the probe texts that ``export_path`` was checked against.
    """

    backend = "onnx"

    def __init__(
        self,
        name: str = "all-MiniLM-L6-v2",
        *,
        threads: int | None = None,
        cache_dir: str | Path | None = None,
        prebuilt_dir: str | Path | None = None,
    ) -> None:
        spec = encoder_spec(name)
        if spec is not None and spec.runtime != "sentence-transformers":
            raise ConfigError(
                f"encoder {spec.name!r} runs on its own runtime ({spec.runtime}): "
                "there is no ONNX export to make"
            )
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        try:
            import onnxruntime as ort
        except ImportError as exc:
            raise ConfigError(
                "scoring.encoder_backend=onnx needs the onnxruntime package "
                "(pip install onnxruntime onnx)"
            ) from exc

        self._name, path = resolve_encoder_path(name)
        self._lock = threading.Lock()
        opts = ort.SessionOptions()
        if threads:
            opts.intra_op_num_threads = int(threads)
            opts.inter_op_num_threads = 1
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL

        def session(onnx_path: Path) -> Any:
            return ort.InferenceSession(str(onnx_path), opts, providers=["CPUExecutionProvider"])

        def checked(target: Path, then: str) -> bool:
            """Serve ``target`` if it and its probe reference are there and agree."""
            reference = _reference_path(target)
            if not (target.is_file() and reference.is_file()):
                return False
            try:
                self._load_checked_export(session(target), path, target, reference)
                return True
            except Exception as exc:  # anything off: the next place, at last torch
                log.warning(
                    "ONNX export %s not usable on its own (%s: %s); %s",
                    target,
                    type(exc).__name__,
                    exc,
                    then,
                )
                return False

        file_name = _export_name(self._name, path)
        if prebuilt_dir is not None:
            pre = Path(prebuilt_dir).expanduser() / file_name
            if checked(pre, "trying the cache"):
                self.export_path = pre
                return
            if not pre.is_file():
                log.info("no prebuilt ONNX export %s; trying the cache", pre)
            elif not _reference_path(pre).is_file():
                log.warning("prebuilt ONNX export %s has no probe reference; trying the cache", pre)
        target = Path(cache_dir or DEFAULT_ONNX_CACHE).expanduser() / file_name
        if not checked(target, "checking it against torch"):
            self._load_through_torch(session, path, target, _reference_path(target))
        self.export_path = target

    @property
    def reference_path(self) -> Path:
        return _reference_path(self.export_path)

    def _load_checked_export(
        self, sess: Any, model_dir: str, target: Path, reference: Path
    ) -> None:
        """Serve a cached export without torch: its probe embeddings must match torch's,
        stored next to it when it was first checked against torch."""
        from tokenizers import Tokenizer

        ref = np.load(reference, allow_pickle=False)
        tok = Tokenizer.from_file(str(Path(model_dir) / "tokenizer.json"))
        tok.enable_truncation(max_length=_max_seq_length(model_dir))
        pad = _pad_token(model_dir)
        pad_id = tok.token_to_id(pad)
        if pad_id is None:
            raise ValueError(f"pad token {pad!r} is not in the vocabulary")
        tok.enable_padding(pad_id=pad_id, pad_token=pad)  # to the longest of the batch
        fields = {
            "input_ids": "ids",
            "attention_mask": "attention_mask",
            "token_type_ids": "type_ids",
        }
        names = [i.name for i in sess.get_inputs()]
        unknown = sorted(set(names) - set(fields))
        if unknown:
            raise ValueError(f"the export takes inputs {unknown} the tokenizer does not give")

        def feed(texts: list[str]) -> dict[str, np.ndarray]:
            enc = tok.encode_batch(texts)
            return {
                n: np.asarray([getattr(e, fields[n]) for e in enc], dtype=np.int64) for n in names
            }

        self._session, self._feed, self._dim = sess, feed, int(ref.shape[1])
        cos = _probe_cosine(ref, self.encode(_PROBES))
        if cos < _MIN_PROBE_COSINE:
            raise ValueError(f"probe cosine {cos:.6f} against the stored torch embeddings")
        log.info("encoder %s on ONNX Runtime (%s, probe cosine %.7f)", self._name, target, cos)

    def _load_through_torch(
        self,
        session: Any,
        model_dir: str,
        target: Path,
        reference: Path,
    ) -> None:
        """Export (if needed) with torch, check against torch, store the probe embeddings."""
        from sidecar.encoders._encoder import load_sentence_transformer

        st = load_sentence_transformer(model_dir)
        normalize = _check_pipeline(st, self._name)
        hf_tokenizer = st.tokenizer
        max_len = int(st.max_seq_length or 512)
        inputs = tuple(hf_tokenizer.model_input_names)
        onnx_path = _exported(st, model_dir, target, inputs, normalize)

        def feed(texts: list[str]) -> dict[str, np.ndarray]:
            out = hf_tokenizer(
                texts, padding=True, truncation=True, max_length=max_len, return_tensors="np"
            )
            return {k: np.asarray(out[k], dtype=np.int64) for k in inputs}

        ref = np.asarray(
            st.encode(list(_PROBES), normalize_embeddings=True, show_progress_bar=False),
            dtype=np.float32,
        )
        self._session, self._feed, self._dim = session(onnx_path), feed, int(ref.shape[1])
        cos = _probe_cosine(ref, self.encode(_PROBES))
        if cos < _MIN_PROBE_COSINE:
            raise ConfigError(
                f"the ONNX export of {self._name} disagrees with torch (probe cosine {cos:.6f})"
            )
        _write_atomic(reference, lambda f: np.save(f, ref, allow_pickle=False))
        log.info("encoder %s on ONNX Runtime (%s, probe cosine %.7f)", self._name, onnx_path, cos)
        del st  # the torch copy was only needed to export and check

    def encode(
        self, texts: Sequence[str], *, batch_size: int = 64, progress: bool = False
    ) -> np.ndarray:
        """Embed ``texts``; ndarray of shape (n, dim), float32, unit rows."""
        texts = list(texts)
        if not texts:
            return np.zeros((0, self._dim), dtype=np.float32)
        # Like sentence-transformers: sort by length so each batch pads little.
        order = np.argsort([-len(t) for t in texts], kind="stable")
        out = np.empty((len(texts), self._dim), dtype=np.float32)
        step = max(1, int(batch_size))
        with self._lock:
            for i in range(0, len(texts), step):
                idx = order[i : i + step]
                out[idx] = self._session.run(None, self._feed([texts[j] for j in idx]))[0]
        return out


def _check_pipeline(st: Any, name: str) -> bool:
    """The ONNX graph reproduces Transformer + mean Pooling (+ Normalize) only."""
    kinds = [type(m).__name__ for m in st]
    if kinds[:2] != ["Transformer", "Pooling"] or kinds[2:] not in ([], ["Normalize"]):
        raise ConfigError(
            f"encoder {name}: the onnx backend supports Transformer + Pooling (+ Normalize) "
            f"pipelines, not {kinds}; use scoring.encoder_backend=torch"
        )
    pooling = st[1]
    mode = getattr(pooling, "pooling_mode", None)
    if mode is None:  # older sentence-transformers
        mode = getattr(pooling, "get_pooling_mode_str", lambda: "")()
    if mode != "mean":
        raise ConfigError(f"encoder {name}: onnx backend needs mean pooling, not {mode!r}")
    return kinds[2:] == ["Normalize"]


def _fingerprint(model_dir: str) -> str:
    h = hashlib.sha256()
    for f in sorted(Path(model_dir).rglob("*")):
        if f.is_file() and f.suffix in {".json", ".safetensors", ".bin", ".txt"}:
            h.update(str(f.relative_to(model_dir)).encode())
            with f.open("rb") as fh:
                for block in iter(lambda: fh.read(1 << 20), b""):
                    h.update(block)
    return h.hexdigest()[:16]


def _export_name(name: str, model_dir: str) -> str:
    """File name of a model's export: its name and content hash."""
    return f"{Path(name).name}-{_fingerprint(model_dir)}.onnx"


def _reference_path(target: Path) -> Path:
    """Where the torch embeddings of the probe texts are kept (keyed by the probes too)."""
    probes = hashlib.sha256("\n".join(_PROBES).encode()).hexdigest()[:8]
    return target.with_name(f"{target.stem}.probes-{probes}.npy")


def _probe_cosine(ref: np.ndarray, got: np.ndarray) -> float:
    if ref.shape != got.shape:
        return float("-inf")
    return float(np.min(np.sum(ref * got, axis=1)))


def _max_seq_length(model_dir: str) -> int:
    conf = Path(model_dir) / "sentence_bert_config.json"
    value = json.loads(conf.read_text()).get("max_seq_length") if conf.is_file() else None
    return int(value or 512)


def _pad_token(model_dir: str) -> str:
    for name in ("tokenizer_config.json", "special_tokens_map.json"):
        f = Path(model_dir) / name
        pad = json.loads(f.read_text()).get("pad_token") if f.is_file() else None
        if isinstance(pad, dict):
            pad = pad.get("content")
        if isinstance(pad, str):
            return pad
    raise ValueError("the model declares no pad token")


def _write_atomic(target: Path, write: Any) -> None:
    """Write through a temporary file in the same directory, then rename it into place."""
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
        os.chmod(tmp, _SHARED_MODE)
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _exported(
    st: Any, model_dir: str, target: Path, inputs: tuple[str, ...], normalize: bool
) -> Path:
    """The cached ONNX file for this model, exported now if missing."""
    if target.is_file():
        return target
    try:
        import onnx  # noqa: F401  (torch's exporter imports it)
        import torch
    except ImportError as exc:
        raise ConfigError(
            "exporting the encoder to ONNX needs torch and the onnx package (pip install onnx)"
        ) from exc

    class Pooled(torch.nn.Module):
        def __init__(self, transformer: torch.nn.Module) -> None:
            super().__init__()
            self.transformer = transformer

        def forward(self, *feed: torch.Tensor) -> torch.Tensor:
            kw = dict(zip(inputs, feed, strict=True))
            tokens = self.transformer(**kw).last_hidden_state
            mask = kw["attention_mask"].unsqueeze(-1).to(tokens.dtype)
            pooled = (tokens * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
            return torch.nn.functional.normalize(pooled, dim=1) if normalize else pooled

    model = Pooled(st[0].auto_model).eval()
    sample = st.tokenizer(["an example query", "a second one"], padding=True, return_tensors="pt")
    args = tuple(sample[k] for k in inputs)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, suffix=".onnx.tmp")
    os.close(fd)
    log.info("exporting %s to ONNX (once) ...", model_dir)
    try:
        with warnings.catch_warnings():
            # The tracer warns about every data-dependent branch of the model; the probe
            # check at load (padded batches of several lengths) is what proves the export.
            warnings.simplefilter("ignore")
            torch.onnx.export(
                model,
                args,
                tmp,
                dynamo=False,
                input_names=list(inputs),
                output_names=["embedding"],
                dynamic_axes={k: {0: "batch", 1: "tokens"} for k in inputs},
                opset_version=17,
            )
        os.chmod(tmp, _SHARED_MODE)
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target
