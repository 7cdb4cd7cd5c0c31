"""Sampling internals: the counter-based noise, top-k/top-p thresholds and the fused GPU kernel.

``infer_core.layers.sampler`` is the public entry point; these modules are its parts.
"""
