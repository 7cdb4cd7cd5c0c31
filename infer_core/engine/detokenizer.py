"""Incremental detokenization that never splits a UTF-8 character.

Each step decodes a short window of recent tokens twice (with and without the new ones) and
emits the difference, unless the new text ends in U+FFFD: then a multi-byte character is still
incomplete and the text waits for the next token. A character still incomplete when generation
ends is left out of the text rather than shown as U+FFFD.
"""

from __future__ import annotations

import os

_CONTEXT_TOKENS = 5  # prompt tokens decoded before the first output, for leading-space rules


class IncrementalDetokenizer:
    def __init__(self, tokenizer, prompt_token_ids: list[int], skip_special_tokens: bool) -> None:
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.token_ids = list(prompt_token_ids[-_CONTEXT_TOKENS:])
        self.prefix_offset = 0
        self.read_offset = len(self.token_ids)

    def _decode(self, ids: list[int]) -> str:
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
