"""How far an FP8 GEMM on Hopper's tensor cores lands from float32 sums (CPU emulation).

``torch._scaled_mm`` (row-wise scales, ``use_fast_accum=False``) multiplies e4m3 values on the FP8 tensor
cores: each MMA adds 32 products to a partial sum after aligning all 33 addends to the largest exponent among
them and keeping about 14 bits below it (the DeepSeek-V3 report measures "around 14 bits"), and CUTLASS adds
that partial sum into a float32 accumulator every 4 MMAs (128 columns), starting the next one from zero. This
script emulates exactly that in float64 with ``--bits`` kept bits, on the operands of
``plugins/quant_w8a8/tests/test_gemm.py::test_cuda_linear_paths_at_qwen3_8b_shapes`` (W 6144 x 4096, per-row
FP8, bfloat16 x and bias), and reports the accumulation error against exact sums and how many outputs break
the single-rounding bound ``|got - ref| <= 0.02 + 2**-7 |ref|``. At 14 bits it reproduces the H100's count
(9 of 98,304 outputs at 16 rows), at 13 bits it gives some 60 times more: the test's tolerance comes from here.

    python -m benchmarks.fp8_accumulation [--rows 16] [--cols 1536] [--bits 13 14] [--out DIR]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from benchmarks.common import write_result

MMA_K = 32  # e4m3 products one Hopper wgmma adds
PROMOTION_MMAS = 4  # CUTLASS's FP8 mainloop: partial sums into float32 every 4 MMAs


def emulated_sums(xq: torch.Tensor, wq: torch.Tensor, bits: int) -> torch.Tensor:
    """float64 ``xq @ wq^T`` as the FP8 tensor cores sum it: per MMA, the addends truncated to multiples of
    ``2**(E - bits)`` (E: the exponent of the largest addend), per ``PROMOTION_MMAS`` MMAs a float32 add."""
    xf, wf = xq.double(), wq.double()
    k = xf.shape[1]
    acc = torch.zeros(xf.shape[0], wf.shape[0], dtype=torch.float64)
    for start in range(0, k, MMA_K * PROMOTION_MMAS):
        partial = torch.zeros_like(acc)
        for k0 in range(start, min(k, start + MMA_K * PROMOTION_MMAS), MMA_K):
            addends = torch.cat([xf[:, None, k0:k0 + MMA_K] * wf[None, :, k0:k0 + MMA_K], partial[..., None]], -1)
            exponent = torch.frexp(addends.abs().amax(-1, keepdim=True))[1]
            step = torch.ldexp(torch.ones_like(addends), exponent - bits)
            partial = (torch.trunc(addends / step) * step).sum(-1)
        acc = (acc.float() + partial.float()).double()
    return acc


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--cols", type=int, default=1536, help="the first output columns of the 6144 (time)")
    parser.add_argument("--bits", type=int, nargs="+", default=[13, 14])
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "plugins/quant_w8a8/tests"))
    from infer_quant_w8a8.quantize import quantize_activations, reference_linear
    from infer_quant_w8a8.schemes import QuantDtype, online_scheme
    from test_gemm import _operands

    scheme = online_scheme(QuantDtype.FP8)
    x, wq, scale, bias = _operands(args.rows, 6144, 4096, scheme, "cpu")
    wq, scale, bias = wq[: args.cols], scale[: args.cols], bias[: args.cols]
    xq, x_scale = quantize_activations(x, scheme.activation)
    scales = x_scale.double() * scale.double().view(1, -1)
    exact = (xq.double() @ wq.double().T) * scales
    reference = reference_linear(x, wq, scale, scheme, bias).float()
    rows = []
    for bits in args.bits:
        sums = emulated_sums(xq, wq, bits) * scales
        got = (sums + bias.double()).to(torch.bfloat16).float()  # the epilogue's one rounding
        diff = (got - reference).abs()
        rows.append({"bits": bits, "outputs": diff.numel(),
                     "accumulation_error_rms": round(float((sums - exact).pow(2).mean().sqrt()), 5),
                     "accumulation_error_max": round(float((sums - exact).abs().max()), 5),
                     "beyond_single_rounding_bound": int((diff > 0.02 + 2**-7 * reference.abs()).sum()),
                     "max_abs_diff": float(diff.max())})
        print(rows[-1], flush=True)
    if args.out is not None:
        settings = {"rows": args.rows, "cols": args.cols, "k": 4096, "mma_k": MMA_K, "promotion_mmas": PROMOTION_MMAS}
        print("wrote", write_result("fp8-accumulation-cpu", settings, rows, args.out), flush=True)


if __name__ == "__main__":
    main()
