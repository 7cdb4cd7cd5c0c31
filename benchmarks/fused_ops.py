"""The per-layer elementwise ops on one GPU: eager torch, torch.compile of the same code, our Triton kernels.

Each op is the layer's own torch code (``forward_torch``: what the CPU runs), that code under
``torch.compile(dynamic=False, fullgraph=True)`` compiled afresh for each shape (compile time
reported apart), and the Triton kernel the layer dispatches to on CUDA. ``qk_norm_rope`` (Qwen3's
q-norm, k-norm and rotary, one launch in place on the qkv views) is also timed as the three
launches it replaces (``triton-separate``: RMSNorm on q, on k, then rotary). Shapes: Qwen3-0.6B and
Qwen3-8B in bfloat16, at 1 to 8192 tokens. Figures per cell:

- ``time_us``: one CUDA-graph replay of the op (no host launch cost), median of 50, L2 flushed
  before each, so inputs come from HBM;
- ``eager_us``: ``triton.testing.do_bench`` median of plain calls (host launches included);
- ``gb_s``: the bytes the op must move (inputs read once, outputs written once; the same count for
  every system) over ``time_us``, and ``copy_bw_share`` that over the device-to-device copy
  bandwidth measured in the same run;
- ``max_ulps``: the largest difference from eager torch, in bfloat16 steps.

    python3 -m benchmarks.fused_ops --out DIR [--quick] [--no-compile] [--ops a,b] [--tokens 1,8,64]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from benchmarks.timing import bench_ms, graph_ms
from benchmarks.common import versions, write_result
from infer_core.layers import fused
from infer_core.layers.activation import SiluAndMul
from infer_core.layers.fused.qk_norm_rope import qk_norm_rope_inplace
from infer_core.layers.fused.rms_norm import rms_norm
from infer_core.layers.fused.rotary import rotary_inplace
from infer_core.layers.fused.silu_and_mul import silu_and_mul
from infer_core.layers.norm import RMSNorm
from infer_core.layers.rotary import RotaryEmbedding
from infer_core.models.config import RopeConfig

DTYPE = torch.bfloat16
TOKENS = (1, 8, 64, 256, 2048, 8192)
OPS = ("rms_norm_residual", "qk_norm_q", "rotary_qk", "silu_and_mul", "qk_norm_rope")
GB = 1e9


@dataclass(frozen=True, slots=True)
class ModelShape:
    name: str
    hidden: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate: int


MODELS = (ModelShape("qwen3-0.6b", 1024, 16, 8, 128, 3072), ModelShape("qwen3-8b", 4096, 32, 8, 128, 12288))


@dataclass(slots=True)
class Case:
    """One op at one shape: the torch reference, our kernel, and the bytes either must move.

    ``separate``: the Triton launches the kernel fuses, where it fuses several; ``restore`` puts
    back the inputs an in-place kernel rewrote, before each system's result is checked.
    """

    op: str
    reference: Callable[[], object]
    triton: Callable[[], object]
    num_bytes: int
    separate: Callable[[], object] | None = None
    restore: Callable[[], object] | None = None


def bench_us(fn) -> float:
    return 1e3 * bench_ms(fn)


def graph_us(fn, reps: int = 50) -> float:
    """Median microseconds of ``fn`` replayed from a CUDA graph, L2 flushed before each replay."""
    return 1e3 * graph_ms(fn, reps)


def copy_bandwidth_gb_s() -> float:
    """Device-to-device copy of 1 GiB, bytes read + written per second."""
    src = torch.empty(1 << 30, dtype=torch.int8, device="cuda")
    dst = torch.empty_like(src)
    return 2 * src.numel() / (bench_us(lambda: dst.copy_(src)) * 1e-6) / GB


def max_ulps(actual, expected) -> float:
    """Largest difference in steps of the dtype at |expected| (floored at 1/256 of the mean magnitude)."""
    pairs = zip(actual, expected) if isinstance(actual, tuple) else [(actual, expected)]
    worst = 0.0
    for a, e in pairs:
        a, e = a.double(), e.double()
        floor = max(float(e.abs().mean()) / 256, torch.finfo(DTYPE).tiny)
        _, exponent = torch.frexp(torch.clamp(e.abs(), min=floor))
        step = torch.ldexp(torch.full_like(e, torch.finfo(DTYPE).eps / 2), exponent)
        worst = max(worst, float(((a - e).abs() / step).max()))
    return worst


def qk_norm_rope_case(shape: ModelShape, num_tokens: int) -> Case:
    """Qwen3's q/k norm + rotary on strided views of a fused qkv output: one launch vs the three."""
    el = torch.finfo(DTYPE).bits // 8
    t, d = num_tokens, shape.head_dim
    q_norm, k_norm = (RMSNorm(d, 1e-6, dtype=DTYPE).cuda() for _ in range(2))
    for norm in (q_norm, k_norm):
        norm.weight.data = torch.randn(d, device="cuda").to(DTYPE)
    q_size, kv_size = shape.num_heads * d, shape.num_kv_heads * d
    pristine = torch.randn(t, q_size + 2 * kv_size, device="cuda").to(DTYPE)
    qkv = pristine.clone()
    q_view, k_view, _ = qkv.split([q_size, kv_size, kv_size], dim=-1)
    q, k = q_view.reshape(t, shape.num_heads, d), k_view.reshape(t, shape.num_kv_heads, d)
    rotary = RotaryEmbedding(d, RopeConfig(theta=1e6), 40960, 40960).cuda()
    positions = torch.randint(0, 40960, (t,), device="cuda")
    cache, rot_dim = rotary.cos_sin_cache, rotary.rot_dim

    def separate():  # what LlamaAttention runs without the fused op: two norms (new tensors), rotary on them
        return rotary_inplace(positions, rms_norm(q, q_norm.weight, q_norm.eps), rms_norm(k, k_norm.weight, k_norm.eps),
                              cache, rot_dim)

    return Case(
        "qk_norm_rope",
        lambda: rotary.forward_torch(positions, q_norm.forward_torch(q), k_norm.forward_torch(k)),
        lambda: qk_norm_rope_inplace(positions, q, k, q_norm.weight, k_norm.weight, q_norm.eps, cache, rot_dim),
        2 * t * (shape.num_heads + shape.num_kv_heads) * d * el + 2 * d * el + t * (rot_dim * 4 + 8),
        separate=separate,
        restore=lambda: qkv.copy_(pristine),
    )


