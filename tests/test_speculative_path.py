"""The core's path for speculative decoding: drafts scheduled with a decode step, verified in one
forward pass, rejected ones rolled back. A prompt-lookup policy installed as a plugin drives it;
with greedy verification the tokens must equal plain greedy decoding exactly.
"""

from __future__ import annotations

import random
import sys

import pytest

from infer_core import LLM, SamplingParams
from infer_core.testing import install_plugin_package

PLUGIN = '''
from infer_core.hookspecs import hookimpl

@hookimpl
def register_decoding_policies(register):
    register("prompt-lookup", "infer_test_spec.policy:PromptLookupDecoding")
'''

POLICY = '''
from infer_core.interfaces import DecodingPolicy


class PromptLookupDecoding(DecodingPolicy):
    """Drafts the tokens that followed the latest earlier occurrence of the last token; keeps drafts
    while they equal the target's own (greedy) samples, then the target's token where they differ."""

    def __init__(self, ctx):
        super().__init__(ctx)
        self.num_drafted = 0
        self.num_accepted = 0

    @property
    def num_speculative_tokens(self):
        return 3

    def propose(self, requests):
        drafts = {}
        for request in requests:
            tokens = request.all_token_ids
            for i in range(len(tokens) - 2, -1, -1):
                if tokens[i] == tokens[-1] and tokens[i + 1:i + 4]:
                    drafts[request.request_id] = tokens[i + 1:i + 4]
                    break
        return drafts

    def accept(self, scheduler_output, runner_output):
        accepted = {}
        for request_id, sampled in zip(runner_output.request_ids, runner_output.sampled_token_ids):
            if not sampled:
                continue
            draft = scheduler_output.spec_token_ids.get(request_id, [])
            assert len(sampled) == len(draft) + 1, "one sample per draft plus one"
            keep = []
            for j, token in enumerate(sampled):
                keep.append(token)
                if j >= len(draft) or token != draft[j]:
                    break
            self.num_drafted += len(draft)
            self.num_accepted += len(keep) - 1
            accepted[request_id] = keep
        return accepted
'''


@pytest.fixture
def spec_plugin(tmp_path, monkeypatch):
    root = install_plugin_package(tmp_path / "site", "infer-test-spec", "test-spec", "infer_test_spec",
                                  {"plugin.py": PLUGIN, "policy.py": POLICY})
    monkeypatch.syspath_prepend(str(root))
    yield
    for module in [m for m in sys.modules if m.startswith("infer_test_spec")]:
        del sys.modules[module]


@pytest.mark.parametrize("settings", [
    {},
    {"max_num_batched_tokens": 24},  # prefill chunks next to drafted decodes; drafts dropped when they don't fit
    {"num_kv_blocks": 20},  # 320 tokens for 528 needed: preemption while drafts are in flight
])
def test_drafted_greedy_equals_plain_greedy(spec_plugin, tiny_checkpoint, settings):
    folder = str(tiny_checkpoint("qwen3"))
    rng = random.Random(11)
    prompts = [[rng.randrange(3, 40) for _ in range(n)] for n in (6, 30, 90, 150, 12)]  # small alphabet: repeats
    params = SamplingParams(temperature=0, max_tokens=48, ignore_eos=True)
    plain = LLM(folder, block_size=16, **settings).generate(prompts, params, use_tqdm=False)
    llm = LLM(folder, block_size=16, decoding="prompt-lookup", **settings)
    drafted = llm.generate(prompts, params, use_tqdm=False)
    policy = llm.engine.decoding
    assert [o.outputs[0].token_ids for o in drafted] == [o.outputs[0].token_ids for o in plain]
    assert policy.num_accepted > 10 and policy.num_drafted > policy.num_accepted  # both paths taken
    if "num_kv_blocks" in settings:
        assert llm.engine.stats().num_preemptions > 0
    assert llm.engine.scheduler.kv_allocator.num_free_blocks == llm.engine.num_kv_blocks


def test_drafts_stop_at_max_tokens_and_max_model_len(spec_plugin, tiny_checkpoint):
    folder = str(tiny_checkpoint("qwen3"))
    llm = LLM(folder, decoding="prompt-lookup", max_model_len=64)
    prompt = [5, 6, 7, 5, 6, 7, 5, 6, 7, 5, 6, 7]
    short = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=5, ignore_eos=True), use_tqdm=False)[0]
    assert len(short.outputs[0].token_ids) == 5
    full = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=None, ignore_eos=True), use_tqdm=False)[0]
    assert len(prompt) + len(full.outputs[0].token_ids) == 64 and full.outputs[0].finish_reason == "length"
