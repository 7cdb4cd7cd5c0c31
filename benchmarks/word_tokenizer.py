"""A tokenizer of N words ("w0" … "w{N-1}", one token each), for serving benchmarks of dummy-weight models.

A dummy Qwen3 checkpoint comes without a tokenizer, and the hub's cannot be fetched on an offline machine. Random
weights sample ids from the whole vocabulary, so a tokenizer of another model (a smaller vocabulary) would turn
most of them into no text at all. This one gives every id of the model's vocabulary its own word, so each
generated token reaches the client as text, detokenized and streamed as a real tokenizer's would be.

    python3 -m benchmarks.word_tokenizer --vocab-size 151936 --out /tmp/word-tokenizer
"""

from __future__ import annotations

import argparse
from pathlib import Path


def write_word_tokenizer(vocab_size: int, out: Path) -> Path:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {f"w{i}": i for i in range(vocab_size)}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="w0"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.decoder = decoders.WordPiece(prefix="##", cleanup=False)  # joins words with spaces
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="w0", eos_token="w2", bos_token="w1")
    out.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(str(out))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocab-size", type=int, required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    print(write_word_tokenizer(args.vocab_size, args.out))


if __name__ == "__main__":
    main()
