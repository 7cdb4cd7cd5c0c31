"""Triton kernels compiled while a timed run was going: a first-use compile costs 0.1-1 s of wall time.

Triton compiles a kernel the first time it meets a new specialisation (a constexpr value, an
integer argument that is 1 or divisible by 16) and keeps the result in its on-disk cache. A timed
benchmark whose warm-up missed one pays that compile inside its measurement. Each compile adds a
folder to the cache, so the folders that appear during the run name the kernels compiled in it.
"""

from __future__ import annotations

import os
from pathlib import Path


def triton_cache_dir() -> Path | None:
    try:
        import triton
    except ImportError:
        return None
    knobs = getattr(triton, "knobs", None)
    if knobs is not None:
        return Path(knobs.cache.dir)
    return Path(os.environ.get("TRITON_CACHE_DIR", Path.home() / ".triton" / "cache"))


class CompileWatch:
    """The cache's folders at ``start``; ``compiled()`` names the kernels of the folders added since."""

    def __init__(self) -> None:
        self.root = triton_cache_dir()
        self.before: set[str] = set()

    def _folders(self) -> set[str]:
        if self.root is None or not self.root.is_dir():
            return set()
        return {entry.name for entry in self.root.iterdir() if entry.is_dir()}

    def start(self) -> None:
        self.before = self._folders()

    def compiled(self) -> list[str]:
        """Kernel names (sorted, one per compile) of the compiles since ``start``."""
        names = []
        for folder in sorted(self._folders() - self.before):
            kernels = [f.stem for f in (self.root / folder).glob("*.json") if not f.name.startswith("__grp__")]
            names.extend(kernels or [f"<{folder}>"])
        return sorted(names)
