"""Is TP=2's bfloat16 logit gap a tensor-parallel bug, or bfloat16 noise? A CPU answer (gloo, no GPU).

A deep, narrow Qwen3 shape (36 layers; 8 query heads, 2 KV heads, head_dim = hidden / 8, so
Qwen3-8B's 4:1 grouping; intermediate 3 x hidden; vocabulary 8192; untied LM head) with dummy
weights, at each ``--hidden`` and each dummy init (``--inits``):

- ``flat``: the former ``init_dummy_weights`` (every matrix N(0, 0.02), norms 1);
- ``scaled``: the current one (embedding std 1, projections 1/sqrt(fan_in), ``o_proj`` and
  ``down_proj`` further by 1/sqrt(2 x layers); see ``infer_core.models.weights._dummy_std``).

For each, the last-position logits of the same 8 prompts (16 to 200 tokens; every input token
given, teacher-forced) at TP=1 float32, TP=1 bfloat16, TP=2 bfloat16 and TP=2 float32, and the
relative differences ``||a - b|| / ||b||`` (per prompt; max and mean reported):

- TP=1 bf16 vs TP=1 fp32: the bfloat16 noise of this model (no tensor parallelism at all);
- TP=2 bf16 vs TP=1 bf16: what ``benchmarks.tp`` checks against 2e-2;
- TP=2 bf16 vs TP=1 fp32: TP=2's own bfloat16 error;
- TP=2 fp32 vs TP=1 fp32: the split itself (a TP bug would show here; float32 reorders sums only).

    python -m benchmarks.tp_accuracy_cpu [--hidden 512 1024] [--inits flat scaled] [--out DIR]

Writes ``benchmarks/results/tp-accuracy-cpu-<cpu>-<date>.json``. Each run is a process of its
own (``--child``), so every TP=2 run starts a fresh gloo group.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.common import write_result

INIT_VARIABLE = "TP_ACCURACY_DUMMY_INIT"  # not INFER_*: those are settings
PROMPT_LENS = (16, 33, 64, 100, 128, 200, 17, 48)
VOCAB = 8192
NUM_LAYERS = 36
RUNS = ((1, "float32"), (1, "bfloat16"), (2, "bfloat16"), (2, "float32"))

if os.environ.get(INIT_VARIABLE) == "flat":
    # The former dummy init, for comparison. Applied at import: the spawned TP worker imports this
    # module too (multiprocessing's spawn re-imports the parent's main module), so both ranks get it.
    import infer_core.models.weights as _weights

    _weights._dummy_std = lambda name, shape, num_layers: 0.02


def model_config(hidden: int) -> dict:
    return {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "vocab_size": VOCAB,
        "hidden_size": hidden,
        "intermediate_size": 3 * hidden,
        "num_hidden_layers": NUM_LAYERS,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "head_dim": hidden // 8,
        "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "bos_token_id": 1,
        "eos_token_id": 2,
        "hidden_act": "silu",
        "attention_bias": False,
    }


def prompts() -> list[list[int]]:
    rng = random.Random(1)
    return [[rng.randrange(VOCAB) for _ in range(n)] for n in PROMPT_LENS]


def run_child(folder: str, tp: int, dtype: str, out: str) -> None:
    """One engine: the last-position logits of every prompt, saved to ``out``."""
    from infer_core import LLM, SamplingParams
    from infer_core.testing import LogitsRecorder

    llm = LLM(folder, load_format="dummy", device="cpu", dtype=dtype, tensor_parallel_size=tp, seed=0,
              kv_cache_gb=0.5, max_model_len=1024)
    try:
        with LogitsRecorder(llm.engine) as recorder:
            outputs = llm.generate(prompts(), SamplingParams(temperature=0, max_tokens=1), use_tqdm=False)
        torch.save(torch.stack([recorder.logits[o.request_id][0].float() for o in outputs]), out)
    finally:
        llm.shutdown()


def compare(candidate: torch.Tensor, reference: torch.Tensor) -> dict:
    rel = ((candidate - reference).norm(dim=-1) / reference.norm(dim=-1)).tolist()
    return {
        "max_rel_diff": float(f"{max(rel):.3e}"),
        "mean_rel_diff": float(f"{sum(rel) / len(rel):.3e}"),
        "top1_agreement": round((candidate.argmax(-1) == reference.argmax(-1)).float().mean().item(), 4),
    }


def measure(hidden: int, init: str, scratch: Path) -> dict:
    folder = scratch / f"model-{hidden}"
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_text(json.dumps(model_config(hidden)))
    env = {k: v for k, v in os.environ.items() if not k.startswith("INFER_")}
    env[INIT_VARIABLE] = init
    logits, seconds = {}, {}
    for tp, dtype in RUNS:
        out = scratch / f"logits-{hidden}-{init}-tp{tp}-{dtype}.pt"
        start = time.perf_counter()
        subprocess.run(
            [sys.executable, "-m", "benchmarks.tp_accuracy_cpu", "--child", str(folder), str(tp), dtype, str(out)],
            env=env, check=True,
        )
        seconds[f"tp{tp}_{dtype}"] = round(time.perf_counter() - start, 1)
        logits[(tp, dtype)] = torch.load(out)
    row = {
        "hidden_size": hidden,
        "init": init,
        "tp1_bf16_vs_tp1_fp32": compare(logits[1, "bfloat16"], logits[1, "float32"]),
        "tp2_bf16_vs_tp1_bf16": compare(logits[2, "bfloat16"], logits[1, "bfloat16"]),
        "tp2_bf16_vs_tp1_fp32": compare(logits[2, "bfloat16"], logits[1, "float32"]),
        "tp2_fp32_vs_tp1_fp32": compare(logits[2, "float32"], logits[1, "float32"]),
        "logits_rms_tp1_fp32": round(logits[1, "float32"].pow(2).mean().sqrt().item(), 4),
        "run_s": seconds,
    }
    print(json.dumps(row), flush=True)
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, nargs="+", default=[512, 1024])
    parser.add_argument("--inits", nargs="+", default=["flat", "scaled"], choices=["flat", "scaled"])
    parser.add_argument("--out", type=Path, default=None, help="folder of the result JSON (default benchmarks/results)")
    parser.add_argument("--child", nargs=4, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child is not None:
        folder, tp, dtype, out = args.child
        run_child(folder, int(tp), dtype, out)
        return 0
    with tempfile.TemporaryDirectory(prefix="tp-accuracy-") as scratch:
        rows = [measure(h, init, Path(scratch)) for h in args.hidden for init in args.inits]
    settings = {
        "model": f"Qwen3 shape, {NUM_LAYERS} layers, 8 q / 2 kv heads, head_dim hidden/8, "
        f"intermediate 3 x hidden, vocab {VOCAB}, untied (dummy weights, seed 0)",
        "device": "cpu",
        "parallel": "tp over gloo (TP=2) vs single (TP=1)",
        "prompt_lens": list(PROMPT_LENS),
        "logits": "last position of each prompt, teacher-forced (max_tokens=1)",
        "metric": "||a - b|| / ||b|| per prompt",
        "runs": [f"TP={tp} {dtype}" for tp, dtype in RUNS],
    }
    path = write_result("tp-accuracy-cpu", settings, rows, args.out)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
