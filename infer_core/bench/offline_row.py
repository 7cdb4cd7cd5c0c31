"""``infer bench serve --offline-row``: the offline engine (``LLM``) on the prompts the server was sent.

It runs after the server has stopped, in a child process of its own (``infer_core.bench.child``),
with the engine settings the server ran with, so both have the device to themselves. It gets the
prompts of the last load point and the same sampling (``max_tokens``, temperature, ``ignore_eos``;
chat prompts through the chat template), all submitted at once. The row's ``output_tok_s`` is
what the engine can do without HTTP; each server row gets ``fraction_of_offline``, its
``output_tok_s`` over the offline one. The row's ``core_timeline`` is its steps by kind, as the server's rows
have theirs (bench/core_timeline.py).
"""

from __future__ import annotations

import time
from typing import Any

from infer_core.bench.config import ServeBenchConfig
from infer_core.bench.core_timeline import format_core_timeline, offline_timeline
from infer_core.bench.prompts import Prompt

OFFLINE_SYSTEM = "offline"
TIMEOUT_S = 3600.0


def offline_spec(config: ServeBenchConfig, serve_flags: list[str], prompts: list[Prompt],
                 warmup_prompts: list[Prompt], load_name: str) -> dict[str, Any]:
    """What the child process needs (plain JSON)."""
    return {"system": OFFLINE_SYSTEM, "serve_flags": serve_flags, "prompts": prompts,
            "warmup_prompts": warmup_prompts, "chat": config.endpoint == "chat", "output_len": config.output_len,
            "temperature": config.temperature, "ignore_eos": config.ignore_eos, "prompts_of": load_name}


def run_offline(spec: dict[str, Any], engine_settings: dict[str, Any]) -> dict[str, Any]:
    """In the child: load the engine, warm it up, then time one ``generate`` (or ``chat``) of every prompt.

    ``engine_settings``: those ``infer serve`` takes from ``spec["serve_flags"]`` (child.py parses them).
    """
    from infer_core import LLM, SamplingParams
    from infer_core.bench.timeline import StepTimeline

    params = SamplingParams(temperature=spec["temperature"], max_tokens=spec["output_len"],
                            ignore_eos=spec["ignore_eos"])
    with LLM(**engine_settings) as llm:
        def complete(prompts: list[Prompt]):
            if spec["chat"]:
                return llm.chat([[{"role": "user", "content": p}] for p in prompts], params, use_tqdm=False)
            return llm.generate(prompts, params, use_tqdm=False)

        for prompt in spec["warmup_prompts"]:
            complete([prompt])
        timeline = StepTimeline()
        timeline.attach(llm.engine.scheduler)
        started = time.perf_counter()
        outputs = complete(spec["prompts"])
        ended = time.perf_counter()
        timeline.detach(llm.engine.scheduler)
        duration = ended - started
        config = llm.engine.config
    output_tokens = sum(len(c.token_ids) for o in outputs for c in o.outputs)
    input_tokens = sum(len(o.prompt_token_ids) for o in outputs)
    return {"system": OFFLINE_SYSTEM, "engine": "LLM.chat" if spec["chat"] else "LLM.generate",
            "prompts_of": spec["prompts_of"], "model": config.source.name, "num_requests": len(outputs),
            "completed": len(outputs), "failed": 0, "duration_s": duration,
            "request_throughput": len(outputs) / duration, "output_tok_s": output_tokens / duration,
            "input_tok_s": input_tokens / duration, "total_input_tokens": input_tokens,
            "total_output_tokens": output_tokens,
            "core_timeline": offline_timeline(timeline.by_kind(ended), duration)}


def format_offline(row: dict[str, Any], runs) -> str:
    """The offline row's block of the table, and each load point's share of it."""
    width = 20
    if "error" in row:
        return f"== offline engine ==\n{'error':<{width}}{row['error']}"
    lines = [f"== offline engine ({row['engine']}, the prompts of {row['prompts_of']}) ==",
             f"{'requests':<{width}}{row['completed']}",
             f"{'duration':<{width}}{row['duration_s']:.3f} s",
             f"{'output throughput':<{width}}{row['output_tok_s']:.1f} tok/s",
             f"{'tokens out / in':<{width}}{row['total_output_tokens']} / {row['total_input_tokens']}"]
    if row.get("core_timeline"):
        lines += format_core_timeline(row["core_timeline"], width)
    for run in runs:
        lines.append(f"{'server':<{width}}{fraction_of(run.output_tok_s, row):.1%} of offline at {run.load.name}")
    return "\n".join(lines)


def fraction_of(output_tok_s: float, offline: dict[str, Any]) -> float:
    rate = offline.get("output_tok_s") or 0.0
    return output_tok_s / rate if rate > 0 else 0.0
