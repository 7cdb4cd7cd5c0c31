"""Probe (issue 26, batch-1 x1.6): a W8 GEMV whose products run on tensor cores, against the plugin's W8 GEMV.

The plugin's W8 GEMV converts every weight to float32 and multiplies it on the FMA pipe (4 instructions a weight);
here each K step's chunk of x is quantized to the weights' 8-bit type (its own scale: per token and group of
BLOCK_K columns) and multiplied by the raw 8-bit tile in a ``tl.dot`` (x padded to 16 rows), the int32 / float32
products scaled by the chunk's scale and added in float32; the weight's row scales at the end.

Forms: ``swap`` (W tile [BN, BK] as the dot's A operand, x^T as B: the dot's M is BN, which Hopper's wgmma
takes from 64 on), ``plain`` (x [16, BK] as A, W^T as B).

One decode step's projections of Qwen3-8B (36 layers x qkv, o, gate_up, down; each layer its own weights, 7 GB
int8: no L2 reuse), back to back in a CUDA graph with PDL, per implementation; the copy floor beside it.

    PYTHONPATH=$PWD python benchmarks/results/w8-mma-probe-h100-2026-11-28/mma_probe.py
"""

from __future__ import annotations

import argparse
import json
import sys

import torch
import triton
import triton.language as tl

from infer_core.layers.fused import use_pdl
from infer_core.layers.fused.pdl import pdl_enter


