"""Probe: do the experts' kernels of a dense (bfloat16) model compile, for sm_90, to the same float instructions on
this tree as on another (the tree the EP=2 figures were measured on)? The 8-bit path added arguments and
compile-time branches; the dense launches must compute as before. Prints {launch: [sha256 of its float
instructions (``infer_core.testing.float_ops``), their count, sha256 of the PTX without debug lines, parameter
lines and debug labels, and with registers renamed]}.

    python dense_ptx_same.py TREE    # run in a process without TRITON_INTERPRET, with TREE first on sys.path
"""

import hashlib
import json
import re
import sys

sys.path.insert(0, sys.argv[1])

import torch

from infer_core.layers.fused import moe_gemm, moe_gemv
from infer_core.layers.fused.moe_gemm import choose_tiles, fused_experts
from infer_core.layers.moe.align import align_by_expert

try:
    from infer_core.testing_sm90 import float_ops, target_sm90
except ImportError:  # the older tree: float_ops in testing.py, the same driver written out
    from infer_core.testing import float_ops

    def target_sm90():
        from triton.backends.compiler import GPUTarget
        from triton.runtime import driver

        class Sm90Target:
            def get_current_device(self):
                return 0

            def get_current_stream(self, device):
                return 0

            def get_current_target(self):
                return GPUTarget("cuda", 90, 32)

        driver.set_active(Sm90Target())


def _digest(ptx_body: str) -> str:
    """The PTX's instructions with registers renamed by first use and the kernel's parameters left out (the 8-bit
    path added two): what the kernel does with them."""
    code = ptx_body.split(".section\t.debug")[0].split(".section .debug")[0]  # the DWARF sections: line tables
    lines = [line for line in code.splitlines() if ".param" not in line and "ld.param" not in line
             and not re.match(r"\s*\$L__tmp\d+:", line)]  # debug labels: an inlined helper adds some, no code
    names: dict[str, str] = {}
    text = re.sub(r"%[a-z]+\d+", lambda r: names.setdefault(r.group(0), f"v{len(names)}"), "\n".join(lines))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


target_sm90()
moe_gemm.use_pdl = moe_gemv.use_pdl = lambda x: True
moe_gemv.num_sms = lambda device: 132
compiled = []
for kernel in (moe_gemm._moe_gemm_kernel, moe_gemv._gate_up_kernel, moe_gemv._down_kernel):
    def warm_up(*args, grid, warmup, kernel_run=kernel.run, name=kernel.__name__, **kwargs):
        compiled.append((name, kernel_run(*args, grid=grid, warmup=True, **kwargs)))
    kernel.run = warm_up
moe_gemm._combine_kernel.run = lambda *a, **k: None
H, I, E = 2048, 768, 128
gate_up = torch.zeros(E, 2 * I, H, dtype=torch.bfloat16)
down = torch.zeros(E, H, I, dtype=torch.bfloat16)
out = {}
for tokens, top_k in ((16, 8), (64, 8), (256, 8), (1024, 8), (4096, 8)):
    ids = (torch.arange(tokens * top_k) % E).view(tokens, top_k)
    tiles = choose_tiles(ids.numel(), E)
    compiled.clear()
    fused_experts(torch.zeros(tokens, H, dtype=torch.bfloat16), gate_up, down, torch.full((tokens, top_k), 0.5),
                  align_by_expert(ids, E, tiles.block_m), tiles)
    for i, (name, k) in enumerate(compiled):
        ptx = k.asm["ptx"]
        body = "\n".join(line for line in ptx.splitlines() if not re.match(r"\s*(\.loc|\.file|//)", line))
        out[f"gemm {tokens} tokens m{tiles.block_m}n{tiles.block_n}k{tiles.block_k} launch {i}"] = [
            hashlib.sha256("\n".join(float_ops(ptx)).encode()).hexdigest()[:16], len(float_ops(ptx)), _digest(body)]
for tokens in (1, 2):
    ids = (torch.arange(tokens * 8) % E).view(tokens, 8)
    compiled.clear()
    moe_gemv.moe_gemv_experts(torch.zeros(tokens, H, dtype=torch.bfloat16), gate_up, down, torch.full((tokens, 8), 0.5),
                              ids)
    for name, k in compiled:
        ops = float_ops(k.asm["ptx"])
        body = "\n".join(line for line in k.asm["ptx"].splitlines() if not re.match(r"\s*(\.loc|\.file|//)", line))
        out[f"gemv {name} {tokens} tokens"] = [hashlib.sha256("\n".join(ops).encode()).hexdigest()[:16], len(ops),
                                               _digest(body)]
print(json.dumps(out))
