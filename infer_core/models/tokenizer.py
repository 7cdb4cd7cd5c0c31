"""The model's tokenizer and chat template (HF tokenizer files, or the GGUF's own vocabulary)."""

from __future__ import annotations

import logging
from pathlib import Path

from infer_core.errors import ModelError
from infer_core.models.source import ModelSource

logger = logging.getLogger(__name__)

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


def load_tokenizer(source: ModelSource, tokenizer: str | None = None, chat_template: str | None = None):
    """A transformers tokenizer, or None when the model folder has none (dummy benchmarks).

    ``tokenizer``: a folder to take it from instead of the model's; ``chat_template``: a file or the template
    itself, replacing the tokenizer's (the settings of those names).
    """
    folder = Path(tokenizer) if tokenizer else source.path
    gguf_file = source.gguf_file if not tokenizer else None
    if gguf_file is None and not any((folder / name).is_file() for name in TOKENIZER_FILES):
        if tokenizer:
            raise ModelError(f"no tokenizer files ({', '.join(TOKENIZER_FILES)}) in {folder}")
        logger.info("no tokenizer in %s: prompts must be token ids and outputs carry no text", folder)
        return None
    from transformers import AutoTokenizer  # only now: a model without a tokenizer never imports transformers

    try:
        loaded = AutoTokenizer.from_pretrained(str(folder), gguf_file=gguf_file)
    except Exception as e:
        raise ModelError(f"cannot load the tokenizer from {folder}: {e}") from None
    if chat_template:
        template = Path(chat_template)
        loaded.chat_template = template.read_text() if template.is_file() else chat_template
    return loaded
