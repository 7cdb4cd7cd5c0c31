"""``benchmarks.tp_rank_share``: the share of a model one tensor-parallel rank holds."""

from __future__ import annotations

import pytest

from benchmarks.tp_rank_share import share_overrides
from infer_core.testing import REAL_CONFIGS


def test_the_share_of_one_rank_of_two_divides_heads_mlp_and_vocabulary():
    full = REAL_CONFIGS["Qwen3-8B"]
    share = share_overrides("Qwen3-8B", 2)
    assert share["num_attention_heads"] * 2 == full["num_attention_heads"]
    assert share["num_key_value_heads"] * 2 == full["num_key_value_heads"]
    assert share["intermediate_size"] * 2 == full["intermediate_size"]
    assert share["vocab_size"] * 2 == full["vocab_size"]
    assert share["eos_token_id"] < share["vocab_size"]  # the full model's eos id is past the share's vocabulary


def test_a_split_that_does_not_divide_is_refused():
    with pytest.raises(ValueError, match="do not divide by 3"):
        share_overrides("Qwen3-8B", 3)
