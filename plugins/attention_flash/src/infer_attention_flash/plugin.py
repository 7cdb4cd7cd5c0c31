"""Registers the ``flash`` attention backend; importing this module imports no kernel library."""

from __future__ import annotations

from infer_core.hookspecs import hookimpl

BACKEND_PATH = "infer_attention_flash.backend:FlashAttentionBackend"


@hookimpl
def register_attention_backends(register):
    register("flash", BACKEND_PATH, aliases=("flash-attn", "flash_attn"))


@hookimpl(tryfirst=True)
def default_attention_backend(ctx):
    """``flash`` on CUDA when it can run here and the user's block size suits it; else pass."""
    if not ctx.is_cuda:
        return None
    from infer_attention_flash.capabilities import block_size_fits, validate_context

    if validate_context(ctx) or not block_size_fits(ctx.settings.block_size):
        return None
    return "flash"
