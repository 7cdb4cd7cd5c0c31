"""Registers the ``flash`` attention backend; importing this module imports no kernel library."""

from __future__ import annotations

from infer_core.hookspecs import hookimpl

BACKEND_PATH = "infer_attention_flash.backend:FlashAttentionBackend"


@hookimpl
def register_attention_backends(register):
    register("flash", BACKEND_PATH, aliases=("flash-attn", "flash_attn"))


@hookimpl
def default_attention_backend(ctx):
    """``flash`` on CUDA when it can run here and the user's block size suits it; else pass. Asked after
    ``triton`` (``tryfirst``), so it answers where triton cannot run (e.g. head dims that are not powers of two).

    Also pass with a speculative decoding policy (any ``decoding`` but ``standard``): its batch-1 verify
    steps replay a verify CUDA graph only with a backend that supports prefill graphs, which flash
    does not, so with flash every verify step would run eagerly, its launches paid from Python."""
    if not ctx.is_cuda or (ctx.settings.decoding or "standard") != "standard":
        return None
    from infer_attention_flash.capabilities import block_size_fits, validate_context

    if validate_context(ctx) or not block_size_fits(ctx.settings.block_size):
        return None
    return "flash"
