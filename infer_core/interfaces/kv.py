"""KV allocators: which cache blocks each sequence owns, and which full blocks can be reused."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class PrefixHit:
    """Cached blocks that hold the first ``num_tokens`` tokens of a sequence.

    ``num_queried_tokens`` is the length of the sequence that was looked up: the query and the
    hit are counted in the statistics once, when ``allocate`` adopts the hit.
    """

    block_ids: tuple[int, ...] = ()
    num_tokens: int = 0
    num_queried_tokens: int = 0


@dataclass(frozen=True, slots=True)
class KVStats:
    num_blocks: int
    num_free_blocks: int  # allocatable now, evictable cached blocks included
    prefix_queried_tokens: int
    prefix_hit_tokens: int

    @property
    def usage(self) -> float:
        return 1.0 - self.num_free_blocks / self.num_blocks if self.num_blocks else 0.0


class KVAllocator(ABC):
    """Owns the block pool. Sequences are named by id; blocks by index into the KV tensors.

    Invariants every implementation keeps: a block is in use by a sequence only while its
    reference count is > 0; a freed block is never handed out while referenced; ``free`` returns
    every block of the sequence.
    """

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching

    @property
    @abstractmethod
    def num_free_blocks(self) -> int:
        """Blocks that ``allocate`` could hand out now."""

    @abstractmethod
    def lookup_prefix(self, seq_id: str, token_ids: Sequence[int], max_tokens: int) -> PrefixHit:
        """Longest run of cached full blocks that starts the sequence, within ``max_tokens``.

        Has no effect on the pool or the statistics (a request that waits is looked up again).
        """

    @abstractmethod
    def allocate(self, seq_id: str, num_tokens: int, prefix: PrefixHit | None = None) -> list[int] | None:
        """Grow ``seq_id`` to hold ``num_tokens`` tokens; return the new block ids.

        On the first call for a sequence, ``prefix`` blocks are adopted (their references
        taken) before fresh blocks, and the prefix query and hit are counted. Returns None,
        changing nothing, when the pool is too small.
        """

    @abstractmethod
    def cache_blocks(self, seq_id: str, token_ids: Sequence[int], num_computed_tokens: int) -> None:
        """Make the sequence's blocks that are full and computed reusable by later prefixes."""

    @abstractmethod
    def free(self, seq_id: str) -> None:
        """Drop the sequence's references; unreferenced cached blocks stay reusable until evicted."""

    @abstractmethod
    def block_ids(self, seq_id: str) -> list[int]:
        """The sequence's block table."""

    @abstractmethod
    def stats(self) -> KVStats:
        """Counters for logs and metrics."""

    def num_blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)
