"""A step planned over a greedy verify step still running, made exact: the one-launch Triton kernel in Triton's
interpreter (a subprocess: the interpreter must not be on for the whole test process) against the torch form the
CPU runs and the definition (``kept_drafts_check.py``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")


def test_kernel_and_torch_form_match_the_definition():
    env = dict(os.environ, TRITON_INTERPRET="1", CUDA_VISIBLE_DEVICES="")
    done = subprocess.run([sys.executable, str(Path(__file__).with_name("kept_drafts_check.py"))], env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stdout[-2000:] + done.stderr[-4000:]


def test_only_attention_reading_lengths_on_the_device_is_planned_over_verify_steps():
    """The runner moves a step planned over a verify step back in the device's buffers only: the torch backend,
    which reads the host's lengths, may be planned over one on the CPU alone (one buffer for both there)."""
    from infer_core.builtin.attention_torch import TorchAttentionBackend
    from infer_core.runner.accepted_drafts import may_plan_over_verify_steps

    torch_attention = TorchAttentionBackend.capabilities(None)
    assert may_plan_over_verify_steps("cpu", torch_attention) and not may_plan_over_verify_steps("cuda", torch_attention)
    for module in ("infer_attention_triton.capabilities", "infer_attention_flash.capabilities"):
        capabilities = pytest.importorskip(module).CAPABILITIES
        assert may_plan_over_verify_steps("cuda", capabilities)
