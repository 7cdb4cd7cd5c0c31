"""``benchmarks.quant_decode`` with the core's norm fusions off (``fused.NORM_GEMV`` = torch, read when layers are
built): W8A8 layers then run the norm kernel and the plain W8 GEMV, as before the W8 GEMV took the norm."""
import runpy
import sys

from infer_core.layers import fused

fused.NORM_GEMV = fused.FusedImpl.TORCH
sys.argv[0] = "quant_decode"
runpy.run_module("benchmarks.quant_decode", run_name="__main__")
