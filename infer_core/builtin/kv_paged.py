"""The ``paged`` KV allocator: a block pool with reference counts and a prefix cache.

A full block is cached under a chained key ``(hash(parent key), its token ids)``, so a hit on
block i implies the whole prefix up to it matches. Cached blocks nobody references stay in an
LRU list and are reused (evicted) only when no never-cached block is free.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Sequence

from infer_core.interfaces import KVAllocator, KVStats, PrefixHit

BlockKey = tuple[int, tuple[int, ...]]
_ROOT = 0x1F2E3D4C  # parent hash of a sequence's first block


class PagedKVAllocator(KVAllocator):
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool) -> None:
        super().__init__(num_blocks, block_size, enable_prefix_caching)
        self.ref_counts = [0] * num_blocks
        self.block_keys: list[BlockKey | None] = [None] * num_blocks
        self.free_blocks: deque[int] = deque(range(num_blocks))  # not cached, unreferenced
        self.evictable: OrderedDict[int, None] = OrderedDict()  # cached, unreferenced; oldest first
        self.cached: dict[BlockKey, int] = {}
        self.seq_blocks: dict[str, list[int]] = {}
        self.seq_keys: dict[str, list[BlockKey]] = {}
        self.seq_num_cached: dict[str, int] = {}  # leading blocks of a sequence already offered to the cache
        self.queried_tokens = 0
        self.hit_tokens = 0

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_blocks) + len(self.evictable)

    def _keys(self, seq_id: str | None, token_ids: Sequence[int], num_full_blocks: int) -> list[BlockKey]:
        """The sequence's memoised chained block keys, extended to at least ``num_full_blocks``
        (``seq_id`` None: computed afresh, not remembered)."""
        keys = [] if seq_id is None else self.seq_keys.setdefault(seq_id, [])
        bs = self.block_size
        while len(keys) < num_full_blocks:
            i = len(keys)
            parent = hash(keys[-1]) if keys else _ROOT
            keys.append((parent, tuple(token_ids[i * bs : (i + 1) * bs])))
        return keys

    def lookup_prefix(self, seq_id: str, token_ids: Sequence[int], max_tokens: int) -> PrefixHit:
        if not self.enable_prefix_caching:
            return PrefixHit()
        hits: list[int] = []
        num_full = max_tokens // self.block_size
        keys = self._keys(seq_id, token_ids, num_full)
        for i in range(num_full):
            block = self.cached.get(keys[i])
            if block is None:
                break
            hits.append(block)
        return PrefixHit(tuple(hits), len(hits) * self.block_size, len(token_ids))

    def _take_ref(self, block: int) -> None:
        if self.ref_counts[block] == 0:
            self.evictable.pop(block, None)
        self.ref_counts[block] += 1

    def _pop_free(self) -> int:
        if self.free_blocks:
            return self.free_blocks.popleft()
        block, _ = self.evictable.popitem(last=False)  # least recently freed cached block
        key = self.block_keys[block]
        if key is not None and self.cached.get(key) == block:
            del self.cached[key]
        self.block_keys[block] = None
        return block

    def allocate(self, seq_id: str, num_tokens: int, prefix: PrefixHit | None = None) -> list[int] | None:
        blocks = self.seq_blocks.get(seq_id)
        if blocks is not None and num_tokens <= len(blocks) * self.block_size:
            return []  # a decode step with room in its last block: the common case, kept cheap
        adopt = list(prefix.block_ids) if prefix and blocks is None else []
        have = (len(blocks) if blocks else 0) + len(adopt)
        needed = max(0, self.num_blocks_for(num_tokens) - have)
        adopted_free = sum(1 for b in adopt if self.ref_counts[b] == 0)
        if needed > self.num_free_blocks - adopted_free:
            return None
        if blocks is None:
            blocks = self.seq_blocks[seq_id] = []
            if prefix is not None:
                self.queried_tokens += prefix.num_queried_tokens
                self.hit_tokens += prefix.num_tokens
        for block in adopt:
            self._take_ref(block)
        blocks.extend(adopt)
        new = []
        for _ in range(needed):
            block = self._pop_free()
            self.ref_counts[block] = 1
            new.append(block)
        blocks.extend(new)
        return adopt + new

    def cache_blocks(self, seq_id: str, token_ids: Sequence[int], num_computed_tokens: int) -> None:
        if not self.enable_prefix_caching:
            return
        start = self.seq_num_cached.get(seq_id, 0)  # blocks before it were handled on earlier steps
        if num_computed_tokens < (start + 1) * self.block_size:
            return  # no block became full since the last call
        blocks = self.seq_blocks.get(seq_id, [])
        num_full = min(num_computed_tokens // self.block_size, len(blocks))
        keys = self._keys(seq_id, token_ids, num_full)
        for i in range(start, num_full):
            block, key = blocks[i], keys[i]
            if self.block_keys[block] is None and key not in self.cached:
                self.block_keys[block] = key
                self.cached[key] = block
        self.seq_num_cached[seq_id] = max(start, num_full)

    def free(self, seq_id: str) -> None:
        self.seq_keys.pop(seq_id, None)
        self.seq_num_cached.pop(seq_id, None)
        # Tail blocks first: they are the least likely to be shared, so they are evicted first.
        for block in reversed(self.seq_blocks.pop(seq_id, [])):
            self.ref_counts[block] -= 1
            assert self.ref_counts[block] >= 0, f"block {block} freed more often than referenced"
            if self.ref_counts[block] == 0:
                if self.block_keys[block] is not None:
                    self.evictable[block] = None
                else:
                    self.free_blocks.append(block)

    def block_ids(self, seq_id: str) -> list[int]:
        return list(self.seq_blocks.get(seq_id, []))

    def stats(self) -> KVStats:
        return KVStats(self.num_blocks, self.num_free_blocks, self.queried_tokens, self.hit_tokens)
