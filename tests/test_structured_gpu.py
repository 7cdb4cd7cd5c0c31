"""Structured outputs and prompt logprobs on a CUDA device: the grammar-mask kernel at a real vocabulary's size,
and an engine (CUDA graphs, overlapped scheduling) serving constrained and free requests in one batch.

Run on the GPU machine with ``python -m pytest -m gpu``; skipped without CUDA.
"""

from __future__ import annotations

import json
import math

import pytest
import torch

from infer_core import LLM, SamplingParams
from infer_core.layers.sampling.masks import apply_token_bitmask
from infer_core.sampling_params import StructuredOutputs
from infer_core.testing import make_tiny_checkpoint
from infer_core.testing_tokenizer import write_tiny_tokenizer

pytestmark = pytest.mark.gpu

PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string", "pattern": "[A-Za-z ]{1,6}"},
                   "age": {"type": "integer", "minimum": 0, "maximum": 99},
                   "tags": {"type": "array", "items": {"enum": ["x", "y"]}, "maxItems": 2}},
    "required": ["name", "age", "tags"],
    "additionalProperties": False,
}


def _bitmask(rows: int, vocab: int, generator: torch.Generator) -> torch.Tensor:
    words = -(-vocab // 32)
    return torch.randint(-2**31, 2**31, (rows, words), generator=generator, dtype=torch.int64).to(torch.int32)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_the_kernel_masks_as_the_torch_path_at_qwens_vocabulary(dtype):
    """64 of 80 rows masked, vocabulary 151936 (not a multiple of the kernel's block): the CUDA kernel in place
    equals the torch path, row for row, and leaves the other rows alone."""
    generator = torch.Generator().manual_seed(0)
    vocab, num_rows = 151936, 80
    logits = torch.randn(num_rows, vocab, generator=generator).to(dtype)
    rows = torch.randperm(num_rows, generator=generator)[:64].sort().values
    bitmask = _bitmask(64, vocab, generator)
    expected = apply_token_bitmask(logits, rows, bitmask, use_kernel=False)
    on_device = logits.cuda()
    out = apply_token_bitmask(on_device, rows.cuda(), bitmask.cuda())
    assert out.data_ptr() == on_device.data_ptr()  # in place
    assert torch.equal(out.cpu(), expected)


@pytest.fixture(scope="module")
def model_path(tmp_path_factory) -> str:
    folder = make_tiny_checkpoint("qwen3", tmp_path_factory.mktemp("tiny-grammar-gpu"))
    return str(write_tiny_tokenizer(folder))


def test_constrained_and_free_requests_share_cuda_graph_batches(model_path):
    """Decode batches of constrained and free rows on CUDA (graphs captured for the free batches, the sampler's
    mask on the constrained ones): every constrained output validates, every free one runs to its end."""
    import jsonschema_rs

    spec = StructuredOutputs(json=PERSON)
    params = [SamplingParams(temperature=1.0, seed=i, max_tokens=64, structured_outputs=spec if i % 2 else None,
                             ignore_eos=not i % 2) for i in range(32)]
    with LLM(model_path, device="cuda", num_kv_blocks=512) as llm:
        outputs = llm.generate([f"prompt {i}" for i in range(32)], params, use_tqdm=False)
        greedy = llm.generate(["Ada"] * 4, SamplingParams(temperature=0, max_tokens=64, structured_outputs=spec),
                              use_tqdm=False)
    validator = jsonschema_rs.validator_for(PERSON)
    for i, output in enumerate(outputs):
        completion = output.outputs[0]
        if i % 2:
            validator.validate(json.loads(completion.text))
        else:
            assert len(completion.token_ids) == 64
    texts = {o.outputs[0].text for o in greedy}
    assert len(texts) == 1
    validator.validate(json.loads(texts.pop()))


def test_prompt_logprobs_on_cuda_equal_the_cpu_engines(model_path):
    prompt = [(7 + 37 * i) % 380 + 3 for i in range(40)]
    params = SamplingParams(temperature=0, max_tokens=2, prompt_logprobs=2)
    scored = {}
    for device in ("cpu", "cuda"):
        with LLM(model_path, device=device, dtype="float32", num_kv_blocks=64) as llm:
            scored[device] = llm.generate([prompt], params, use_tqdm=False)[0].prompt_logprobs
    assert scored["cuda"][0] is None and len(scored["cuda"]) == len(prompt)
    for position in range(1, len(prompt)):
        token = prompt[position]
        cpu, cuda = scored["cpu"][position][token], scored["cuda"][position][token]
        assert math.isclose(cpu.logprob, cuda.logprob, abs_tol=1e-3), position
