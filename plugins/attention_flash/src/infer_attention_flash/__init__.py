"""Paged attention for infer through flash-attn 2.

Importing this package imports neither flash_attn nor torch: the loader registers the backend by
its class path, and flash_attn is imported only when the backend is built.
"""

__version__ = "0.1.0"
