"""One rank's share of a tensor-parallel model, run whole on one GPU: TP=N's decode step with free communication.

A TP=N rank holds 1/N of the heads, of the MLP and of the vocabulary, and runs every layer's kernels at those
sizes. A model of exactly those sizes on one GPU runs the same kernels with no all-reduce at all, so its batch-1
decode step bounds what any all-reduce could give: ``(TP=1 step) / (share's step)`` is the most TP=N could reach
with communication for free. This writes the share's config.json (the full model's with those sizes divided by
N) and runs ``infer bench latency`` on the full model and on the share (dummy weights, one GPU):

    python -m benchmarks.tp_rank_share [--model Qwen3-8B] [--tp 2] [--attention triton] [--out DIR]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from infer_core.testing import REAL_CONFIGS, write_config_checkpoint

SPLIT = ("num_attention_heads", "num_key_value_heads", "intermediate_size", "vocab_size")


def share_overrides(name: str, tp: int) -> dict[str, int]:
    """The sizes one of ``tp`` ranks holds; its token ids stay inside the share's vocabulary."""
    config = REAL_CONFIGS[name]
    bad = [key for key in SPLIT if config[key] % tp]
    if bad:
        raise ValueError(f"{name}: {', '.join(bad)} do not divide by {tp}")
    share = {key: config[key] // tp for key in SPLIT}
    return {**share, "bos_token_id": 1, "eos_token_id": 2}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="Qwen3-8B", choices=sorted(REAL_CONFIGS))
    parser.add_argument("--tp", type=int, default=2, help="ranks the model is split over (2 or more)")
    parser.add_argument("--attention", default="triton")
    parser.add_argument("--out", default=None, help="folder of the result JSONs (default benchmarks/results)")
    args = parser.parse_args(argv)
    if args.tp < 2:
        parser.error(f"--tp must be 2 or more, got {args.tp}")
    from infer_core.cli import main as infer

    extra = ["--attention", args.attention, "--peers", "floor"] + (["--out", args.out] if args.out else [])
    with tempfile.TemporaryDirectory(prefix="tp-rank-share-") as scratch:
        share = write_config_checkpoint(args.model, Path(scratch) / f"{args.model}-rank-of-{args.tp}",
                                        **share_overrides(args.model, args.tp))
        for model in (args.model, str(share)):
            print(f"--- {model}", flush=True)
            code = infer(["bench", "latency", "--model", model, *extra])
            if code:
                return code
    return 0


if __name__ == "__main__":
    sys.exit(main())
