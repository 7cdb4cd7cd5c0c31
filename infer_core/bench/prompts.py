"""The prompts a serving benchmark sends: random token ids, random words, or a user's file.

Random completions prompts are lists of token ids drawn uniformly from [1000, 10000) with the
benchmark's seed: the OpenAI completions API accepts a list of ints as ``prompt``, so the server
sees exactly ``input_len`` prompt tokens whatever its tokenizer, and no detokenize/retokenize
round trip changes the length. Ids below 1000 are left out because tokenizers keep their special
and control tokens there; 10000 is below every Llama-family vocabulary size. The chat API takes
text only, so chat prompts are ``input_len`` random common words (about one token each).
"""

from __future__ import annotations

import json
import random
from pathlib import Path

Prompt = str | list[int]

MIN_RANDOM_TOKEN_ID = 1000
MAX_RANDOM_TOKEN_ID = 10000  # exclusive

_WORD_TEXT = """
time year people way day man thing woman life child world school state family
student group country problem hand part place case week company system program
question work government number night point home water room mother area money story
fact month lot right study book eye job word business issue side kind head house
service friend father power hour game line end member law car city community name
president team minute idea kid body information back parent face others level
office door health person art war history party result change morning reason
research girl guy moment air teacher force education river light stone green blue
small large early late open close begin walk write read speak listen think know
find give take make come go see look want use tell
"""
_WORDS = tuple(_WORD_TEXT.split())


class PromptsFileError(ValueError):
    """The --prompts-file cannot be read as prompts."""


def random_token_prompts(
    num_prompts: int, input_len: int, rng: random.Random
) -> list[list[int]]:
    """``num_prompts`` prompts of exactly ``input_len`` token ids each."""
    return [
        [
            rng.randrange(MIN_RANDOM_TOKEN_ID, MAX_RANDOM_TOKEN_ID)
            for _ in range(input_len)
        ]
        for _ in range(num_prompts)
    ]


def random_word_prompts(
    num_prompts: int, input_len: int, rng: random.Random
) -> list[str]:
    """``num_prompts`` texts of ``input_len`` random common words (about that many tokens)."""
    return [
        " ".join(rng.choice(_WORDS) for _ in range(input_len))
        for _ in range(num_prompts)
    ]


def read_prompts_file(path: str | Path) -> list[Prompt]:
    """Prompts from a file: one per line, as plain text or a JSON object ``{"prompt": ...}``.

    A JSON prompt may be a string or a list of token ids. Blank lines are skipped.
    """
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as e:
        raise PromptsFileError(
            f"cannot read --prompts-file {path}: {e.strerror or e}"
        ) from e
    prompts: list[Prompt] = []
    for number, line in enumerate(lines, start=1):
        text = line.strip()
        if not text:
            continue
        if text.startswith("{"):
            prompts.append(_json_prompt(text, path, number))
        else:
            prompts.append(text)
    if not prompts:
        raise PromptsFileError(
            f"--prompts-file {path} holds no prompts; write one per line"
        )
    return prompts


def _json_prompt(text: str, path: Path, number: int) -> Prompt:
    where = f"--prompts-file {path}, line {number}"
    try:
        record = json.loads(text)
    except json.JSONDecodeError as e:
        raise PromptsFileError(f"{where}: not valid JSON ({e.msg})") from e
    prompt = record.get("prompt") if isinstance(record, dict) else None
    if isinstance(prompt, str) and prompt:
        return prompt
    if isinstance(prompt, list) and prompt and all(type(t) is int for t in prompt):
        return prompt
    raise PromptsFileError(
        f'{where}: expected {{"prompt": "<text>"}} or {{"prompt": [token ids]}}'
    )


def take_prompts(pool: list[Prompt], num_prompts: int, start: int = 0) -> list[Prompt]:
    """``num_prompts`` prompts from a given pool, in order from ``start``, cycling if short."""
    return [pool[(start + i) % len(pool)] for i in range(num_prompts)]
