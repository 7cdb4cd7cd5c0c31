"""Without CUDA the kernels run in Triton's interpreter: set it before any kernel module is imported."""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from infer_core.testing import skip_gpu_tests_without_cuda  # noqa: E402 - after TRITON_INTERPRET

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture
def device() -> str:
    return DEVICE


def pytest_collection_modifyitems(config, items):
    skip_gpu_tests_without_cuda(items)
