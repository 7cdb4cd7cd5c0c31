"""Paged attention for infer in Triton.

Importing this package imports neither triton nor torch: the loader registers the backend by its
class path, and the kernels are compiled only when the backend is chosen.
"""

__version__ = "0.1.0"
