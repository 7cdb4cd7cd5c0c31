"""Which code the layers run, decided when each is built: the torch reference on the CPU, our kernels where
``fused.runs_triton`` allows them; and the core works without triton."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch

from infer_core.layers import fused
from infer_core.layers.activation import SiluAndMul
from infer_core.layers.norm import ResidualRMSNorm, RMSNorm
from infer_core.layers.rotary import RotaryEmbedding
from infer_core.layers.unquantized import UnquantizedLinearMethod
from infer_core.models.config import RopeConfig


def build_layers():
    rotary = RotaryEmbedding(8, RopeConfig(theta=1e4), 16, 16)
    method = UnquantizedLinearMethod()
    method.create_weights(torch.nn.Module(), 8, [4], torch.bfloat16)
    return RMSNorm(8, 1e-6, dtype=torch.bfloat16), SiluAndMul(), rotary, method


def test_defaults():
    assert fused.RMS_NORM is fused.ROTARY is fused.SILU_AND_MUL is fused.FusedImpl.TRITON
    assert fused.QK_NORM_ROPE is fused.GEMV is fused.NORM_GEMV is fused.FusedImpl.TRITON
    assert fused.TRITON_DEVICES == ("cuda",)


def test_layers_built_on_the_cpu_never_take_triton(monkeypatch):
    """Even in a process that runs Triton's interpreter (as the fused tests do): the CPU is not listed."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    norm, act, rotary, method = build_layers()
    assert not (norm.triton or act.triton or rotary.triton or method.gemv)
    # and they run the torch code: a kernel module that fails to import is never reached
    for module in ("rms_norm", "silu_and_mul", "rotary", "gemv"):
        monkeypatch.setitem(sys.modules, f"infer_core.layers.fused.{module}", None)
    x = torch.randn(2, 8).to(torch.bfloat16)
    assert torch.equal(norm(x), norm.forward_torch(x))
    assert torch.equal(act(x), act.forward_torch(x))
    q, k = torch.randn(2, 2, 8), torch.randn(2, 1, 8)
    assert all(torch.equal(a, b) for a, b in zip(rotary(torch.arange(2), q, k),
                                                  rotary.forward_torch(torch.arange(2), q, k)))
    normed, residual = ResidualRMSNorm(8, 1e-6, dtype=torch.bfloat16)(x, None)
    assert isinstance(normed, torch.Tensor) and residual is x


def test_the_rule_is_read_when_a_layer_is_built(monkeypatch):
    """Listing the CPU takes it only under the interpreter; a layer keeps what it chose when built."""
    monkeypatch.setattr(fused, "TRITON_DEVICES", ("cuda", "cpu"))
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert not fused.runs_triton(fused.FusedImpl.TRITON, "cpu")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    if not fused.triton_available():
        pytest.skip("triton is not installed")
    assert fused.runs_triton(fused.FusedImpl.TRITON, "cpu") and not fused.runs_triton(fused.FusedImpl.TORCH, "cpu")
    assert not fused.runs_triton(fused.FusedImpl.TRITON, "meta")
    norm, act, rotary, method = build_layers()
    assert norm.triton and act.triton and rotary.triton and method.gemv
    monkeypatch.setattr(fused, "RMS_NORM", fused.FusedImpl.TORCH)
    assert not RMSNorm(8, 1e-6, dtype=torch.bfloat16).triton and norm.triton
    float_method = UnquantizedLinearMethod()
    float_method.create_weights(torch.nn.Module(), 8, [4], torch.float32)
    assert not float_method.gemv  # the GEMV runs half precision only


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
        assert not fused.runs_triton(fused.FusedImpl.TRITON, "cuda")
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
