"""Whether the KV-cache kernels a model-dtype cache launches compile, for an H100 (sm_90), to the same code
as on another tree (main): the FP8 KV cache is a compile-time branch and None scales, so it must not change
them. Also compiles the FP8 variants (the interpreter runs their Python, not Triton's compiler).

No GPU needed: each launch wrapper is called on CPU tensors with a driver that names an sm_90 target,
so every launch compiles through the JIT's own argument specialization and does not run. The PTX is
compared without its debug lines (``.loc``, ``.file``, sections ``.debug_*``), which move with source lines.

    python benchmarks/kv_fp8_same_kernels.py --against /tmp/main-tree   # a checkout of main
    python benchmarks/kv_fp8_same_kernels.py --dump                     # this tree's digests, as JSON
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

PLUGIN_SRC = "plugins/attention_triton/src"
# Qwen3-0.6B (16 query heads, 8 KV heads, head_dim 128) and Qwen3-8B (32 / 8 / 128), bfloat16, 16-token pages
SHAPES = {"qwen3-0.6b": (16, 8, 128), "qwen3-8b": (32, 8, 128)}


def _strip_debug(ptx: str) -> str:
    out, in_debug = [], False
    for line in ptx.splitlines():
        s = line.strip()
        if s.startswith(".section") and ".debug" in s:
            in_debug = True
        if in_debug:
            if s == "}":
                in_debug = False
            continue
        if s.startswith((".loc", ".file", "//")) or not s:
            continue
        out.append(line)
    return "\n".join(out)


def compile_all(fp8: bool) -> dict[str, str]:
    """{launch: sha256 of its PTX without debug lines} for every KV-cache launch of the decode path."""
    import torch
    from infer_attention_triton import decode, prefill
    from infer_attention_triton.tiles import decode_tiles, prefill_tiles
    from infer_core.testing_sm90 import target_sm90

    from infer_core.layers.fused import kv_write, qk_norm_rope
    from infer_core.layers.rotary import RotaryEmbedding
    from infer_core.models.config import RopeConfig

    target_sm90()
    for module in (decode, kv_write, qk_norm_rope):
        module.use_pdl = lambda x: True  # as on an H100
    compiled: list = []
    kernels = (decode._decode_kernel, prefill._prefill_kernel, kv_write._write_kv_kernel,
               qk_norm_rope._qk_norm_rope_kernel)
    for kernel in kernels:
        def warm_up(*args, grid, warmup, kernel_run=kernel.run, **kwargs):
            compiled.append(kernel_run(*args, grid=grid, warmup=True, **kwargs))
        kernel.run = warm_up
    digests = {}
    bf16 = torch.bfloat16
    for shape_name, (heads, kv_heads, head_dim) in SHAPES.items():
        cache = torch.zeros(2, 64, 16, kv_heads, head_dim, dtype=torch.float8_e4m3fn if fp8 else bf16)
        scales = {"k_scale": 0.5, "v_scale": 0.25} if fp8 else {}
        tables = torch.zeros(4, 64, dtype=torch.int32)
        seq_lens = torch.full((4,), 100, dtype=torch.int32)
        tag = f"{shape_name}{' fp8' if fp8 else ''}"
        for num_seqs, splits in ((1, 32), (4, 1)):
            q = torch.zeros(num_seqs, heads, head_dim, dtype=bf16)
            scratch = decode.SplitScratch.allocate(num_seqs, heads, splits, head_dim, "cpu") if splits > 1 else None
            compiled.clear()
            decode.decode_attention(q, cache, tables, seq_lens, torch.zeros_like(q), scale=head_dim**-0.5,
                                    num_splits=splits, tiles=decode_tiles(head_dim), scratch=scratch,
                                    req_order=torch.zeros(num_seqs, dtype=torch.int32), **scales)
            digests[f"decode {tag} batch {num_seqs} splits {splits}"] = _digest(compiled[0])
        q = torch.zeros(32, heads, head_dim, dtype=bf16)
        compiled.clear()
        prefill.prefill_attention(q, cache, tables, seq_lens, torch.tensor([0, 16, 32], dtype=torch.int32),
                                  torch.zeros_like(q), scale=head_dim**-0.5, first_req=0, num_reqs=2,
                                  max_query_len=16, tiles=prefill_tiles(head_dim, 16), **scales)
        digests[f"prefill {tag}"] = _digest(compiled[0])
        for num_tokens in (1, 8):
            k = torch.zeros(num_tokens, kv_heads, head_dim, dtype=bf16)
            slots = torch.zeros(num_tokens, dtype=torch.int32)
            compiled.clear()
            kv_write.write_kv(cache, k, k.clone(), slots, **scales)
            digests[f"write_kv {tag} tokens {num_tokens}"] = _digest(compiled[0])
            qkv = torch.zeros(num_tokens, (heads + 2 * kv_heads) * head_dim, dtype=bf16)
            qq, kk, vv = (x.view(num_tokens, -1, head_dim) for x in qkv.split(
                [heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], dim=-1))
            rotary = RotaryEmbedding(head_dim, RopeConfig(theta=1e6), 4096, 40960)
            weight = torch.ones(head_dim, dtype=bf16)
            compiled.clear()
            qk_norm_rope.qk_norm_rope_inplace(torch.zeros(num_tokens, dtype=torch.int64), qq, kk, weight, weight,
                                              1e-6, rotary.cos_sin_cache, rotary.rot_dim, kv_cache=cache, v=vv,
                                              slot_mapping=slots, **scales)
            digests[f"qk_norm_rope+kv {tag} tokens {num_tokens}"] = _digest(compiled[0])
    return digests


def _digest(kernel) -> str:
    return hashlib.sha256(_strip_debug(kernel.asm["ptx"]).encode()).hexdigest()[:16]


def dump_in(tree: Path, fp8: bool) -> dict[str, str]:
    """compile_all in a fresh interpreter whose imports come from ``tree``."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = f"{tree}:{tree / PLUGIN_SRC}"
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    args = [sys.executable, str(Path(__file__).resolve()), "--dump"] + (["--fp8"] if fp8 else [])
    done = subprocess.run(args, capture_output=True, text=True, env=env, timeout=900, cwd=tree, check=False)
    if done.returncode:
        raise SystemExit(f"compiling in {tree} failed:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dump", action="store_true", help="print this tree's digests as JSON")
    parser.add_argument("--fp8", action="store_true", help="with --dump: the FP8 cache's launches")
    parser.add_argument("--against", type=Path, help="a tree (checkout of main) to compare the default launches with")
    args = parser.parse_args()
    if args.dump:
        print(json.dumps(compile_all(args.fp8)))
        return
    here = Path(__file__).resolve().parents[1]
    ours = dump_in(here, fp8=False)
    fp8 = dump_in(here, fp8=True)
    print(f"FP8 launches compiled for sm_90: {len(fp8)}")
    if args.against is None:
        print(json.dumps(ours, indent=1))
        return
    theirs = dump_in(args.against.resolve(), fp8=False)
    same = {k: ours[k] == theirs.get(k) for k in ours}
    for name, equal in same.items():
        print(f"{'same' if equal else 'DIFFERENT'}  {name}")
    sys.exit(0 if all(same.values()) else 1)


if __name__ == "__main__":
    main()
