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
