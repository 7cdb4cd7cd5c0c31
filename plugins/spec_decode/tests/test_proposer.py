"""The prompt-lookup index and the adaptive draft length, on their own (no engine)."""

from __future__ import annotations

import random

import pytest

from infer_spec_decode.adaptive import AdaptiveDraftLength
from infer_spec_decode.ngram_index import NgramIndex


def lookup(tokens: list[int], k: int, min_n: int, max_n: int, searched: int | None = None) -> list[int]:
    """The definition: the longest suffix (max_n..min_n) with an earlier occurrence; k tokens copied on from its
    latest one, the copy reading its own output where it passes the end (the sequence continued with its period).
    ``searched``: occurrences are looked for among the first that many tokens only (followed by one of them)."""
    searched = len(tokens) if searched is None else searched
    for n in range(min(max_n, len(tokens) - 1), min_n - 1, -1):
        suffix = tokens[-n:]
        for start in range(searched - n - 1, -1, -1):
            if tokens[start:start + n] == suffix:
                extended = list(tokens)
                for i in range(k):
                    extended.append(extended[start + n + i])
                return extended[len(tokens):]
    return []


def test_longest_then_latest_match():
    index = NgramIndex(1, 3)
    # "7 8 9" occurred at 0 (followed by 1 2), "8 9" later at 6 (followed by 5): the longer match wins
    tokens = [7, 8, 9, 1, 2, 3, 8, 9, 5, 6, 7, 8, 9]
    assert index.propose(tokens, 2) == [1, 2]
    assert index.propose(tokens + [4], 2) == []  # 4 never occurred before; 1-grams: none either
    assert NgramIndex(2, 2).propose(tokens, 3) == [5, 6, 7]  # only bigrams: "8 9" latest at 6
    assert NgramIndex(1, 2).propose([3, 4, 4, 4], 3) == [4, 4, 4]  # the copy overlaps itself
    assert NgramIndex(2, 3).propose([1, 5, 6, 5, 6], 4) == [5, 6, 5, 6]


def test_incremental_index_equals_the_definition():
    rng = random.Random(3)
    for min_n, max_n in ((1, 1), (1, 4), (2, 4), (3, 5)):
        index = NgramIndex(min_n, max_n)
        tokens = [rng.randrange(6) for _ in range(5)]
        for _ in range(200):
            k = rng.randrange(0, 5)
            assert index.propose(tokens, k) == (lookup(tokens, k, min_n, max_n) if k else [])
            tokens.extend(rng.randrange(6) for _ in range(rng.choice((1, 1, 1, 3))))


def test_guessed_tokens_extend_the_lookup_without_entering_the_index():
    """With tokens guessed to follow the read ones, the suffix looked up and the copy end with the guess; the
    occurrences matched are those among the read tokens (with a read token after them)."""
    rng = random.Random(4)
    for _ in range(200):
        tokens = [rng.randrange(5) for _ in range(rng.randrange(3, 30))]
        guessed = [rng.randrange(5) for _ in range(rng.randrange(1, 4))]
        index = NgramIndex(1, 3)
        assert index.propose(tokens, 3, guessed) == lookup(tokens + guessed, 3, 1, 3, searched=len(tokens))
        assert index.propose(tokens, 2) == lookup(tokens, 2, 1, 3)  # the guess left nothing in the index


def test_bad_lengths_are_refused():
    with pytest.raises(ValueError, match="min_n=3, max_n=2"):
        NgramIndex(3, 2)


def test_draft_length_grows_on_success_and_pauses_after_failures():
    lengths = AdaptiveDraftLength(4, pause_after=2, max_pause=16)
    assert lengths.allowed("a") == 4
    lengths.record("a", 4, 1)
    assert lengths.allowed("a") == 2  # one more than were accepted
    lengths.record("a", 2, 2)
    assert lengths.allowed("a") == 3  # all accepted: one more
    lengths.record("a", 3, 0)
    assert lengths.allowed("a") == 1
    pauses = []
    for _ in range(5):  # every probe fails: the pauses double up to max_pause
        lengths.record("a", 1, 0)
        steps = 0
        while lengths.allowed("a") == 0:
            steps += 1
        pauses.append(steps)
    assert pauses == [4, 8, 16, 16, 16]
    lengths.record("a", 1, 1)  # a probe that succeeds ends the pauses
    assert [lengths.allowed("a") for _ in range(3)] == [2, 2, 2]
    lengths.keep_only({"b"})
    assert lengths.allowed("a") == 4  # forgotten: a new request starts at the most
