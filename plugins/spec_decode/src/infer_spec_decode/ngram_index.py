"""Prompt lookup: the tokens that followed the latest earlier occurrence of a request's newest n-gram.

The draft copies on from that occurrence; where the copy reaches the newest token it goes on over
the tokens it has drafted (as an LZ77 back-reference may overlap itself), so output that repeats with
a period shorter than the draft, a token over and over say, still gets a whole draft.

``NgramIndex`` keeps, for one request, the latest start of every n-gram (``min_n`` to ``max_n``
tokens) that has at least one token after it. It is extended by the tokens appended since the last
call, so a step costs a few dict operations per new token and per n, not a scan of the context.
"""

from __future__ import annotations


class NgramIndex:
    def __init__(self, min_n: int, max_n: int) -> None:
        if not 1 <= min_n <= max_n:
            raise ValueError(f"n-gram lengths must satisfy 1 <= min_n <= max_n; got min_n={min_n}, max_n={max_n}")
        self.min_n, self.max_n = min_n, max_n
        self.latest: dict[tuple[int, ...], int] = {}  # n-gram -> its latest start with a token after it
        self.num_indexed = 0  # tokens seen so far: n-grams ending before the newest token are indexed

    def _extend(self, tokens: list[int]) -> None:
        """Index every n-gram that now has a following token: those ending before ``tokens[-1]``."""
        latest = self.latest
        for end in range(max(self.num_indexed - 1, 1), len(tokens)):  # the n-gram is tokens[start:end]
            for n in range(self.min_n, min(self.max_n, end) + 1):
                latest[tuple(tokens[end - n:end])] = end - n
        self.num_indexed = len(tokens)

    def propose(self, tokens: list[int], k: int, guessed: list[int] = ()) -> list[int]:
        """``k`` tokens copied from after the latest earlier occurrence of the longest suffix of ``tokens``
        (``max_n`` down to ``min_n`` tokens long) that occurred before; [] when none did. ``guessed``:
        tokens taken to follow ``tokens`` without being indexed (a step's output not read yet); the
        suffix looked up and the copy then end with them."""
        self._extend(tokens)
        context = tokens + list(guessed) if guessed else tokens
        if k <= 0 or len(context) < self.min_n + 1:
            return []
        latest = self.latest
        for n in range(min(self.max_n, len(context) - 1), self.min_n - 1, -1):
            start = latest.get(tuple(context[-n:]))
            if start is not None:
                draft = context[start + n:start + n + k]
                while len(draft) < k:  # the copy overlaps its own output
                    draft.append(draft[len(draft) - (len(context) - start - n)])
                return draft
        return []
