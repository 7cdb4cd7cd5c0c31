"""The layers models are built from (linear, norm, attention, embedding, sampler) and their Triton kernels (``fused``).

A public module for plugins: a layer a plugin swaps in or wraps is built from these.
"""
