"""Incremental detokenization that never splits a UTF-8 character.

Each step decodes a short window of recent tokens twice (with and without the new ones) and
emits the difference, unless the new text ends in U+FFFD: then a multi-byte character is still
incomplete and the text waits for the next token. A character still incomplete when generation
ends is left out of the text rather than shown as U+FFFD.
"""

from __future__ import annotations

import os

_CONTEXT_TOKENS = 5  # prompt tokens decoded before the first output, for leading-space rules


def backend_decoder(tokenizer):
    """The Rust ``decode`` under a transformers fast tokenizer, where its Python ``decode`` adds
    nothing to it (no clean-up of spaces): a third of the time per call, and two calls per request
    per step; None otherwise (use ``tokenizer.decode``)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None or getattr(tokenizer, "clean_up_tokenization_spaces", True):
        return None
    return backend.decode


class IncrementalDetokenizer:
    def __init__(self, tokenizer, prompt_token_ids: list[int], skip_special_tokens: bool,
                 fast_decode=None) -> None:
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.fast_decode = fast_decode  # ``backend_decoder(tokenizer)``, looked up once by the caller
        self.token_ids = list(prompt_token_ids[-_CONTEXT_TOKENS:])
        self.prefix_offset = 0
        self.read_offset = len(self.token_ids)

    def _decode(self, ids: list[int]) -> str:
        if self.fast_decode is not None:
            return self.fast_decode(ids, skip_special_tokens=self.skip_special_tokens)
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens)

    def update(self, new_token_ids: list[int]) -> str:
        """Text added by ``new_token_ids`` (possibly empty while a character is incomplete)."""
        self.token_ids.extend(new_token_ids)
        prefix_text = self._decode(self.token_ids[self.prefix_offset : self.read_offset])
        new_text = self._decode(self.token_ids[self.prefix_offset :])
        if new_text.endswith("\ufffd"):
            return ""
        start = len(prefix_text)
        if prefix_text.endswith("\ufffd") and not new_text.startswith(prefix_text):
            # The prompt ended inside a character that these tokens complete: the prefix's U+FFFD
            # became that character, which the output shows (its last bytes are output tokens).
            start = len(os.path.commonprefix([prefix_text, new_text]))
        if len(new_text) <= start:
            return ""
        self.prefix_offset = self.read_offset
        self.read_offset = len(self.token_ids)
        return new_text[start:]

    def update_steps(self, steps: list[list[int]]) -> tuple[str, str]:
        """What ``update`` called once per step would add in all, and what its last call would add
        (``update_spans`` with the steps laid end to end)."""
        token_ids: list[int] = []
        step_ends = []
        for step in steps:
            token_ids.extend(step)
            step_ends.append(len(token_ids))
        return self.update_spans(token_ids, step_ends)

    def update_spans(self, token_ids: list[int], step_ends: list[int]) -> tuple[str, str]:
        """``update_steps`` for steps given as one list of ids and where each step ended in it (step i
        added ``token_ids[step_ends[i - 1]:step_ends[i]]``), as a final-only sequence keeps them: ints,
        not a list per step, which the garbage collector would have to walk.

        The steps before the last are decoded as one, so a request whose text is read only at its
        end costs four decodes instead of two per step. Exact for decoders whose text of a longer
        window is that of its parts joined at character boundaries (byte-level BPE, SentencePiece;
        not clean-up of spaces, see ``backend_decoder``). Where the joined steps stop inside a
        character (their text is held back), they are replayed one by one, as streaming would.
        """
        if not step_ends:
            return "", ""
        last_start = step_ends[-2] if len(step_ends) > 1 else 0
        earlier = token_ids[:last_start]
        mark = (len(self.token_ids), self.prefix_offset, self.read_offset)
        before = self.update(earlier) if earlier else ""
        if earlier and not before:
            del self.token_ids[mark[0]:]
            self.prefix_offset, self.read_offset = mark[1], mark[2]
            starts = [0, *step_ends[:-2]]
            before = "".join(self.update(token_ids[start:end]) for start, end in zip(starts, step_ends[:-1]))
        last = self.update(token_ids[last_start:step_ends[-1]])
        return before + last, last
