"""Run infer under torchrun: rank 0 runs the ``infer`` command line, every other rank a worker loop.

    torchrun --nnodes 2 --nproc-per-node 8 --node-rank $NODE --master-addr $HEAD --master-port 29500 \\
        -m infer_parallel_tp.launch serve --model /models/big --tensor-parallel-size 16

Ranks > 0 ignore the arguments: rank 0 sends them the engine's configuration once it has
resolved it, so every rank runs the same model with the same settings.
"""

from __future__ import annotations

import logging
import os
import sys


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    rank = int(os.environ.get("RANK", "-1"))
    if rank < 0 or "WORLD_SIZE" not in os.environ:
        print(
            "infer_parallel_tp.launch runs under torchrun (RANK and WORLD_SIZE unset); "
            "without torchrun use `infer ... --tensor-parallel-size N`",
            file=sys.stderr,
        )
        return 2
    if rank == 0:
        from infer_core.cli import main as infer_main

        return infer_main(argv)
    logging.basicConfig(level=logging.INFO, format=f"[tp rank {rank}] %(levelname)s %(name)s: %(message)s")
    from infer_parallel_tp.worker_main import torchrun_entry

    return torchrun_entry()


if __name__ == "__main__":
    sys.exit(main())
