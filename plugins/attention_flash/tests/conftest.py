"""GPU tests need CUDA and flash_attn; without either they are skipped, naming what is missing."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

HERE = Path(__file__).parent


def pytest_collection_modifyitems(config, items):
    import torch

    missing = []
    if not torch.cuda.is_available():
        missing.append("a CUDA device")
    if importlib.util.find_spec("flash_attn") is None:
        missing.append("flash_attn (pip install flash-attn --no-build-isolation)")
    if not missing:
        return
    skip = pytest.mark.skip(reason="needs " + " and ".join(missing))
    for item in items:  # this hook sees every collected test; mark only this plugin's
        if "gpu" in item.keywords and HERE in Path(item.path).parents:
            item.add_marker(skip)
