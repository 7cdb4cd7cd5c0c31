"""The model's tokenizer and chat template (HF tokenizer files, or the GGUF's own vocabulary)."""

from __future__ import annotations

import logging
from pathlib import Path

from infer_core.config import EngineConfig
from infer_core.errors import ModelError

logger = logging.getLogger(__name__)

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


def load_tokenizer(config: EngineConfig):
    """A transformers tokenizer, or None when the model folder has none (dummy benchmarks)."""
    from transformers import AutoTokenizer

    settings, source = config.settings, config.source
    folder = Path(settings.tokenizer) if settings.tokenizer else source.path
    gguf_file = source.gguf_file if not settings.tokenizer else None
    if gguf_file is None and not any((folder / name).is_file() for name in TOKENIZER_FILES):
        if settings.tokenizer:
            raise ModelError(f"no tokenizer files ({', '.join(TOKENIZER_FILES)}) in {folder}")
        logger.info("no tokenizer in %s: prompts must be token ids and outputs carry no text", folder)
        return None
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(folder), gguf_file=gguf_file)
    except Exception as e:
        raise ModelError(f"cannot load the tokenizer from {folder}: {e}") from None
    if settings.chat_template:
        template = Path(settings.chat_template)
        tokenizer.chat_template = template.read_text() if template.is_file() else settings.chat_template
    return tokenizer
