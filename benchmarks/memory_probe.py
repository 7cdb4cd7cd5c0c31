"""Transient GPU memory of the forward pass and the sampler at the shapes the KV sizing profiles.

Dummy weights of ``--model`` (default Qwen3-0.6B's config, bf16) on ``--attention`` (default torch,
whose prefill once took 9.2 GiB of attention scores at 8k tokens): one 7,937-token prompt, 256 x 32
tokens, one long prompt next to 255 one-token requests, the [256, vocab] sampler with top-k, top-p,
penalties and logprobs, and a 2,048-token chunk after 6,000 cached tokens. Each line is the peak
allocated above what was allocated before the call. On a CPU the same steps run (a check that the
script works) and no peak is printed.

    python -m benchmarks.memory_probe [--model benchmarks/configs/Qwen3-0.6B] [--attention torch]
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import replace

import torch

from infer_core import LLM, SamplingParams
from infer_core.interfaces import SchedulerOutput
from infer_core.layers.sampler import sample
from infer_core.runner.inputs import build_step_inputs
from infer_core.runner.sampling_inputs import build_sampling_batch
from infer_core.runner.warmup import dummy_output

GiB = 2**30
HEAVY = SamplingParams(temperature=1.0, top_k=50, top_p=0.9, repetition_penalty=1.1, logprobs=20)


def peak(label: str, fn: Callable):
    """``fn()``, printing the transient memory it took on CUDA."""
    if not torch.cuda.is_available():
        out = fn()
        print(f"{label:<48} ran (no CUDA: no peak)")
        return out
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    out = fn()
    torch.cuda.synchronize()
    print(f"{label:<48} transient peak {(torch.cuda.max_memory_allocated() - base) / GiB:6.2f} GiB")
    return out


def prompts_step(runner, lengths: list[int], num_computed: int = 0) -> SchedulerOutput:
    """New requests of ``lengths`` tokens (the runner's own dummy step); each computes what follows ``num_computed``."""
    output, _ = dummy_output(lengths, SamplingParams(temperature=0), runner.config.block_size)
    for i, new in enumerate(output.new_requests):
        output.new_requests[i] = replace(new, num_computed_tokens=num_computed)
        output.num_scheduled_tokens[new.request_id] = len(new.token_ids) - num_computed
    return output


def forward(runner, output: SchedulerOutput, label: str):
    """The step's forward and LM head (the sampled rows), each under ``peak``; (inputs, logits)."""
    runner.requests.clear()
    runner.requests.apply(output)
    inputs = build_step_inputs(output, runner.requests, runner.config.block_size, runner.device)
    metadata = runner.attention.build_metadata(inputs.metadata)
    hidden = peak(f"forward {label}", lambda: runner.model(inputs.input_ids, inputs.positions, runner.kv_caches,
                                                          metadata))
    logits = peak("  lm head", lambda: runner.model.compute_logits(hidden.index_select(0, inputs.logits_indices)))
    return inputs, logits


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="benchmarks/configs/Qwen3-0.6B", help="a folder with config.json")
    parser.add_argument("--attention", default="torch")
    parser.add_argument("--kv-cache-gb", type=float, default=4.0)
    parser.add_argument("--scale", type=float, default=1.0, help="multiply every length (a quick CPU check: 0.01)")
    args = parser.parse_args()
    n = lambda tokens: max(1, int(tokens * args.scale))  # noqa: E731
    llm = LLM(args.model, load_format="dummy", attention=args.attention, max_model_len=8192,
              kv_cache_gb=args.kv_cache_gb, enforce_eager=True)
    runner = llm.engine.executor.worker.runner
    vocab_size = llm.engine.config.model.vocab_size
    with torch.inference_mode():
        for lengths in ([n(7937)], [n(32)] * 256, [n(7937)] + [1] * 255):
            label = f"{len(lengths)} requests, {sum(lengths)} tokens"
            inputs, logits = forward(runner, prompts_step(runner, lengths), label)
        states = [runner.requests[rid] for rid in inputs.request_ids]
        for state in states:
            state.sampling_params = HEAVY
        batch = peak("sampling batch [256 rows]", lambda: build_sampling_batch(states, vocab_size, (), runner.device,
                                                                               runner.generator))
        peak("sample with top-k, top-p, penalties, logprobs", lambda: sample(logits, batch))
        # 2,048 queries after 6,000 cached tokens: the prefill path that reads a cached prefix
        chunk = prompts_step(runner, [n(8048)], num_computed=n(8048) - n(2048))
        forward(runner, chunk, "a 2,048-token chunk after 6,000")
    llm.shutdown()


if __name__ == "__main__":
    main()