def make_cases(shape: ModelShape, num_tokens: int) -> list[Case]:
    el = torch.finfo(DTYPE).bits // 8
    t, h = num_tokens, shape.hidden
    norm = RMSNorm(h, 1e-6, dtype=DTYPE).cuda()
    norm.weight.data = torch.randn(h, device="cuda").to(DTYPE)
    x, residual = (torch.randn(t, h, device="cuda").to(DTYPE) for _ in range(2))

    q_norm = RMSNorm(shape.head_dim, 1e-6, dtype=DTYPE).cuda()
    q_size, kv_size = shape.num_heads * shape.head_dim, shape.num_kv_heads * shape.head_dim
    qkv = torch.randn(t, q_size + 2 * kv_size, device="cuda").to(DTYPE)
    q_view, k_view, _ = qkv.split([q_size, kv_size, kv_size], dim=-1)
    q = q_view.reshape(t, shape.num_heads, shape.head_dim)
    k = k_view.reshape(t, shape.num_kv_heads, shape.head_dim)

    rotary = RotaryEmbedding(shape.head_dim, RopeConfig(theta=1e6), 40960, 40960).cuda()
    positions = torch.randint(0, 40960, (t,), device="cuda")
    rot_dim = rotary.rot_dim
    gate_up = torch.randn(t, 2 * shape.intermediate, device="cuda").to(DTYPE)
    act = SiluAndMul()

    return [
        Case("rms_norm_residual", lambda: norm.forward_torch(x, residual),
             lambda: rms_norm(x, norm.weight, norm.eps, residual), (4 * t * h + h) * el),
        Case("qk_norm_q", lambda: q_norm.forward_torch(q), lambda: rms_norm(q, q_norm.weight, q_norm.eps),
             (2 * t * q_size + shape.head_dim) * el),
        Case("rotary_qk", lambda: rotary.forward_torch(positions, q, k),
             lambda: rotary_inplace(positions, q, k, rotary.cos_sin_cache, rot_dim),
             2 * t * (shape.num_heads + shape.num_kv_heads) * rot_dim * el + t * (rot_dim * 4 + 8)),
        Case("silu_and_mul", lambda: act.forward_torch(gate_up), lambda: silu_and_mul(gate_up),
             3 * t * shape.intermediate * el),
        qk_norm_rope_case(shape, num_tokens),
    ]


def compiled(fn) -> tuple[Callable[[], object], float]:
    """``fn`` under torch.compile for this one shape, and the seconds its first call took."""
    torch._dynamo.reset()  # a fresh cache per shape: no recompile limit, no dynamic-shape fallback
    cfn = torch.compile(fn, dynamic=False, fullgraph=True)
    start = time.perf_counter()
    cfn()
    torch.cuda.synchronize()
    return cfn, time.perf_counter() - start


