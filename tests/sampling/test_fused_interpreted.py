"""The fused sampling kernel in Triton's interpreter on the CPU, at small shapes.

Each check runs in a subprocess with ``TRITON_INTERPRET=1``: the interpreter must not be switched
on for the whole core test process (kernels decorated after that would all be interpreted). The
interpreter is single-threaded Python, so the module starts every selected check up front, one
process per core at a time (per core of this xdist worker's share), and each test waits for its own check's result.
"""

from __future__ import annotations

import os
import subprocess
import sys
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest

pytest.importorskip("triton")

CHECKS = Path(__file__).with_name("fused_checks.py")
KERNEL_CHECKS = Path(__file__).with_name("kernel_checks.py")

# The interpreter plans for one SM (fused._num_sms): splits double while rows * splits < 4, so one
# slice per row from 4 rows up, two for 2 or 3 rows; a tile is 2048 tokens. Longest first: they start first.
# The interpreter's time grows with programs and tiles, so each check takes the fewest tiles that
# still reach its cases: a 5000-token row is 3 tiles, which 2 slices share as 2 + 2, the second
# slice's first tile partial and its second wholly past the row (masked).
FUSED = [
    ["low_precision_matches_float", "2", "5000", "0"],  # 2 slices of 2 tiles (the last partial, then one past
    # the row), a few cases: the 700-token shape below gives each case in bf16
    ["ties_across_slices", "8000"],  # 2 slices of 2 tiles (the last partial): the kept ties end in either slice
    ["seeded_rows_ignore_the_batch", "4200"],  # 3 tiles, the last partial, a padded 4th in group_key
    ["matches_reference", "2", "5000"],  # several slices per row
    ["low_precision_matches_float", "12", "700"],  # bf16/fp16 logits read as they are
    ["matches_reference", "48", "700"],  # one slice per row
    ["masked_rows", "2", "5000"],  # 2 slices a row: grammar-masked rows leave a whole slice -inf
]
KERNEL_PARTS = [
    ["split_plans_agree", "6", "5000"],
    ["cut_bounds_keep_the_winner", "3000"],
    ["bounds_keep_the_winner", "3000"],
    ["unseeded_rows_follow_the_generator", "2100"],
    ["uniform_temperature", "5000"],
    ["argmax_matches_torch", "8", "5000"],  # 3 tiles: 1, 2 and 3 programs per row
    ["place_tokens", "1500"],  # more rows than one loop iteration
]
SCRIPTS = {"test_fused_kernel_interpreted": CHECKS, "test_kernel_parts_interpreted": KERNEL_CHECKS}


def _run_interpreted(script: Path, check: tuple[str, ...]) -> subprocess.CompletedProcess:
    env = dict(os.environ, TRITON_INTERPRET="1", CUDA_VISIBLE_DEVICES="")
    return subprocess.run([sys.executable, "-W", "ignore", str(script), *check], capture_output=True, text=True,
                          env=env, timeout=600)


@pytest.fixture(scope="module")
def interpreted(request):
    """(script, check) -> the future run of every check selected in this module, all submitted at once."""
    selected = [(SCRIPTS[item.originalname], tuple(item.callspec.params["check"]))
                for item in request.session.items if getattr(item, "module", None) is request.module]
    cores = len(os.sched_getaffinity(0)) // int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))  # this worker's
    pool = ThreadPoolExecutor(max_workers=max(1, cores))
    runs: dict[tuple[Path, tuple[str, ...]], Future] = {key: pool.submit(_run_interpreted, *key) for key in selected}
    yield lambda script, check: runs.get((script, tuple(check))) or pool.submit(_run_interpreted, script, tuple(check))
    pool.shutdown(wait=True, cancel_futures=True)


def _assert_ok(result: subprocess.CompletedProcess) -> None:
    assert result.returncode == 0 and result.stdout.strip().endswith("ok"), result.stdout + result.stderr


@pytest.mark.parametrize("check", FUSED, ids=lambda c: "-".join(c))
def test_fused_kernel_interpreted(check, interpreted):
    _assert_ok(interpreted(CHECKS, check).result())


@pytest.mark.parametrize("check", KERNEL_PARTS, ids=lambda c: "-".join(c))
def test_kernel_parts_interpreted(check, interpreted):
    _assert_ok(interpreted(KERNEL_CHECKS, check).result())
