"""Which code the layers run: the torch reference on the CPU, and the core works without triton."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import torch

from infer_core.layers import fused
from infer_core.layers.activation import SiluAndMul
from infer_core.layers.norm import RMSNorm


def test_cpu_tensors_take_the_torch_path():
    assert fused.RMS_NORM is fused.ROTARY is fused.SILU_AND_MUL is fused.FusedImpl.TRITON  # the default
    assert not fused.use_triton(fused.FusedImpl.TRITON, torch.zeros(1))
    assert RMSNorm(4, 1e-6, dtype=torch.float32).impl is fused.FusedImpl.TRITON
    assert SiluAndMul().impl is fused.FusedImpl.TRITON


def test_layers_run_without_triton_installed():
    """``import triton`` failing (as where it is not installed) leaves the layers working on the CPU."""
    program = textwrap.dedent("""
        import sys
        sys.modules["triton"] = None  # any import of triton now raises ImportError
        import torch
        from infer_core.layers import fused
        from infer_core.layers.activation import SiluAndMul
        from infer_core.layers.norm import RMSNorm
        from infer_core.layers.rotary import RotaryEmbedding
        from infer_core.models.config import RopeConfig
        assert not fused.triton_available() and not any(fused.available().values())
        out, res = RMSNorm(8, 1e-6, dtype=torch.float32)(torch.ones(2, 8), torch.ones(2, 8))
        assert torch.allclose(out, torch.ones(2, 8)) and torch.equal(res, torch.full((2, 8), 2.0))
        assert SiluAndMul()(torch.zeros(3, 4)).shape == (3, 2)
        q, k = RotaryEmbedding(8, RopeConfig(theta=1e4), 16, 16)(torch.arange(2), torch.ones(2, 2, 8),
                                                                 torch.ones(2, 1, 8))
        assert q.shape == (2, 2, 8) and k.shape == (2, 1, 8)
        print("OK")
    """)
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "OK", done.stderr
