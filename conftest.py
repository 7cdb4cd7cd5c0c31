"""Shared by the core suite and every plugin's suite (pytest reads the rootdir's conftest for all of them).

GPU tests build engines that each size their KV cache from the GPU's free memory. One whose
objects are still in a reference cycle when the next test starts would leave that test too little,
so after every ``gpu`` test the cycles are collected and torch's cached blocks go back to the driver.

Under pytest-xdist each worker gets its share of the cores for torch's (OpenMP) threads, and
passes it on to the processes its tests start: two workers of two threads each on two cores spend
more time spinning on each other than computing.

Kernels interpreted on the CPU (``TRITON_INTERPRET=1``) skip the interpreter's repeated patching of
``triton.language`` at every helper call (``infer_core.testing_interpreter.quicken_triton_interpreter``).

An engine left busy by a test file would keep the process's heap frozen (``runner/gc_policy.py``)
for every file after it on that worker: each file must leave none.
"""

from __future__ import annotations

import gc
import os

import pytest


def pytest_configure(config):
    num_workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
    if num_workers > 1 and "OMP_NUM_THREADS" not in os.environ:
        import torch

        threads = max(1, len(os.sched_getaffinity(0)) // num_workers)
        os.environ["OMP_NUM_THREADS"] = str(threads)
        torch.set_num_threads(threads)
    from infer_core.testing_interpreter import quicken_triton_interpreter

    quicken_triton_interpreter()  # kernels interpreted in this process (tests/fused, the Triton plugins' suites)


@pytest.fixture(autouse=True)
def _release_gpu_memory(request):
    yield
    if request.node.get_closest_marker("gpu") is None:
        return
    import torch

    if torch.cuda.is_available():
        gc.collect()
        torch.cuda.empty_cache()


@pytest.fixture(scope="module", autouse=True)
def _no_engine_left_busy(request):
    yield
    from infer_core.runner.gc_policy import STEP_LOOP_GC

    if STEP_LOOP_GC.num_holders:
        gc.collect()
    assert STEP_LOOP_GC.num_holders == 0, (
        f"{request.node.nodeid} left {STEP_LOOP_GC.num_holders} engine(s) busy (the collector held): finish, "
        "abort or shut down what it started")


@pytest.fixture
def triton_on_cpu(monkeypatch):
    """Layers (and models) built during the test on the CPU run our Triton kernels, in Triton's interpreter.

    The suite's conftest sets ``TRITON_INTERPRET=1`` without CUDA before any kernel module is imported;
    ``infer_core.layers.fused.TRITON_DEVICES`` then takes the CPU for the layers this test builds.
    """
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("Triton kernels on CPU tensors need TRITON_INTERPRET=1 (set by the suite's conftest without CUDA)")
    from infer_core.layers import fused

    monkeypatch.setattr(fused, "TRITON_DEVICES", ("cuda", "cpu"))


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """Under pytest-xdist's ``--dist loadfile`` (CI's), the files of tests/server/ go to one worker together.

    They share the session's default-model server and offline engine (tests/server/conftest.py);
    on two workers each would start its own. Every other file is a unit of its own, as loadfile makes it.
    """
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class ServerFilesTogether(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            scope = super()._split_scope(nodeid)
            return "tests/server/" if scope.startswith("tests/server/") else scope

    return ServerFilesTogether(config, log)
