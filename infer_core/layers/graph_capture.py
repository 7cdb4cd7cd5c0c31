"""What the forward now running is captured into, for a layer (or a plugin's wrapper) whose side work differs by
kind of graph: nothing, a whole-step graph (decode, one-request prefill), or the piecewise graphs.

A whole-step graph replays at every decode step, so work outside the layer's result (counting, say) costs each
of them; a piece replays in the steps no whole-step graph holds, whose token count pads to the captured size.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

_pieces = False


def capturing() -> bool:
    """Whether the current CUDA stream is capturing a graph (never on a host without CUDA)."""
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def capturing_pieces() -> bool:
    """Whether the stream is capturing one of the piecewise graphs (``runner/piecewise_graphs.py``)."""
    return _pieces and capturing()


@contextmanager
def piecewise_capture() -> Iterator[None]:
    """Marks the piecewise graphs' capture (the runner's, around it)."""
    global _pieces
    _pieces = True
    try:
        yield
    finally:
        _pieces = False
