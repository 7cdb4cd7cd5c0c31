"""compressed-tensors' ``kv_cache_scheme``: llm-compressor's FP8 KV preset passes, other schemes are named errors."""

from __future__ import annotations

import pytest
from infer_core.interfaces import PluginError

from infer_quant_w8a8.kv_cache_scheme import check_kv_cache_scheme

# what llm-compressor writes for its FP8 KV preset (kv_cache_scheme in quantization_config)
FP8_KV = {"num_bits": 8, "type": "float", "strategy": "tensor", "dynamic": False, "symmetric": True,
          "group_size": None, "block_structure": None, "observer": "minmax", "actorder": None}


def test_fp8_per_layer_scales_pass():
    check_kv_cache_scheme(FP8_KV)
    check_kv_cache_scheme(None)


@pytest.mark.parametrize("change, named", [
    ({"type": "int"}, "type='int' (needs 'float')"),
    ({"strategy": "channel"}, "strategy='channel' (needs 'tensor')"),
    ({"num_bits": 4, "dynamic": True}, "num_bits=4 (needs 8), dynamic=True (needs False)"),
])
def test_other_schemes_are_named_errors(change, named):
    with pytest.raises(PluginError, match="kv_cache_scheme has " + named.replace("(", r"\(").replace(")", r"\)")):
        check_kv_cache_scheme({**FP8_KV, **change})
