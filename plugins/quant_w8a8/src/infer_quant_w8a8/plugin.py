"""Registers the ``int8``, ``fp8`` and ``compressed-tensors`` quantizers; imports neither torch nor a kernel."""

from __future__ import annotations

from infer_core.hookspecs import hookimpl


@hookimpl
def register_quantizers(register):
    register("int8", "infer_quant_w8a8.quantizer:Int8Quantizer", aliases=("w8a8",))
    register("fp8", "infer_quant_w8a8.quantizer:FP8Quantizer", aliases=("w8a8-fp8",))
    register("compressed-tensors", "infer_quant_w8a8.quantizer:CompressedTensorsQuantizer",
             aliases=("compressed_tensors",))
