"""The default model's GEMMs on the CPU, one decode step's worth, by each packing (``layers/cpu_matmul.py``).

SmolLM2-135M's 121 projections a step (30 layers of qkv, o, gate_up and down, then the LM head), each layer its
own weight so a step streams every weight from memory as the engine does, at each ``--rows``: our kernel for the
dtype (bfloat16: AMX on tile-ordered weights, ``cpu_amx``; float32: AVX-512, ``cpu_f32_gemm``), oneDNN on its
packed layout, and ``F.linear`` on the plain weight (oneDNN reordering it per call), interleaved round by round. Reported: the median milliseconds a step and the weights'
bytes read a second. Above 64 rows the LM head is left out (a prefill step computes logits for its last tokens only).

    python -m benchmarks.cpu_gemm [--dtype bfloat16|float32] [--rows 1,8,16,32,64,256,1024,2048] [--rounds 9] [--out DIR]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from benchmarks.common import write_result

# (output, input) sizes and how many a step: SmolLM2-135M-Instruct (hidden 576, 9 + 3 + 3 heads of 64, MLP 1536)
SHAPES = {"qkv": (960, 576, 30), "o": (576, 576, 30), "gate_up": (3072, 576, 30), "down": (576, 1536, 30),
          "lm_head": (49152, 576, 1)}


def measure(dtype: torch.dtype, rows_list: list[int], rounds: int) -> list[dict]:
    from infer_core.layers import cpu_amx, cpu_f32_gemm, cpu_matmul

    kernel = cpu_amx if dtype == torch.bfloat16 else cpu_f32_gemm
    if kernel.load() is None:
        raise SystemExit(f"this CPU has no {kernel.__name__} kernel: nothing to compare")
    gen = torch.Generator().manual_seed(0)
    weights = {name: [(torch.randn(n, k, generator=gen) * 0.05).to(dtype) for _ in range(count)]
               for name, (n, k, count) in SHAPES.items()}
    ours = {name: [kernel.pack(w) for w in ws] for name, ws in weights.items()}
    onednn = {name: [torch.ops.mkldnn._reorder_linear_weight(w, cpu_matmul.PACK_BATCH_HINT) for w in ws]
              for name, ws in weights.items()}
    paths = {
        "ours": lambda name, i, x: kernel.linear(x, ours[name][i], SHAPES[name][0], None),
        "onednn_packed": lambda name, i, x: torch.ops.mkldnn._linear_pointwise(x, onednn[name][i], None, "none",
                                                                              [], ""),
        "f_linear": lambda name, i, x: F.linear(x, weights[name][i]),
    }
    results = []
    for rows in rows_list:
        names = [name for name in SHAPES if rows <= 64 or name != "lm_head"]
        inputs = {name: torch.randn(rows, SHAPES[name][1], generator=gen).to(dtype) for name in names}
        nbytes = sum(SHAPES[name][0] * SHAPES[name][1] * SHAPES[name][2] * dtype.itemsize for name in names)

        def step(run) -> float:
            start = time.perf_counter()
            for name in names:
                for i in range(SHAPES[name][2]):
                    run(name, i, inputs[name])
            return time.perf_counter() - start

        times: dict[str, list[float]] = {path: [] for path in paths}
        for path, run in paths.items():
            step(run)  # warm-up
        for _ in range(rounds if rows <= 256 else max(3, rounds // 3)):
            for path, run in paths.items():
                times[path].append(step(run))
        row = {"rows": rows, "weight_bytes": nbytes}
        for path, ts in times.items():
            median = statistics.median(ts)
            row[f"{path}_ms"] = round(median * 1e3, 2)
            row[f"{path}_gb_s"] = round(nbytes / median / 1e9, 1)
        row["ours_vs_onednn_packed"] = round(row["onednn_packed_ms"] / row["ours_ms"], 2)
        results.append(row)
        print(f"{rows:5d} rows: ours {row['ours_ms']:8.1f} ms ({row['ours_gb_s']:5.1f} GB/s)  oneDNN packed "
              f"{row['onednn_packed_ms']:8.1f} ms  F.linear {row['f_linear_ms']:8.1f} ms  "
              f"ours x{row['ours_vs_onednn_packed']:.2f}", flush=True)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16")
    parser.add_argument("--rows", default="1,8,16,32,64,256,1024,2048")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    rows = [int(r) for r in args.rows.split(",")]
    results = measure(getattr(torch, args.dtype), rows, args.rounds)
    settings = {"dtype": args.dtype, "rows": rows, "rounds": args.rounds, "threads": torch.get_num_threads()}
    print(write_result(f"cpu_gemm-{args.dtype}", settings, results, args.out))


if __name__ == "__main__":
    main()
