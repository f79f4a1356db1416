"""``scoring.device`` is checked before the model loads: one ConfigError naming it."""

from __future__ import annotations

import re

import pytest
import torch

from sidecar.encoders._encoder import check_device, load_sentence_transformer
from sidecar.errors import ConfigError


@pytest.mark.parametrize(
    ("device", "why"),
    [
        ("bogus", "Expected one of cpu"),
        ("meta", "a meta tensor holds no data"),
        ("cpu:x", "cannot be used here"),
    ],
)
def test_a_device_torch_cannot_use_is_refused_in_one_line(device: str, why: str) -> None:
    with pytest.raises(
        ConfigError, match=re.escape(f"scoring.device '{device}' cannot be used here")
    ) as e:
        check_device(device)
    assert why in str(e.value) and "\n" not in str(e.value)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this torch has a usable CUDA device")
def test_cuda_on_a_build_without_it_is_refused_before_the_model_loads() -> None:
    with pytest.raises(ConfigError, match=re.escape("scoring.device 'cuda'")):
        load_sentence_transformer("/nonexistent-model-dir", "cuda")


def test_the_cpu_is_accepted() -> None:
    check_device("cpu")
    check_device("cpu:0")
