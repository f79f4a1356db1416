"""Measurement behind benchmarks/results/encoder_probes.json (not a test; run by hand).

How far apart are the probe embeddings (``sidecar.scoring.PROBE_TEXTS``) of the same
weights on each backend and precision, and of weights that differ? This is what the
refusal threshold ``MIN_PROBE_COSINE`` is chosen against::

    python benchmarks/studies/encoder_probes.py --json benchmarks/results/encoder_probes.json

Reference: the default encoder on torch in float32. Compared: ONNX Runtime (float32),
torch with bfloat16 linear layers (where the CPU has it), the same weights with Gaussian
noise of a given fraction of each tensor's standard deviation added (a stand-in for a
fine-tuned or re-exported model of the same name), and the same weights pooled by the
first token instead of the mean (a pipeline configured differently). Each figure is the
lowest cosine over the probes.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from sidecar.bench._timing import cpu_facts
from sidecar.encoders import embed_probes, load_encoder
from sidecar.encoders._encoder import load_sentence_transformer, resolve_encoder_path
from sidecar.scoring import MIN_PROBE_COSINE, PROBE_TEXTS
from sidecar.scoring._probes import probe_cosines
from sidecar.settings import load_settings

NOISE = (0.001, 0.01, 0.03, 0.1, 0.3)


def _backends(settings, reference: np.ndarray) -> dict[str, dict[str, float]]:  # type: ignore[no-untyped-def]
    out = {}
    for backend, dtype in (("torch", "float32"), ("onnx", "float32"), ("torch", "bfloat16")):
        update = {"encoder_backend": backend, "encoder_dtype": dtype}
        sc = settings.scoring.model_copy(update=update)
        try:
            enc = load_encoder(sc)
        except Exception as exc:  # bfloat16 needs AMX or AVX512-BF16
            out[f"{backend}_{dtype}"] = {"skipped": f"{type(exc).__name__}: {exc}"}
            continue
        embed_probes(enc.encode)  # the first call builds the graph
        t0 = time.perf_counter()
        probes = embed_probes(enc.encode)
        out[f"{backend}_{dtype}"] = {
            "min_cosine": float(probe_cosines(reference, probes).min()),
            "embed_ms": round((time.perf_counter() - t0) * 1000, 1),
        }
    return out


def main() -> None:
    import torch

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", required=True)
    args = ap.parse_args()
    settings = load_settings()
    path = resolve_encoder_path(settings.scoring.encoder)[1]
    st = load_sentence_transformer(path)
    reference = np.asarray(st.encode(list(PROBE_TEXTS)), dtype=np.float32)
    result: dict[str, object] = {
        "encoder": settings.scoring.encoder,
        "probes": list(PROBE_TEXTS),
        "min_probe_cosine": MIN_PROBE_COSINE,
        "reference": "torch float32, mean pooling",
        "same_weights": _backends(settings, reference),
    }
    noise = {}
    for rel in NOISE:
        model = load_sentence_transformer(path)
        gen = torch.Generator().manual_seed(0)
        with torch.no_grad():
            for p in model.parameters():
                if p.numel() > 1:
                    p.add_(torch.randn(p.shape, generator=gen) * rel * p.std())
        probes = np.asarray(model.encode(list(PROBE_TEXTS)), dtype=np.float32)
        noise[str(rel)] = float(probe_cosines(reference, probes).min())
    result["weights_with_noise"] = noise
    tokens = st.tokenize(list(PROBE_TEXTS))
    with torch.no_grad():
        hidden = (
            st[0]
            .auto_model(input_ids=tokens["input_ids"], attention_mask=tokens["attention_mask"])
            .last_hidden_state
        )
    result["first_token_pooling"] = float(probe_cosines(reference, hidden[:, 0].numpy()).min())
    others = probe_cosines(reference, np.roll(reference, 1, axis=0))
    result["between_different_probes"] = {"max": float(others.max()), "min": float(others.min())}
    result["machine"] = cpu_facts()
    with open(args.json, "w") as f:
        json.dump(result, f, indent=2)
        f.write("\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
