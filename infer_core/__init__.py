"""infer: a plugin-based LLM inference engine.

``from infer_core import LLM, SamplingParams``. Heavy modules (torch, transformers) load on
first use, so plugins importing ``infer_core.hookspecs`` stay cheap.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_EXPORTS = {
    "LLM": "infer_core.llm",
    "SamplingParams": "infer_core.sampling_params",
    "StructuredOutputs": "infer_core.sampling_params",
    "RequestOutput": "infer_core.outputs",
    "CompletionOutput": "infer_core.outputs",
    "Logprob": "infer_core.outputs",
    "EngineSettings": "infer_core.settings",
    "Engine": "infer_core.engine.engine",
}

__all__ = ["LLM", "SamplingParams", "StructuredOutputs", "RequestOutput", "CompletionOutput", "Logprob",
           "EngineSettings", "Engine"]
assert set(__all__) == set(_EXPORTS)

if TYPE_CHECKING:
    from infer_core.engine.engine import Engine
    from infer_core.llm import LLM
    from infer_core.outputs import CompletionOutput, Logprob, RequestOutput
    from infer_core.sampling_params import SamplingParams, StructuredOutputs
    from infer_core.settings import EngineSettings


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'infer_core' has no attribute {name!r}")
