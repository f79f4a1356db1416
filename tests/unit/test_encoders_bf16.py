"""bfloat16 linear layers for the encoder (a tiny torch model, no encoder download)."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from sidecar.encoders._bf16 import bf16_linears, bf16_supported  # noqa: E402
from sidecar.errors import ConfigError  # noqa: E402

needs_bf16 = pytest.mark.skipif(
    not bf16_supported("cpu"), reason="this CPU has no bfloat16 matrix units (AMX/AVX512-BF16)"
)


def _net() -> object:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(32, 64), torch.nn.LayerNorm(64), torch.nn.GELU(), torch.nn.Linear(64, 16)
    ).eval()


@needs_bf16
def test_every_linear_is_replaced_and_outputs_stay_float32_and_close() -> None:
    net = _net()
    x = torch.randn(8, 32)
    with torch.inference_mode():
        ref = net(x).numpy()
        assert bf16_linears(net) == 2
        out = net(x)
    assert out.dtype == torch.float32
    assert not any(isinstance(m, torch.nn.Linear) for m in net.modules())
    cos = np.sum(ref * out.numpy(), 1) / (
        np.linalg.norm(ref, axis=1) * np.linalg.norm(out.numpy(), axis=1)
    )
    assert cos.min() > 0.999
    assert not np.array_equal(ref, out.numpy())  # it really computed in bfloat16


def test_unsupported_device_is_a_config_error() -> None:
    if bf16_supported("cuda:0"):
        pytest.skip("a CUDA device with bfloat16 is present")
    with pytest.raises(ConfigError, match="bfloat16"):
        bf16_linears(_net(), "cuda:0")
