"""What the frontend refuses in a request's SamplingParams that only the model can judge
(``InputProcessor.sampling_params``, before the request crosses to the core): token ids outside this
model's vocabulary (``stop_token_ids``, ``logit_bias``), and stop strings for a model without a tokenizer."""

from __future__ import annotations

from typing import Any

from infer_core.errors import RequestError
from infer_core.sampling_params import SamplingParams


def check_params(params: SamplingParams, tokenizer: Any, vocab_size: int) -> None:
    """RequestError naming the field whose value this model cannot serve."""
    if params.stop and tokenizer is None:
        raise RequestError("stop strings need a tokenizer and this model has none; use stop_token_ids", param="stop")
    for name, ids in (("stop_token_ids", params.stop_token_ids), ("logit_bias", params.logit_bias or ())):
        outside = sorted(t for t in ids if t >= vocab_size)
        if outside:
            raise RequestError(f"{name} has token ids outside this model's vocabulary [0, {vocab_size}): "
                               f"{outside[:5]}", param=name)