def measure(case: Case, with_compile: bool, copy_bw: float) -> list[dict]:
    # rotary rewrites q and k in place: take the reference first, from the same inputs
    expected = case.reference()
    expected = tuple(e.clone() for e in expected) if isinstance(expected, tuple) else expected.clone()
    systems: list[tuple[str, Callable[[], object], float | None]] = [("torch-eager", case.reference, None)]
    if with_compile:
        fn, seconds = compiled(case.reference)
        systems.append(("torch-compile", fn, seconds))
    if case.separate is not None:
        systems.append(("triton-separate", case.separate, None))
    systems.append(("triton", case.triton, None))
    rows = []
    for system, fn, compile_s in systems:
        if case.restore is not None:
            case.restore()
        got = fn()
        err = max_ulps(got, expected)
        t_us = graph_us(fn)
        row = {"system": system, "time_us": round(t_us, 2), "eager_us": round(bench_us(fn), 2),
               "gb_s": round(case.num_bytes / (t_us * 1e-6) / GB, 1),
               "copy_bw_share": round(case.num_bytes / (t_us * 1e-6) / GB / copy_bw, 3), "max_ulps": err}
        if compile_s is not None:
            row["compile_s"] = round(compile_s, 2)
        rows.append(row)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=None, help="folder of the results JSON (default: results/)")
    parser.add_argument("--quick", action="store_true", help="1, 64 and 2048 tokens only")
    parser.add_argument("--no-compile", action="store_true", help="leave torch.compile out")
    parser.add_argument("--ops", default=None, help=f"comma-separated ops to run (default: all of {', '.join(OPS)})")
    parser.add_argument("--tokens", default=None, help=f"comma-separated token counts (default: {TOKENS})")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("benchmarks.fused_ops needs a CUDA device")
    tokens = tuple(int(t) for t in args.tokens.split(",")) if args.tokens else (1, 64, 2048) if args.quick else TOKENS
    ops = tuple(args.ops.split(",")) if args.ops else OPS
    if unknown := set(ops) - set(OPS):
        raise SystemExit(f"unknown ops {sorted(unknown)}; choose from {', '.join(OPS)}")
    copy_bw = copy_bandwidth_gb_s()
    results = []
    header = f"{'op':<18} {'model':<11} {'T':>5} | {'eager us':>9} {'compile us':>10} {'separate us':>11} " \
             f"{'triton us':>9} | {'triton GB/s':>11} {'share':>5} | {'vs eager':>8} {'vs compile':>10} " \
             f"{'vs separate':>11} | {'compile s':>9}"
    print(f"copy bandwidth {copy_bw:.0f} GB/s; times are CUDA-graph replays, L2 flushed\n{header}\n{'-' * len(header)}")
    nan = float("nan")
    for shape in MODELS:
        for num_tokens in tokens:
            for case in make_cases(shape, num_tokens):
                if case.op not in ops:
                    continue
                rows = measure(case, not args.no_compile, copy_bw)
                for row in rows:
                    results.append({"op": case.op, "model": shape.name, "num_tokens": num_tokens,
                                    "bytes": case.num_bytes, **row})
                by = {r["system"]: r for r in rows}
                tri, eager = by["triton"], by["torch-eager"]
                comp, sep = by.get("torch-compile"), by.get("triton-separate")
                print(f"{case.op:<18} {shape.name:<11} {num_tokens:>5} | {eager['time_us']:>9.2f} "
                      f"{comp['time_us'] if comp else nan:>10.2f} {sep['time_us'] if sep else nan:>11.2f} "
                      f"{tri['time_us']:>9.2f} | {tri['gb_s']:>11.0f} {tri['copy_bw_share']:>5.2f} | "
                      f"{eager['time_us'] / tri['time_us']:>7.2f}x "
                      f"{comp['time_us'] / tri['time_us'] if comp else nan:>9.2f}x "
                      f"{sep['time_us'] / tri['time_us'] if sep else nan:>10.2f}x | "
                      f"{comp['compile_s'] if comp else nan:>9.2f}", flush=True)
    settings = {"dtype": str(DTYPE).removeprefix("torch."), "tokens": list(tokens), "ops": list(ops),
                "models": [{"name": m.name, "hidden": m.hidden, "num_heads": m.num_heads,
                            "num_kv_heads": m.num_kv_heads, "head_dim": m.head_dim,
                            "intermediate": m.intermediate} for m in MODELS],
                "copy_bandwidth_gb_s": round(copy_bw, 1),
                "num_sms": torch.cuda.get_device_properties(0).multi_processor_count,
                "timing": "time_us: one CUDA-graph replay, median of 50, L2 flushed before each; eager_us: "
                          "triton.testing.do_bench median of plain calls (host launches included)",
                "compile": "torch.compile(dynamic=False, fullgraph=True) of forward_torch, dynamo reset per shape; "
                           "compile_s = first call",
                "layer_defaults": {"rms_norm": fused.RMS_NORM.value, "rotary": fused.ROTARY.value,
                                   "silu_and_mul": fused.SILU_AND_MUL.value, "qk_norm_rope": fused.QK_NORM_ROPE.value},
                "versions": versions("triton")}
    path = write_result("fused-ops", settings, results, args.out)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
