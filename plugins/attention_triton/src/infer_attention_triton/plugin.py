"""Registers the ``triton`` attention backend; importing this module imports no kernel library."""

from __future__ import annotations

from infer_core.hookspecs import hookimpl

BACKEND_PATH = "infer_attention_triton.backend:TritonAttentionBackend"


@hookimpl
def register_attention_backends(register):
    register("triton", BACKEND_PATH)


@hookimpl(tryfirst=True)
def default_attention_backend(ctx):
    """On CUDA, when it validates: first, before flash and torch (``trylast``). It measured faster than flash at
    batch-1 decode (its split-KV merge in the same launch), offline and serving (``benchmarks/results``:
    ``decode-graph-kernels-h100-2026-11-27``)."""
    if not ctx.is_cuda:
        return None
    from infer_attention_triton.capabilities import validate_context

    return "triton" if not validate_context(ctx) else None