@triton.jit
def _mma_gemv(x_ptr, w_ptr, s_ptr, y_ptr, N, K, stride_wn, W_INT8: tl.constexpr, SWAP: tl.constexpr,
              BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, USE_PDL: tl.constexpr):
    pdl_enter(USE_PDL)
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    w_rows = tl.minimum(cols, N - 1).to(tl.int64)
    offs_m = tl.arange(0, 16)
    if SWAP:
        acc = tl.zeros([BLOCK_N, 16], dtype=tl.float32)
    else:
        acc = tl.zeros([16, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        x = tl.load(x_ptr + k).to(tl.float32)
        amax = tl.max(tl.abs(x), axis=0)
        if W_INT8:
            s = tl.maximum(amax / 127.0, 1e-10)
            xq1 = tl.floor(x / s + 0.5)
            xq = tl.where(offs_m[:, None] == 0, xq1[None, :], 0.0).to(tl.int8)
        else:
            s = tl.maximum(amax / 448.0, 1e-10)
            xq = tl.where(offs_m[:, None] == 0, (x / s)[None, :], 0.0).to(tl.float8e4nv)
        w = tl.load(w_ptr + w_rows[:, None] * stride_wn + k[None, :])
        if SWAP:
            part = tl.dot(w, tl.trans(xq))
        else:
            part = tl.dot(xq, tl.trans(w))
        acc += part.to(tl.float32) * s
    if SWAP:
        y = tl.sum(tl.where(offs_m[None, :] == 0, acc, 0.0), axis=1)
    else:
        y = tl.sum(tl.where(offs_m[:, None] == 0, acc, 0.0), axis=0)
    y = y * tl.load(s_ptr + w_rows)
    tl.store(y_ptr + cols, y.to(y_ptr.dtype.element_ty), mask=cols < N)


def mma_gemv(x, w, s, out, cfg):
    n, k = w.shape
    pdl = use_pdl(x)
    bn, bk, warps, stages, swap = cfg
    _mma_gemv[(triton.cdiv(n, bn),)](x, w, s, out, n, k, w.stride(0), W_INT8=w.dtype == torch.int8, SWAP=swap,
                                     BLOCK_N=bn, BLOCK_K=bk, USE_PDL=pdl, num_warps=warps, num_stages=stages,
                                     launch_pdl=pdl)
    return out


def check_interpreted() -> None:
    """Small shapes on the CPU under TRITON_INTERPRET=1: the kernel against float32 math on the quantized x."""
    torch.manual_seed(0)
    n, k, bk = 40, 256, 64
    x = torch.randn(1, k)
    for dtype, qmax in ((torch.int8, 127.0), (torch.float8_e4m3fn, 448.0)):
        w32 = torch.randn(n, k)
        s = w32.abs().amax(1) / qmax
        wq = (w32 / s[:, None]).round().clamp(-qmax, qmax).to(dtype) if dtype == torch.int8 else \
            (w32 / s[:, None]).to(dtype)
        for swap in (True, False):
            out = torch.empty(n)
            mma_gemv(x, wq, s, out, (32, bk, 1, 1, swap))
            ref = x.reshape(-1) @ (wq.float() * s[:, None]).T
            err = float((out - ref).abs().max() / ref.abs().max())
            print(f"interpreted {dtype} swap={swap}: max rel diff to unquantized-x {err:.2e}")
            assert err < (3e-2 if dtype == torch.int8 else 8e-2), err  # e4m3 x: 3 mantissa bits


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--check", action="store_true", help="the interpreter check only")
    parser.add_argument("--out", default=None)
    parser.add_argument("--layers", type=int, default=36)
    args = parser.parse_args()
    if args.check:
        check_interpreted()
        return
    from benchmarks.timing import copy_bandwidth, graph_ms
    from infer_quant_w8a8.gemv import w8_gemv

    dev = "cuda"
    h, q, kv, inter = 4096, 4096, 1024, 12288
    shapes = {"qkv": (q + 2 * kv, h), "o": (h, q), "gate_up": (2 * inter, h), "down": (h, inter)}
    copy_bw = copy_bandwidth()
    results = []
    configs = [(bn, bk, w, st, sw) for sw in (True, False) for bn in (64, 128) for bk in (128, 256)
               for w in (4,) for st in (3, 4)] + [(128, 128, 8, 3, True), (256, 128, 8, 3, True)]
    for dtype in (torch.int8, torch.float8_e4m3fn):
        gen = torch.Generator(device=dev).manual_seed(0)
        layers = []
        for _ in range(args.layers):
            layer = {}
            for name, (n, k) in shapes.items():
                raw = torch.randint(-127, 128, (n, k), device=dev, dtype=torch.int8, generator=gen)
                wq = raw if dtype == torch.int8 else (raw.float() * (448 / 127)).to(dtype)
                layer[name] = (wq, torch.rand(n, 1, device=dev, generator=gen) * 1e-3 + 1e-4)
            layers.append(layer)
        nbytes = sum(w.numel() + s.numel() * 4 for layer in layers for w, s in layer.values())
        floor_us = nbytes / copy_bw * 1e6
        xs = {k: torch.randn(1, k, device=dev, generator=gen).to(torch.bfloat16) for k in (h, inter)}
        outs = {name: torch.empty(1, n, device=dev, dtype=torch.bfloat16) for name, (n, k) in shapes.items()}

        def current():
            for layer in layers:
                for name, (w, s) in layer.items():
                    w8_gemv(xs[w.shape[1]], w, s)

        def probe(cfg):
            def fn():
                for layer in layers:
                    for name, (w, s) in layer.items():
                        mma_gemv(xs[w.shape[1]], w, s[:, 0], outs[name], cfg)
            return fn

        # correctness of each config against the current GEMV on one layer
        ref = {name: w8_gemv(xs[w.shape[1]], w, s).float() for name, (w, s) in layers[0].items()}
        t = 1e3 * graph_ms(current, reps=20)
        print(f"{dtype} current: {t:8.1f} us, {floor_us / t:5.1%} of copy floor {floor_us:.1f} us", flush=True)
        results.append({"dtype": str(dtype), "impl": "current", "us": t, "floor_us": floor_us})
        for cfg in configs:
            try:
                errs = []
                for name, (w, s) in layers[0].items():
                    got = mma_gemv(xs[w.shape[1]], w, s[:, 0], outs[name], cfg).float()
                    errs.append(float((got - ref[name]).abs().max() / ref[name].abs().max()))
                t = 1e3 * graph_ms(probe(cfg), reps=20)
            except Exception as e:  # a config Triton cannot compile: say so and go on
                print(f"{dtype} {cfg}: failed {type(e).__name__}: {str(e)[:200]}", flush=True)
                continue
            print(f"{dtype} bn,bk,warps,stages,swap={cfg}: {t:8.1f} us, {floor_us / t:5.1%} of floor, "
                  f"max rel diff {max(errs):.1e}", flush=True)
            results.append({"dtype": str(dtype), "impl": "mma", "cfg": cfg, "us": t, "floor_us": floor_us,
                            "max_rel_diff": max(errs)})
        del layers
        torch.cuda.empty_cache()
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"copy_bw_gb_s": copy_bw / 1e9, "device": torch.cuda.get_device_name(), "results": results},
                      f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
