"""The fused sampling kernel in Triton's interpreter on the CPU, at small shapes.

Each check runs in a subprocess with ``TRITON_INTERPRET=1``: the interpreter must not be switched
on for the whole core test process (kernels decorated after that would all be interpreted).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")

CHECKS = Path(__file__).with_name("fused_checks.py")
KERNEL_CHECKS = Path(__file__).with_name("kernel_checks.py")


def _run_interpreted(script: Path, check: list[str]) -> None:
    env = dict(os.environ, TRITON_INTERPRET="1", CUDA_VISIBLE_DEVICES="")
    result = subprocess.run([sys.executable, "-W", "ignore", str(script), *check], capture_output=True, text=True,
                            env=env, timeout=600)
    assert result.returncode == 0 and result.stdout.strip().endswith("ok"), result.stdout + result.stderr


@pytest.mark.parametrize("check", [
    ["matches_reference", "48", "700"],  # one slice per row
    ["matches_reference", "2", "9000"],  # several slices per row
    ["ties_across_slices", "20000"],
    ["seeded_rows_ignore_the_batch", "12000"],
    ["low_precision_matches_float", "12", "700"],  # bf16/fp16 logits read as they are
    ["low_precision_matches_float", "2", "9000"],
], ids=lambda c: "-".join(c))
def test_fused_kernel_interpreted(check):
    _run_interpreted(CHECKS, check)


@pytest.mark.parametrize("check", [
    ["argmax_matches_torch", "8", "5000"],  # 3 tiles: 1, 2 and 3 programs per row
    ["split_plans_agree", "6", "5000"],
    ["bounds_keep_the_winner", "3000"],
    ["unseeded_rows_follow_the_generator", "2100"],
    ["uniform_temperature", "5000"],
    ["place_tokens", "1500"],  # more rows than one loop iteration
], ids=lambda c: "-".join(c))
def test_kernel_parts_interpreted(check):
    _run_interpreted(KERNEL_CHECKS, check)
