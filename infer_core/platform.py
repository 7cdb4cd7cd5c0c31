"""Where the engine runs: the CUDA devices present, the device and dtype chosen, the RuntimeContext."""

from __future__ import annotations

import logging
import os
from pathlib import Path

from infer_core.errors import SettingsError
from infer_core.interfaces import RuntimeContext
from infer_core.models.config import ModelConfig
from infer_core.settings import EngineSettings

logger = logging.getLogger(__name__)


def runtime_probe() -> tuple[int, tuple[int, int] | None]:
    """(number of CUDA devices, capability of device 0) without initialising kernels libraries."""
    import torch

    if not torch.cuda.is_available():
        return 0, None
    return torch.cuda.device_count(), torch.cuda.get_device_capability(0)


def pick_device(requested: str, num_gpus: int) -> str:
    if requested == "cuda" and num_gpus == 0:
        raise SettingsError("INFER_DEVICE=cuda but CUDA is not available here; use INFER_DEVICE=cpu or auto")
    if requested == "auto":
        return "cuda" if num_gpus else "cpu"
    return requested


def pick_dtype(requested: str, device: str, checkpoint_dtype: str | None) -> str:
    """float32 on CPU by default; on CUDA the checkpoint's half type, bfloat16 otherwise.

    The CPU keeps float32 where bfloat16 would be faster (AMX, avx512_bf16): on the default model bfloat16 picks
    float32's greedy token at fewer than 99% of teacher-forced positions (``benchmarks/cpu_bf16_agreement.py``).
    """
    if requested != "auto":
        if device == "cpu" and requested == "float16":
            raise SettingsError("float16 is not supported on the CPU; use INFER_DTYPE=float32 or bfloat16")
        return requested
    if device == "cpu":
        return "float32"
    return checkpoint_dtype if checkpoint_dtype in ("bfloat16", "float16") else "bfloat16"


# Left unset, per device: a step's token budget (a CPU step's time grows with its tokens), and overlapped
# scheduling (a CPU step runs as it is launched, so overlap would only hand its tokens out a step later).
DEVICE_DEFAULTS = {"cuda": {"max_num_batched_tokens": 8192, "async_scheduling": True},
                   "cpu": {"max_num_batched_tokens": 2048, "async_scheduling": False}}


def with_device_defaults(settings: EngineSettings, device: str) -> EngineSettings:
    """``settings`` with the values left unset that depend on the device filled in for ``device``."""
    unset = {name: value for name, value in DEVICE_DEFAULTS[device].items() if getattr(settings, name) is None}
    return settings.model_copy(update=unset) if unset else settings


def make_runtime_context(settings: EngineSettings, model: ModelConfig) -> RuntimeContext:
    """The one RuntimeContext of an engine: implementations are validated and built against it."""
    num_gpus, capability = runtime_probe()
    device = pick_device(settings.device, num_gpus)
    dtype = pick_dtype(settings.dtype, device, model.torch_dtype)
    settings = with_device_defaults(settings, device)
    return RuntimeContext(device, dtype, model, settings, capability if device == "cuda" else None, num_gpus,
                          os.environ.get("TRITON_INTERPRET") == "1")


def physical_cores() -> int:
    """Physical cores among the CPUs this process may run on (hyper-threads of one core count once).

    The CPU engine computes on this many threads: a second thread per core shares the core's vector units
    and only adds synchronisation to every parallel region.
    """
    cpus = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else set(range(os.cpu_count() or 1))
    cores = set()
    for cpu in cpus:
        siblings = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list")
        try:
            cores.add(siblings.read_text().strip())
        except OSError:
            cores.add(str(cpu))
    return max(1, len(cores))


def use_physical_cores() -> None:
    """The CPU computes on one thread per physical core, unless OMP_NUM_THREADS says otherwise (then torch
    already follows it)."""
    import torch

    if "OMP_NUM_THREADS" not in os.environ:
        threads = physical_cores()
        if torch.get_num_threads() != threads:
            logger.info("CPU: %d compute threads (one per physical core), not %d", threads, torch.get_num_threads())
            torch.set_num_threads(threads)
