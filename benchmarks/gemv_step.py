"""One decode step's projections back to back in one CUDA graph: ``python -m benchmarks.gemv --step``.

``--step`` times one decode step's projections as the decoder runs them at 1-2 rows, each layer with its
own weights (the whole model read once, as decode does), back to back in one CUDA graph with PDL: per
layer the fused input-norm + qkv, o, the fused post-norm + gate_up + SiLU, down; then the final norm
and the LM head (each launch reads what the one before wrote; attention, rotary and the rest are left
out). Once per ``--prefetch-steps`` value (default 0 1 2) and once without PDL; ``equal``: the logits
are those of prefetch 0 bit for bit. Needs the model's weights in GPU memory (Qwen3-8B: 15 GB).
"""

from __future__ import annotations

import functools
from dataclasses import replace

import torch

from benchmarks.timing import graph_ms
from benchmarks.common import versions, write_result
from benchmarks.gemv import CONFIGS, DEVICE, DTYPE, GB
from infer_core.layers import fused
from infer_core.layers.fused.gemv import choose_config, config_after_rms_norm, gemv
from infer_core.layers.fused.norm_gemv import rms_norm_gemv
from infer_core.layers.fused.rms_norm import rms_norm
from infer_core.models.config import load_model_config


class DecodeStep:
    """A decode step's projections of one model (module docstring, ``--step``): every layer's own weights."""

    def __init__(self, model: str) -> None:
        c = load_model_config(CONFIGS / model)
        gen = torch.Generator(device=DEVICE).manual_seed(0)
        h, q, kv, inter = c.hidden_size, c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim, c.intermediate_size

        def weight(n: int, k: int) -> torch.Tensor:
            return (torch.randn(n, k, device=DEVICE, generator=gen) / k**0.5).to(DTYPE)

        def norm() -> torch.Tensor:
            return (1 + 0.1 * torch.randn(h, device=DEVICE, generator=gen)).to(DTYPE)

        self.layers = [dict(in_norm=norm(), qkv=weight(q + 2 * kv, h), o=weight(h, q), post_norm=norm(),
                            gate_up=weight(2 * inter, h), down=weight(h, inter)) for _ in range(c.num_layers)]
        self.final_norm, self.lm_head = norm(), weight(c.vocab_size, h)
        self.hidden_size, self.q_size = h, q
        tensors = [t for layer in self.layers for t in layer.values()] + [self.final_norm, self.lm_head]
        self.num_bytes = sum(t.numel() * t.element_size() for t in tensors)
        sms = torch.cuda.get_device_properties(0).multi_processor_count
        self.tiles = {"qkv": config_after_rms_norm(q + 2 * kv, h, 2, sms), "o": choose_config(h, q, 2, sms),
                      "gate_up": config_after_rms_norm(2 * inter, h, 2, sms, silu=True),
                      "down": choose_config(h, inter, 2, sms),
                      "lm_head": choose_config(c.vocab_size, h, 2, sms)}

    def forward(self, x: torch.Tensor, residual: torch.Tensor, prefetch_steps: int,
                norm_tiles: dict | None = None) -> torch.Tensor:
        """``norm_tiles``: fields replaced in the fused chains' tiles (qkv, gate_up), e.g. ``programs_per_sm``."""
        cfg = {name: replace(tiles, prefetch_steps=prefetch_steps) for name, tiles in self.tiles.items()}
        for name in ("qkv", "gate_up"):
            cfg[name] = replace(cfg[name], **(norm_tiles or {}))
        hidden = x
        for w in self.layers:
            qkv, residual = rms_norm_gemv(hidden, w["in_norm"], 1e-6, w["qkv"], None, residual, config=cfg["qkv"])
            o = gemv(qkv[:, :self.q_size], w["o"], config=cfg["o"])  # stands in for the attention output
            act, residual = rms_norm_gemv(o, w["post_norm"], 1e-6, w["gate_up"], None, residual, silu=True,
                                          config=cfg["gate_up"])
            hidden = gemv(act, w["down"], config=cfg["down"])
        normed, _ = rms_norm(hidden, self.final_norm, 1e-6, residual)
        return gemv(normed, self.lm_head, config=cfg["lm_head"])


def norm_variant(spec: str) -> dict:
    """``--norm-variants`` names: ``ppsmN``, the fused chains' tiles at N programs an SM (0: one a block)."""
    if not (spec.startswith("ppsm") and spec[4:].isdigit()):
        raise SystemExit(f"--norm-variants: {spec!r} is not ppsmN (N programs an SM, 0: one program a block)")
    return {"programs_per_sm": int(spec[4:])}


def main_step(args, copy_bw: float) -> None:
    results = []
    for model in args.models:
        step = DecodeStep(model)
        floor_us = step.num_bytes / copy_bw * 1e6
        for num_rows in args.rows:
            gen = torch.Generator(device=DEVICE).manual_seed(num_rows)
            x, residual = (torch.randn(2, num_rows, step.hidden_size, device=DEVICE, generator=gen)).to(DTYPE)
            want = step.forward(x, residual, 0).view(torch.int16)
            variants = [(f"prefetch {s}", s, True, {}) for s in args.prefetch_steps] + [("no PDL", 0, False, {})]
            variants += [(spec, 0, True, norm_variant(spec)) for spec in args.norm_variants or ()]
            line = []
            for name, steps, pdl, norm_tiles in variants:
                run, pdl_before = functools.partial(step.forward, x, residual, steps, norm_tiles), fused.PDL
                fused.PDL = pdl  # read by use_pdl at each launch, so in the capture too
                try:
                    equal = torch.equal(run().view(torch.int16), want)
                    t_us = 1e3 * graph_ms(run, reps=args.reps)
                finally:
                    fused.PDL = pdl_before
                results.append({"model": model, "num_rows": num_rows, "system": name, "prefetch_steps": steps,
                                "pdl": pdl, "norm_tiles": norm_tiles, "time_us": round(t_us, 1),
                                "bytes": step.num_bytes, "equal": equal,
                                "gb_s": round(step.num_bytes / (t_us * 1e-6) / GB, 1),
                                "copy_bw_share": round(floor_us / t_us, 3)})
                line.append(f"{name}: {t_us:8.1f} us {floor_us / t_us:5.1%}{'' if equal else ' NOT EQUAL'}")
            results.append({"model": model, "num_rows": num_rows, "system": "floor", "time_us": round(floor_us, 1)})
            print(f"{model:<13} M={num_rows} | " + " | ".join(line) + f" | floor {floor_us:8.1f} us", flush=True)
        del step
        torch.cuda.empty_cache()
    settings = {"dtype": "bfloat16", "rows": args.rows, "models": args.models, "prefetch_steps": args.prefetch_steps,
                "copy_bandwidth_gb_s": round(copy_bw / GB, 1), "tiles": "config_after_rms_norm for qkv and gate_up "
                "(fused with their norms), choose_config for o, down and the LM head",
                "timing": f"CUDA-graph replay of one decode step's projections (all layers, distinct weights), "
                          f"L2 flushed before each replay, median of {args.reps}", "versions": versions("triton")}
    print(f"wrote {write_result('gemv-step', settings, results, args.out)}")
