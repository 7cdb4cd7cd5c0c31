"""HF transformers as peers, on the same model (random weights from its config.json) and device.

- ``hf-generate-batch``: continuous batching (``attn_implementation="paged|sdpa"``) on the
  offline-throughput workload's requests with their own output lengths, through the manager
  that ``generate_batch`` drives (``generate_batch`` itself takes one ``max_new_tokens`` for all).
  Where flash-attn is installed the manager may switch to it: 5.17 does unless "paged|sdpa" is
  asked for by that name, 5.23 (which reads "paged|sdpa" as "sdpa") unless told not to; both are
  done, and the row's ``attention`` is what the manager actually ran.
  It runs outside ``torch.inference_mode``: its cache tensors are updated in place later.
- ``hf-generate-static``: ``generate`` with a static cache (a ``StaticCache`` passed in, the
  guide's second way; ``cache_implementation="static"`` builds the same per call) and the forward
  compiled with the guide's options (``mode="reduce-overhead", fullgraph=True``), greedy, batch 1.
  Compiling ``model.forward`` by hand, as the guide shows, fails in transformers 5.17 (the prefill
  then runs in a CUDA graph that allocates the cache, and the next replay overwrites it), so the
  options go to ``generate`` as a ``CompileConfig``: 5.x then compiles the forward of the decode
  steps itself. The cache's tensors are marked as static addresses before the first compile (5.23
  does it for all of them, 5.17 not for ``cumulative_length``, which makes torch.compile skip the
  CUDA graphs: "skipping cudagraphs due to mutated inputs"). On the CPU the forward stays eager
  (the row says so): compiling there takes minutes.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from infer_core.bench.engine_runs import latency_figures
from infer_core.bench.workload import WARMUP_MAX_TOKENS, WARMUP_PROMPT, OfflineWorkload

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def build_model(folder: str, dtype: str, device: str, attn_implementation: str):
    """The model of ``folder``'s config.json with random weights, built straight on ``device``."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(folder)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=DTYPES[dtype], attn_implementation=attn_implementation)
    return model.eval()


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def generate_batch_row(folder: str, workload: OfflineWorkload, dtype: str, device: str,
                       attn_implementation: str = "paged|sdpa", timeout_s: float = 600) -> dict[str, Any]:
    """Throughput of HF continuous batching on ``workload``: output tokens / wall time after a warm-up."""
    import transformers
    from transformers import ContinuousBatchingConfig, GenerationConfig

    if torch.is_inference_mode_enabled():
        raise RuntimeError("hf-generate-batch must run outside torch.inference_mode (its cache is updated in place)")
    started = time.perf_counter()
    model = build_model(folder, dtype, device, attn_implementation)
    sampled = {"do_sample": True, "temperature": workload.temperature, "top_k": 0, "top_p": 1.0} \
        if workload.temperature > 0 else {"do_sample": False}
    generation = GenerationConfig(**sampled, max_new_tokens=max(workload.output_lens), eos_token_id=-1)
    hints = _workload_hints(workload)
    sizes: dict[str, int] = {}
    on_gpu = torch.device(device).type == "cuda"
    if not on_gpu:  # HF sizes its cache (and sdpa's masks) to free RAM; on the CPU, to the workload instead
        page = 256
        sizes = dict(page_size=page, max_batch_tokens=512,
                     num_blocks=sum(-(-(len(p) + n) // page) for p, n in zip(workload.prompts, workload.output_lens)))
    # Keep sdpa (5.23 would switch to flash-attn where it is installed); only the options this
    # transformers knows are passed.
    batching = ContinuousBatchingConfig(**_known(ContinuousBatchingConfig, auto_switch_to_flash=False, seed=0, **sizes))
    warmup = on_gpu  # the manager's warm-up captures CUDA graphs; on the CPU it only costs time
    manager_options = _known(model.continuous_batching_context_manager, generation_config=generation, block=True,
                             timeout=30, continuous_batching_config=batching, warmup=warmup, workload_hints=hints)
    with model.continuous_batching_context_manager(**manager_options) as manager:
        startup_s = time.perf_counter() - started
        attention = model.config._attn_implementation  # what the manager runs with
        no_eos = _known(manager.add_request, eos_token_id=-1)  # else the generation config's -1 holds
        manager.add_request(WARMUP_PROMPT, request_id="warmup", max_new_tokens=WARMUP_MAX_TOKENS, **no_eos)
        _collect(manager, {"warmup"}, timeout_s)
        _sync()
        start = time.perf_counter()
        ids = {}
        for i, (prompt, n) in enumerate(zip(workload.prompts, workload.output_lens)):
            ids[f"req-{i}"] = n
            manager.add_request(prompt, request_id=f"req-{i}", max_new_tokens=n, **no_eos)
        results = _collect(manager, set(ids), timeout_s)
        _sync()
        elapsed = time.perf_counter() - start
    produced = {rid: len(results[rid].generated_tokens) for rid in ids}
    if produced != ids:
        wrong = next(rid for rid in ids if produced[rid] != ids[rid])
        raise RuntimeError(f"hf-generate-batch gave {wrong} {produced[wrong]} tokens instead of {ids[wrong]}")
    total = sum(produced.values())
    return {
        "system": "hf-generate-batch",
        "attention": attention,
        "output_tok_s": round(total / elapsed, 1),
        "output_tokens": total,
        "prompt_tokens": workload.num_prompt_tokens,
        "elapsed_s": round(elapsed, 3),
        "num_prompts": len(workload.prompts),
        "startup_s": round(startup_s, 2),
        "transformers": transformers.__version__,
    }


def _workload_hints(workload: OfflineWorkload):
    """What the manager sizes itself by, where this transformers takes hints (else None)."""
    try:
        from transformers.generation.continuous_batching.utils import WorkloadHints
    except ImportError:
        return None
    return WorkloadHints(max_prompt_length=max(map(len, workload.prompts)),
                         max_generated_length=max(workload.output_lens), num_requests=len(workload.prompts))


def _known(function, **options: Any) -> dict[str, Any]:
    """The ``options`` that ``function`` takes: the continuous-batching API moves between 5.x releases."""
    import inspect

    parameters = inspect.signature(function).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        return options
    return {name: value for name, value in options.items() if name in parameters}


def _collect(manager, wanted: set[str], timeout_s: float) -> dict[str, Any]:
    """Wait for every request in ``wanted`` to finish; fail on an error, a dead manager or the timeout."""
    results: dict[str, Any] = {}
    deadline = time.monotonic() + timeout_s
    while len(results) < len(wanted):
        if time.monotonic() > deadline:
            unfinished = len(wanted) - len(results)
            raise TimeoutError(f"hf-generate-batch: {unfinished} requests unfinished after {timeout_s} s")
        result = manager.get_result(timeout=1)
        if result is None:
            if not manager.is_running():
                raise RuntimeError("hf-generate-batch: the continuous batching thread stopped before finishing")
            continue
        if result.request_id in wanted and result.is_finished():
            if result.error is not None:
                raise RuntimeError(f"hf-generate-batch: request {result.request_id} failed: {result.error}")
            results[result.request_id] = result
    return results


def generate_static_row(folder: str, prompt: list[int], new_tokens: int, repeats: int, dtype: str,
                        device: str) -> dict[str, Any]:
    """Batch-1 greedy latency of ``generate`` with a static cache and a compiled forward (on CUDA).

    Two warm-up calls compile and capture the decode graph; each timed call is preceded by a
    ``max_new_tokens=1`` call that gives its time to first token (the eager prefill).
    """
    import transformers
    from transformers import CompileConfig, StaticCache

    started = time.perf_counter()
    model = build_model(folder, dtype, device, "sdpa")
    # transformers 5.x compiles the forward itself for the decode steps of a static cache on a GPU
    # (the prefill stays eager, and creates the cache's tensors outside the CUDA graphs); these
    # are the guide's options: torch.compile(forward, mode="reduce-overhead", fullgraph=True).
    compile_config = CompileConfig(fullgraph=True, mode="reduce-overhead")
    compiled = torch.device(device).type == "cuda"
    # One static cache for every call, reset in place: the 1-token calls that time the prefill
    # then leave the compiled graphs' cache tensors where they were (a new size would re-record).
    cache = StaticCache(config=model.config, max_cache_len=len(prompt) + new_tokens)
    input_ids = torch.tensor([prompt], device=device)
    attention_mask = torch.ones_like(input_ids)
    startup_s = time.perf_counter() - started

    def generate(max_new_tokens: int, compile: bool = compiled) -> float:
        cache.reset()
        _sync()
        began = time.perf_counter()
        out = model.generate(input_ids, attention_mask=attention_mask, past_key_values=cache, do_sample=False,
                             max_new_tokens=max_new_tokens, min_new_tokens=max_new_tokens, pad_token_id=0,
                             compile_config=compile_config, disable_compile=not compile)
        _sync()
        if out.shape[1] != len(prompt) + max_new_tokens:
            raise RuntimeError(f"hf-generate-static returned {out.shape[1] - len(prompt)} tokens, not {max_new_tokens}")
        return time.perf_counter() - began

    generate(1, compile=False)  # creates the cache's tensors, eagerly, before anything is compiled
    for layer in cache.layers:  # 5.17 leaves cumulative_length unmarked, and its graphs are then skipped
        for name in ("keys", "values", "cumulative_length"):
            if isinstance(getattr(layer, name, None), torch.Tensor):
                torch._dynamo.mark_static_address(getattr(layer, name))
    warmup_s = [generate(new_tokens) for _ in range(2)]
    e2e, ttft = [], []
    for _ in range(repeats):
        ttft.append(generate(1))
        e2e.append(generate(new_tokens))
    return {
        "system": "hf-generate-static",
        "attention": "sdpa",
        "cache": "static",
        "compiled": compiled,
        **latency_figures(e2e, ttft, new_tokens),
        "startup_s": round(startup_s, 2),
        "warmup_s": [round(s, 2) for s in warmup_s],
        "transformers": transformers.__version__,
    }
