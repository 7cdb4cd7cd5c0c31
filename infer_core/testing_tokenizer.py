"""A small real tokenizer for tiny checkpoints (``infer_core.testing.make_tiny_checkpoint``): a random model
under a grammar is the test of the grammar, and a grammar needs a tokenizer's vocabulary."""

from __future__ import annotations

from pathlib import Path

TINY_TOKENIZER_TEXT = (
    '{"name": "Ada", "age": 36, "tags": ["x", "y"], "ok": true, "none": null} [1, 2.5, -3e2] '
    "The quick brown fox jumps over the lazy dog. 0123456789 yes no maybe, Paris London <tool_call> </tool_call>"
)


def write_tiny_tokenizer(folder: str | Path, vocab_size: int = 384) -> Path:
    """A byte-level BPE tokenizer of ``vocab_size`` tokens in ``folder`` (beside a tiny checkpoint): ids 0-2 are
    ``<pad>``, ``<s>``, ``</s>`` (the tiny models' pad, bos and eos), then the 256 bytes, then merges of JSON
    and English text; with a ChatML chat template. Any text round-trips, so grammars can be tested on it."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<pad>", "<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tokenizer.train_from_iterator([TINY_TOKENIZER_TEXT] * 4, trainer)
    template = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token="<pad>", bos_token="<s>", eos_token="</s>")
    fast.chat_template = template
    folder = Path(folder)
    fast.save_pretrained(folder)
    return folder
