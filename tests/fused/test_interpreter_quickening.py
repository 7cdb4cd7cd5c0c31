"""``quicken_triton_interpreter`` (applied to every test process by the root conftest): a kernel whose loop calls
a ``@triton.jit`` helper patches the language once per launch, and computes what it computed before."""

from __future__ import annotations

import os

import pytest
import torch

triton = pytest.importorskip("triton")
import triton.language as tl  # noqa: E402

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="the interpreter's behaviour")


@triton.jit
def _scaled(x, scale):
    return x * scale + 1.0


@triton.jit
def _helper_loop_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr, STEPS: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    acc = tl.load(x_ptr + offsets, mask=mask, other=0.0)
    for step in range(STEPS):
        acc = _scaled(acc, 0.5)
    tl.store(out_ptr + offsets, acc, mask=mask)


def test_a_helper_called_in_a_loop_patches_the_language_once_per_launch(monkeypatch):
    from triton.runtime import interpreter

    assert getattr(interpreter, "_infer_quickened", False), "the root conftest quickens the interpreter"
    scopes = []
    original_init = interpreter._LangPatchScope.__init__

    def counting_init(self, *args, **kwargs):
        scopes.append(self)
        original_init(self, *args, **kwargs)

    monkeypatch.setattr(interpreter._LangPatchScope, "__init__", counting_init)
    x = torch.randn(300)
    out = torch.empty_like(x)
    _helper_loop_kernel[(3,)](x, out, x.numel(), BLOCK=128, STEPS=6)
    expected = x.clone()
    for _ in range(6):
        expected = expected * 0.5 + 1.0
    torch.testing.assert_close(out, expected)
    assert len(scopes) == 1, f"{len(scopes)} patchings of triton.language in one launch of 3 programs x 6 calls"
