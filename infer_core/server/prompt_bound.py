"""A prompt that cannot fit the context is refused before it is tokenized (tokenizing 15 MB takes seconds).

The bound: every token covers at most ``L`` characters of text, ``L`` the length of the tokenizer's
longest vocabulary entry (special tokens included), so a text of ``C`` characters is at least
``ceil(C / L)`` tokens. That holds for BPE whose every input byte has a token (byte-level, as GPT-2,
Llama 3, Qwen and SmolLM; or byte fallback, as Llama 2 and Mistral): an entry of ``L`` byte-level
characters spans ``L`` bytes, hence at most ``L`` characters, and a byte-fallback token spans one
byte. Nothing before the model may drop characters, so each normalizer and pre-tokenizer step is
checked: NFC and NFKC can merge up to 4 characters into one, so their text is measured after Python's
own NFC/NFKC (composition is stable across Unicode versions, so Python's and the tokenizer's counts
agree); a step that can drop text (whitespace splitting, stripping, regex replacement, added tokens
that swallow neighbouring spaces) leaves the tokenizer without a bound, and its prompts are only
checked after tokenizing, as before.
"""

from __future__ import annotations

import json
import unicodedata
import weakref
from dataclasses import dataclass
from typing import Any

from infer_core.server.errors import OpenAIError, bad_request

_KEEPS_TEXT = {"ByteLevel", "Metaspace", "Digits", "Punctuation", "UnicodeScripts"}  # pre-tokenizers
_NEVER_SHRINKS = {"NFD", "NFKD", "Lowercase", "Prepend"}  # normalizers (Replace is checked case by case)
_COMPOSING = {"NFC", "NFKC"}


@dataclass(frozen=True, slots=True)
class CharBound:
    """No token of this tokenizer covers more than ``chars_per_token`` characters (after ``normal_form``)."""

    chars_per_token: int
    normal_form: str | None = None  # "NFC" or "NFKC" when the tokenizer composes characters first


_bounds: weakref.WeakKeyDictionary[Any, CharBound | None] = weakref.WeakKeyDictionary()


def char_bound(tokenizer: Any) -> CharBound | None:
    """The tokenizer's bound, derived once; None when its pipeline could drop characters."""
    try:
        return _bounds[tokenizer]
    except KeyError:
        pass
    except TypeError:  # not weak-referenceable: derive each time
        return derive_char_bound(tokenizer)
    bound = _bounds[tokenizer] = derive_char_bound(tokenizer)
    return bound


def derive_char_bound(tokenizer: Any) -> CharBound | None:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None or type(backend.model).__name__ != "BPE":
        return None
    pre_steps = _steps(backend.pre_tokenizer, "pretokenizers")
    byte_level = any(step["type"] == "ByteLevel" for step in pre_steps)
    if not (byte_level or getattr(backend.model, "byte_fallback", False)):
        return None  # characters outside the vocabulary become <unk>, which may span any number of them
    if not all(_keeps_text(step) for step in pre_steps):
        return None
    normal_steps = _steps(backend.normalizer, "normalizers")
    normal_form = normal_steps[0]["type"] if normal_steps and normal_steps[0]["type"] in _COMPOSING else None
    if not all(_never_shrinks(step) for step in normal_steps[1 if normal_form else 0:]):
        return None
    added = backend.get_added_tokens_decoder().values()
    if any(token.lstrip or token.rstrip for token in added):
        return None  # such a token absorbs all the whitespace beside it
    longest = max(map(len, backend.get_vocab(with_added_tokens=True)), default=0)
    return CharBound(longest, normal_form) if longest else None


def _steps(component: Any, list_key: str) -> list[dict[str, Any]]:
    """A normalizer's or pre-tokenizer's steps, sequences flattened, from its JSON form."""
    if component is None:
        return []
    spec = json.loads(component.__getstate__())
    flat: list[dict[str, Any]] = []
    pending = [spec]
    while pending:
        step = pending.pop(0)
        if step.get("type") == "Sequence":
            pending[:0] = step.get(list_key, [])
        else:
            flat.append(step)
    return flat


def _keeps_text(step: dict[str, Any]) -> bool:
    kind = step.get("type")
    return kind in _KEEPS_TEXT or (kind == "Split" and step.get("behavior") != "Removed")


def _never_shrinks(step: dict[str, Any]) -> bool:
    kind = step.get("type")
    if kind == "Replace":
        pattern = step.get("pattern", {})
        return "String" in pattern and len(step.get("content", "")) >= len(pattern["String"])
    return kind in _NEVER_SHRINKS


def check_text(tokenizer: Any, text: str, max_model_len: int, what: str, param: str, reserve: int = 1) -> None:
    """400 ``context_length_exceeded`` when ``text`` is surely more than ``max_model_len - reserve`` tokens."""
    bound = char_bound(tokenizer) if max_model_len > 0 else None
    room = max_model_len - reserve
    if bound is None or len(text) <= room * bound.chars_per_token:
        return  # cannot prove it too long without tokenizing
    chars = len(text)
    measured = chars if bound.normal_form is None else len(unicodedata.normalize(bound.normal_form, text))
    at_least = -(-measured // bound.chars_per_token)
    if at_least <= room:
        return
    normalized = f" ({measured:,} after {bound.normal_form}, which the tokenizer applies first)" \
        if bound.normal_form else ""
    left = f", and at least {reserve} token must be left for the completion" if reserve else ""
    raise OpenAIError(
        400, f"This model's maximum context length is {max_model_len} tokens. However, {what} {chars:,} characters"
             f"{normalized}, which is at least {at_least:,} tokens: no token of this model's tokenizer covers more "
             f"than {bound.chars_per_token} characters ({measured:,} / {bound.chars_per_token}, rounded up){left}. "
             f"Please reduce the length of the {param}.", param=param, code="context_length_exceeded")


def check_token_ids(prompts: list[list[int]], vocab_size: int | None, param: str = "prompt") -> None:
    """400 naming the first token id outside ``[0, vocab_size)`` (lengths are checked with max_tokens)."""
    if not vocab_size:
        return
    for index, ids in enumerate(prompts):
        if max(ids) >= vocab_size:
            position = next(i for i, t in enumerate(ids) if t >= vocab_size)
            where = f"{param}[{index}][{position}]" if len(prompts) > 1 else f"{param}[{position}]"
            raise bad_request(f"{where} is token id {ids[position]}, outside this model's vocabulary "
                              f"(ids 0 to {vocab_size - 1}); tokenize with the served model's tokenizer "
                              f"(POST /tokenize)", param=param)
