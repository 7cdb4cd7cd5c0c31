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
        """What ``update`` called once per step would add in all, and what its last call would add.

        The steps before the last are decoded as one, so a request whose text is read only at its
        end costs four decodes instead of two per step. Exact for decoders whose text of a longer
        window is that of its parts joined at character boundaries (byte-level BPE, SentencePiece;
        not clean-up of spaces, see ``backend_decoder``). Where the joined steps stop inside a
        character (their text is held back), they are replayed one by one, as streaming would.
        """
        if not steps:
            return "", ""
        earlier = [token for step in steps[:-1] for token in step]
        mark = (len(self.token_ids), self.prefix_offset, self.read_offset)
        before = self.update(earlier) if earlier else ""
        if earlier and not before:
            del self.token_ids[mark[0]:]
            self.prefix_offset, self.read_offset = mark[1], mark[2]
            before = "".join(self.update(step) for step in steps[:-1])
        last = self.update(steps[-1])
        return before + last, last
