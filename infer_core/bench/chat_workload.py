"""The chat workload of ``infer bench throughput --workload chat``: the CPU's generation benchmark.

32 short questions, each put through the model's chat template (one user turn, the generation prompt
added) and tokenized once here, so every system of a run gets the same token ids; ``--new-tokens`` (128)
greedy tokens each, ``ignore_eos``. Small enough for a laptop's CPU, and what a first user of the
embedded default model does: a batch of chat answers.
"""

from __future__ import annotations

from pathlib import Path

from infer_core.bench.config import BenchmarkError
from infer_core.bench.workload import OfflineWorkload

QUESTIONS = (
    "What is the capital of France?", "How do airplanes stay in the air?", "Explain photosynthesis simply.",
    "What causes the seasons on Earth?", "Write a haiku about the sea.", "What is a prime number?",
    "How does a refrigerator work?", "Why is the sky blue?", "Give three tips for learning a language.",
    "What is the difference between weather and climate?", "How do vaccines work?", "What is an atom made of?",
    "Describe the water cycle.", "What does a compiler do?", "Why do cats purr?", "How are rainbows formed?",
    "What is the tallest mountain in the world?", "Explain gravity to a child.", "What is machine learning?",
    "How do bees make honey?", "What is the speed of light?", "Why do leaves change color in autumn?",
    "What is democracy?", "How does the heart pump blood?", "Name three renewable energy sources.",
    "What is a black hole?", "How do I boil an egg?", "What is the Pythagorean theorem?",
    "Why do we dream?", "What are the planets of the solar system?", "How does a bicycle stay upright?",
    "What is the meaning of the word 'ubiquitous'?",
)
CHAT_NEW_TOKENS = 128


def chat_texts(tokenizer, num_prompts: int = len(QUESTIONS)) -> list[str]:
    """The first ``num_prompts`` questions as chat-template text, each ready for the assistant's answer."""
    return [tokenizer.apply_chat_template([{"role": "user", "content": q}], tokenize=False, add_generation_prompt=True)
            for q in QUESTIONS[:num_prompts]]


def chat_workload(folder: str | Path, num_prompts: int = len(QUESTIONS),
                  new_tokens: int = CHAT_NEW_TOKENS) -> OfflineWorkload:
    """The workload's token ids by the tokenizer and chat template in ``folder``; greedy (temperature 0)."""
    if not 1 <= num_prompts <= len(QUESTIONS):
        raise BenchmarkError(f"--num-prompts must be between 1 and {len(QUESTIONS)} for --workload chat, "
                             f"got {num_prompts}")
    from transformers import AutoTokenizer

    from infer_core.models.tokenizer import TOKENIZER_FILES

    if not any((Path(folder) / name).is_file() for name in TOKENIZER_FILES):
        raise BenchmarkError(f"--workload chat needs the model's tokenizer, and {folder} has none of "
                             f"{', '.join(TOKENIZER_FILES)}; pass --model a checkpoint folder with its tokenizer "
                             "files, or use --workload nano-vllm")
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(folder))
    except Exception as e:
        raise BenchmarkError(f"--workload chat needs the model's tokenizer; loading it from {folder} failed "
                             f"({type(e).__name__}: {e})") from None
    if not getattr(tokenizer, "chat_template", None):
        raise BenchmarkError(f"--workload chat needs a chat template; the tokenizer in {folder} has none")
    prompts = [tokenizer(text, add_special_tokens=False).input_ids for text in chat_texts(tokenizer, num_prompts)]
    return OfflineWorkload(prompts, [new_tokens] * num_prompts, temperature=0.0)
