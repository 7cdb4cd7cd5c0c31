"""Compiling kernels for an H100 (sm_90) on a machine without a GPU, with the compiler and ptxas in Triton's wheel:
what the interpreter cannot show (that a kernel compiles, its registers and spills, its instructions).

A compile script's ``__main__`` is :func:`print_compiled`; a test runs it with :func:`compiled_in_a_process` (no
``TRITON_INTERPRET`` there) and is skipped where this Triton cannot compile for sm_90. Inside it, either
:func:`compile_for_sm90` compiles one kernel from a signature, or :func:`target_sm90` makes every launch
(``warmup=True``) compile through the JIT's own argument specialization.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any


class CannotCompile(Exception):
    """No NVIDIA backend or ptxas in this Triton install."""


def print_compiled(collect) -> None:
    """A compile script's ``__main__``: print ``collect()`` as JSON, or the reason and exit 3 where nothing compiles."""
    import json
    import sys

    try:
        print(json.dumps(collect()))
    except CannotCompile as exc:
        print(exc)
        sys.exit(3)


def compiled_in_a_process(script: str | Path) -> Any:
    """Run ``script`` (whose ``__main__`` is :func:`print_compiled`) in a fresh interpreter without Triton's interpreter,
    and return what it printed; the calling test is skipped where this Triton cannot compile for sm_90."""
    import json
    import os
    import subprocess
    import sys

    import pytest

    env = {name: value for name, value in os.environ.items() if name != "TRITON_INTERPRET"}
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # the runtime's default: set to quiet its warning
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=600, env=env)
    if done.returncode == 3:
        pytest.skip(f"cannot compile for sm_90 here: {done.stdout.strip()}")
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout)


def compile_for_sm90(fn, args: dict, constexprs: dict, num_warps: int, num_stages: int) -> dict:
    """``fn``'s code (``asm``: ttgir, ptx, ...) specialised as the JIT would for these arguments (aligned tensors).

    Run it in a process without ``TRITON_INTERPRET`` (the kernel must be compiled, not interpreted).
    """
    import torch
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    signature, constants, attrs = {}, dict(constexprs), {}
    for i, name in enumerate(fn.arg_names):
        if name in constexprs:
            signature[name] = "constexpr"
        elif isinstance(args[name], torch.Tensor):
            signature[name] = {torch.bfloat16: "*bf16", torch.float32: "*fp32", torch.int32: "*i32",
                               torch.int64: "*i64"}[args[name].dtype]
            attrs[(i,)] = [["tt.divisibility", 16]]
        elif isinstance(args[name], float):
            signature[name] = "fp32"
        elif name != "num_rows" and args[name] == 1:  # the JIT turns ints equal to 1 into constants
            signature[name], constants[name] = "constexpr", 1
        else:
            signature[name] = "i32"
            if name != "num_rows" and args[name] % 16 == 0:  # num_rows: do_not_specialize
                attrs[(i,)] = [["tt.divisibility", 16]]
    try:
        compiled = triton.compile(ASTSource(fn, signature, constants, attrs), target=GPUTarget("cuda", 90, 32),
                                  options={"num_warps": num_warps, "num_stages": num_stages, "launch_pdl": True})
    except Exception as exc:
        raise CannotCompile(f"{type(exc).__name__}: {exc}") from exc
    return compiled.asm


def target_sm90() -> None:
    """Make Triton's active driver one that only names an H100's target (sm_90, 32-lane warps): a launch with
    ``warmup=True`` then compiles for it on a machine without a GPU (CPU tensors as arguments), and runs nothing."""
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


def cubin_resource_usage(cubin: bytes) -> dict[str, int]:
    """A compiled kernel's registers, stack, local (spilled) and shared bytes, read by the cuobjdump in Triton's
    wheel: ``{"REG": ..., "STACK": ..., "LOCAL": ..., "SHARED": ...}``."""
    import subprocess
    import tempfile

    from triton import knobs

    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        text = subprocess.run(
            [knobs.nvidia.cuobjdump.path, "--dump-resource-usage", f.name], capture_output=True, text=True, check=True
        ).stdout
    return {k: int(v) for k, v in re.findall(r"\b(REG|STACK|LOCAL|SHARED):(\d+)", text)}


# a float instruction of the PTX (arithmetic, conversions, shuffles of the reductions), its registers renamed below
FLOAT_OP = re.compile(r"^(?:@!?%p\d+\s+)?((?:fma|mul|add|sub|div|rsqrt|ex2|max|min|neg|abs)\.\S*f32"
                      r"|cvt\.\S*(?:f32|bf16|f16)\S*|shfl\.\S+|selp\.f32)\s+([^;]*);")


def float_ops(ptx: str) -> list[str]:
    """The PTX's float instructions in order, registers renamed by first appearance (two compiles of one
    computation give the same list, whatever their register numbers)."""
    names, found = {}, []
    for line in ptx.splitlines():
        m = FLOAT_OP.match(line.strip())
        if m:
            operands = re.sub(r"%[a-z]+\d+", lambda r: names.setdefault(r.group(0), f"v{len(names)}"), m.group(2))
            found.append(f"{m.group(1)} {operands}")
    return found
