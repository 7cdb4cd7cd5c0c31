"""Shared fixtures: tiny real checkpoints (written once per session) and a CUDA skip marker."""

from __future__ import annotations

import pytest

from infer_core.testing import TINY_ARCHITECTURES, make_tiny_checkpoint


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory):
    """``tiny_checkpoint("qwen3")`` -> folder of a random tiny model (config.json + safetensors)."""
    cache: dict[str, object] = {}

    def get(kind: str):
        if kind not in cache:
            cache[kind] = make_tiny_checkpoint(kind, tmp_path_factory.mktemp(f"tiny-{kind}"))
        return cache[kind]

    return get


@pytest.fixture(params=sorted(TINY_ARCHITECTURES))
def tiny_kind(request) -> str:
    return request.param


def pytest_collection_modifyitems(config, items):
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
