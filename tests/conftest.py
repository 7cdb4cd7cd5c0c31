"""Shared fixtures: tiny real checkpoints (written once per session) and a CUDA skip marker."""

from __future__ import annotations

import pytest

from infer_core.testing import (
    TINY_ARCHITECTURES,
    TinyCheckpoints,
    skip_gpu_tests_without_cuda,
)


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory) -> TinyCheckpoints:
    """``tiny_checkpoint("qwen3")`` -> folder of a random tiny model (config.json + safetensors)."""
    return TinyCheckpoints(tmp_path_factory)


@pytest.fixture(params=sorted(TINY_ARCHITECTURES))
def tiny_kind(request) -> str:
    return request.param


def pytest_collection_modifyitems(config, items):
    skip_gpu_tests_without_cuda(items)
