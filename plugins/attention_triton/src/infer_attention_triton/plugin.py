"""Registers the ``triton`` attention backend; importing this module imports no kernel library."""

from __future__ import annotations

from infer_core.hookspecs import hookimpl

BACKEND_PATH = "infer_attention_triton.backend:TritonAttentionBackend"


@hookimpl
def register_attention_backends(register):
    register("triton", BACKEND_PATH)


@hookimpl
def default_attention_backend(ctx):
    """On CUDA, when it validates: after flash (``tryfirst``) and before torch (``trylast``)."""
    if not ctx.is_cuda:
        return None
    from infer_attention_triton.capabilities import validate_context

    return "triton" if not validate_context(ctx) else None
