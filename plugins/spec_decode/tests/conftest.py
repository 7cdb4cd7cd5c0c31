"""Fixtures of the speculative-decoding suite: tiny real checkpoints, written once per session."""

from __future__ import annotations

from pathlib import Path

import pytest
from infer_core.testing import TinyCheckpoints, default_model_tokenizer, make_tiny_checkpoint


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory) -> TinyCheckpoints:
    """``tiny_checkpoint("qwen3")`` -> folder of a random tiny model (config.json + safetensors)."""
    return TinyCheckpoints(tmp_path_factory)


@pytest.fixture(scope="session")
def tiny_with_tokenizer(tmp_path_factory) -> Path:
    """A tiny llama over the default model's vocabulary, with its tokenizer: text, stop strings, chat."""
    folder = make_tiny_checkpoint("llama", tmp_path_factory.mktemp("tiny-text"), vocab_size=49152)
    default_model_tokenizer().save_pretrained(folder)
    return folder
