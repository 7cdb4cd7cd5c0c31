"""One decode step's projections on 8-bit weights (W8A8's decode path), back to back in one CUDA graph.

Like ``benchmarks.gemv --step`` (every layer its own weights, the whole model read once, PDL, L2 flushed before
each replay) for a model quantized per channel to int8 or e4m3 (``infer_quant_w8a8.quantize``), as the layers run
it at 1-2 rows: per layer the input norm's kernel and the W8 GEMV of qkv, o, the post-attention norm, gate_up
and the SiLU kernel, down; then the final norm and the bf16 LM head. Once per ``--early-w`` value of
``infer_quant_w8a8.gemv.EARLY_W`` (where a W8 GEMV program reads its first W tile: after the PDL wait, before it
into registers, or before it into L2); ``max_rel_diff`` is against the first value's logits.

    python -m benchmarks.w8_step --model Qwen3-8B --dtypes int8 fp8 --rows 1 2 --early-w 0 1 2
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from benchmarks.attention import copy_bandwidth, graph_ms
from benchmarks.common import versions, write_result
from benchmarks.gemv import CONFIGS, DEVICE, DTYPE, GB
from infer_core.layers.fused.gemv import choose_config, gemv
from infer_core.layers.fused.rms_norm import rms_norm
from infer_core.layers.fused.silu_and_mul import silu_and_mul
from infer_core.models.config import load_model_config


class W8DecodeStep:
    def __init__(self, model: str, dtype: str) -> None:
        from infer_quant_w8a8.quantize import quantize_weight
        from infer_quant_w8a8.schemes import QuantDtype, WeightFormat

        c = load_model_config(CONFIGS / model)
        gen = torch.Generator(device=DEVICE).manual_seed(0)
        h, q, kv, inter = c.hidden_size, c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim, c.intermediate_size
        fmt = WeightFormat(QuantDtype(dtype))

        def weight(n: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
            return quantize_weight(torch.randn(n, k, device=DEVICE, generator=gen) / k**0.5, fmt)

        def norm() -> torch.Tensor:
            return (1 + 0.1 * torch.randn(h, device=DEVICE, generator=gen)).to(DTYPE)

        self.layers = [dict(in_norm=norm(), qkv=weight(q + 2 * kv, h), o=weight(h, q), post_norm=norm(),
                            gate_up=weight(2 * inter, h), down=weight(h, inter)) for _ in range(c.num_layers)]
        self.final_norm = norm()
        self.lm_head = (torch.randn(c.vocab_size, h, device=DEVICE, generator=gen) / h**0.5).to(DTYPE)
        self.hidden_size, self.q_size = h, q
        tensors = [t for layer in self.layers for v in layer.values() for t in (v if isinstance(v, tuple) else (v,))]
        self.num_bytes = sum(t.numel() * t.element_size() for t in tensors + [self.final_norm, self.lm_head])
        self.lm_head_tiles = choose_config(c.vocab_size, h, 2, torch.cuda.get_device_properties(0).multi_processor_count)

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        from infer_quant_w8a8.gemv import w8_gemv

        hidden = x
        for w in self.layers:
            normed, residual = rms_norm(hidden, w["in_norm"], 1e-6, residual)
            qkv = w8_gemv(normed, *w["qkv"])
            o = w8_gemv(qkv[:, :self.q_size], *w["o"])  # stands in for the attention output
            normed, residual = rms_norm(o, w["post_norm"], 1e-6, residual)
            hidden = w8_gemv(silu_and_mul(w8_gemv(normed, *w["gate_up"])), *w["down"])
        normed, _ = rms_norm(hidden, self.final_norm, 1e-6, residual)
        return gemv(normed, self.lm_head, config=self.lm_head_tiles)


def main() -> None:
    from infer_quant_w8a8 import gemv as w8

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="Qwen3-8B")
    parser.add_argument("--dtypes", nargs="+", default=["int8", "fp8"])
    parser.add_argument("--rows", nargs="+", type=int, default=[1, 2])
    parser.add_argument("--early-w", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    copy_bw = copy_bandwidth()
    results = []
    for dtype in args.dtypes:
        step = W8DecodeStep(args.model, dtype)
        floor_us = step.num_bytes / copy_bw * 1e6
        for num_rows in args.rows:
            gen = torch.Generator(device=DEVICE).manual_seed(num_rows)
            x, residual = (torch.randn(2, num_rows, step.hidden_size, device=DEVICE, generator=gen)).to(DTYPE)
            want, line = None, []
            for early in args.early_w:
                w8.EARLY_W = early
                got = step.forward(x, residual).float()
                want = got if want is None else want
                err = float((got - want).abs().max() / want.abs().max())
                t_us = 1e3 * graph_ms(lambda: step.forward(x, residual), reps=args.reps)
                results.append({"model": args.model, "dtype": dtype, "num_rows": num_rows, "early_w": early,
                                "time_us": round(t_us, 1), "bytes": step.num_bytes,
                                "copy_bw_share": round(floor_us / t_us, 3), "max_rel_diff": err})
                line.append(f"early {early}: {t_us:8.1f} us {floor_us / t_us:5.1%} diff {err:.1e}")
            print(f"{args.model} {dtype} M={num_rows} | " + " | ".join(line) + f" | floor {floor_us:8.1f} us",
                  flush=True)
        del step
        torch.cuda.empty_cache()
    settings = {"rows": args.rows, "model": args.model, "dtypes": args.dtypes,
                "copy_bandwidth_gb_s": round(copy_bw / GB, 1),
                "timing": f"CUDA-graph replay of one decode step's projections, L2 flushed, median of {args.reps}",
                "versions": versions("triton")}
    if args.out is not None:
        print(f"wrote {write_result('w8-step', settings, results, args.out)}")


if __name__ == "__main__":
    main()
