"""The speculative-decoding plugin's own settings.

Declared through ``register_settings`` (``plugin.py``), so each is a setting like the core's:
``INFER_NUM_SPECULATIVE_TOKENS``, ``--num-speculative-tokens``, ``LLM(num_speculative_tokens=4)``.
Read as ``SpecDecodeSettings.of(engine_settings)``. This module imports pydantic and
``infer_core.interfaces`` only.
"""

from __future__ import annotations

from infer_core.interfaces import PluginSettings
from pydantic import Field, ValidationInfo, field_validator


class SpecDecodeSettings(PluginSettings):
    """How many tokens a request drafts a step, how the prompt-lookup proposer finds them, and the draft model."""

    section = "speculative decoding"

    num_speculative_tokens: int = Field(
        4, ge=1, le=16, title="draft tokens a step, at most",
        description="with decoding=ngram or draft: the most draft tokens a request proposes for one step; the target "
                    "verifies them and samples one more in the same forward pass. A request whose drafts keep "
                    "failing proposes fewer, down to none for a while",
    )
    prompt_lookup_max: int = Field(
        4, ge=1, le=32, title="longest n-gram the proposer matches",
        description="with decoding=ngram: the longest suffix of a request's tokens looked up among its earlier "
                    "tokens (prompt and output); the longest one found wins",
    )
    prompt_lookup_min: int = Field(
        2, ge=1, le=32, title="shortest n-gram the proposer matches",
        description="with decoding=ngram: the shortest suffix looked up; no match of at least this many tokens "
                    "means no draft (a plain decode step)",
    )

    speculative_model: str | None = Field(
        None, title="draft model folder",
        description="with decoding=draft: a smaller model's checkpoint folder (or .gguf) with the target's tokenizer; "
                    "it runs beside the target on the same device, its KV cache in the target's blocks, and proposes "
                    "its greedy tokens",
    )

    @field_validator("prompt_lookup_min")
    @classmethod
    def _min_not_above_max(cls, value: int, info: ValidationInfo) -> int:
        longest = info.data.get("prompt_lookup_max")
        if longest is not None and value > longest:
            raise ValueError(f"prompt_lookup_min ({value}) is above prompt_lookup_max ({longest}); lower the first "
                             f"or raise the second")
        return value
