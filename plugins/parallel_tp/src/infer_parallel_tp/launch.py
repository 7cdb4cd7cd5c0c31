"""Run infer under torchrun: rank 0 runs the engine, every other rank a worker loop.

The ``infer`` command line on every host::

    torchrun --nnodes 2 --nproc-per-node 8 --node-rank $NODE --master-addr $HEAD --master-port 29500 \\
        -m infer_parallel_tp.launch serve --model /models/big --tensor-parallel-size 16

or a Python program that calls ``run_workers_under_torchrun()`` before it builds its ``LLM``.
Ranks > 0 ignore the arguments: rank 0 sends them the engine's configuration once it has
resolved it, so every rank runs the same model with the same settings. Rank 0 runs the ``infer``
command line, found through its console-script entry point (this plugin imports no core module
but the public ones).
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable
from importlib.metadata import entry_points

COMMAND = "infer"  # the console script of infer-core whose command line rank 0 runs


def infer_command() -> Callable[[list[str] | None], int]:
    """The ``main(argv)`` of the ``infer`` command line, through its console-script entry point."""
    found = list(entry_points(group="console_scripts", name=COMMAND))
    if not found:
        raise RuntimeError(f"no `{COMMAND}` console script is installed in this environment; install infer-core "
                           f"(pip install -e .) in the Python that torchrun runs ({sys.executable})")
    return found[0].load()


def run_workers_under_torchrun() -> None:
    """Under torchrun, make every rank but 0 a worker and exit it when rank 0 stops; on rank 0, return.

    Outside torchrun (no RANK / WORLD_SIZE) this returns at once: the engine spawns its workers.
    """
    rank = int(os.environ.get("RANK", "0"))
    if rank == 0 or "WORLD_SIZE" not in os.environ:
        return
    logging.basicConfig(level=logging.INFO, format=f"[tp rank {rank}] %(levelname)s %(name)s: %(message)s")
    from infer_core.distributed import torchrun_entry

    sys.exit(torchrun_entry())


def main(argv: list[str] | None = None) -> int:
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        print(
            "infer_parallel_tp.launch runs under torchrun (RANK and WORLD_SIZE are unset); "
            "without torchrun use `infer ... --tensor-parallel-size N`",
            file=sys.stderr,
        )
        return 2
    run_workers_under_torchrun()
    return infer_command()(sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    sys.exit(main())
