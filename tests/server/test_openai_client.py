"""The official ``openai`` client against ``infer serve`` on the default model."""

from __future__ import annotations

import pytest

from infer_core import SamplingParams

pytestmark = pytest.mark.slow

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
MODEL = "SmolLM2-135M-Instruct"


def test_models_lists_the_served_model(client):
    models = client.models.list()
    assert [m.id for m in models.data] == [MODEL]


def test_chat_greedy_equals_llm_chat(client, offline_llm):
    reply = client.chat.completions.create(model=MODEL, messages=QUESTION, temperature=0, max_tokens=32)
    expected = offline_llm.chat(QUESTION, SamplingParams(temperature=0, max_tokens=32), use_tqdm=False)[0]
    choice = reply.choices[0]
    assert choice.message.role == "assistant"
    assert choice.message.content == expected.outputs[0].text
    assert "Paris" in choice.message.content
    assert choice.finish_reason == expected.outputs[0].finish_reason == "stop"
    assert reply.object == "chat.completion" and reply.id.startswith("chatcmpl-") and reply.model == MODEL
    assert reply.usage.prompt_tokens == len(expected.prompt_token_ids)
    assert reply.usage.completion_tokens == len(expected.outputs[0].token_ids)
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + reply.usage.completion_tokens


def test_completion_greedy_equals_llm_generate(client, offline_llm):
    prompt = "The three primary colors are"
    reply = client.completions.create(model=MODEL, prompt=prompt, temperature=0, max_tokens=24)
    expected = offline_llm.generate(prompt, SamplingParams(temperature=0, max_tokens=24), use_tqdm=False)[0]
    assert reply.choices[0].text == expected.outputs[0].text
    assert reply.choices[0].finish_reason == "length"
    assert reply.usage.completion_tokens == 24
    assert reply.object == "text_completion"


def test_streamed_chat_equals_the_whole_answer_and_ends_with_usage(client):
    whole = client.chat.completions.create(model=MODEL, messages=QUESTION, temperature=0, max_tokens=32)
    chunks = list(client.chat.completions.create(model=MODEL, messages=QUESTION, temperature=0, max_tokens=32,
                                                 stream=True, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert all(c.usage is None for c in chunks[:-1])
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    assert all(c.object == "chat.completion.chunk" and c.id == chunks[0].id for c in chunks)


def test_streamed_completion_equals_the_whole_text(client):
    args = dict(model=MODEL, prompt="Once upon a time", temperature=0, max_tokens=20)
    whole = client.completions.create(**args)
    chunks = list(client.completions.create(**args, stream=True))
    assert "".join(c.choices[0].text for c in chunks) == whole.choices[0].text
    assert chunks[-1].choices[0].finish_reason == "length"


def test_n_two_gives_two_choices(client):
    reply = client.chat.completions.create(model=MODEL, messages=QUESTION, n=2, temperature=1.0, seed=3,
                                           max_tokens=12)
    assert sorted(c.index for c in reply.choices) == [0, 1]
    assert all(c.message.content for c in reply.choices)
    stream = list(client.completions.create(model=MODEL, prompt="Hello", n=2, temperature=1.0, seed=3,
                                            max_tokens=8, stream=True))
    assert {c.choices[0].index for c in stream} == {0, 1}
    assert sum(1 for c in stream if c.choices[0].finish_reason == "length") == 2


def test_n_two_usage_counts_both_choices(client):
    reply = client.completions.create(model=MODEL, prompt="Hello", n=2, temperature=1.0, seed=5, max_tokens=6,
                                      extra_body={"ignore_eos": True})
    assert len(reply.choices) == 2
    assert reply.usage.completion_tokens == 12


def test_stop_string_ends_the_text_before_it(client):
    whole = client.completions.create(model=MODEL, prompt="1, 2, 3, 4,", temperature=0, max_tokens=16)
    text = whole.choices[0].text
    assert " 6" in text, text  # the model counts on; stop at its " 6"
    reply = client.completions.create(model=MODEL, prompt="1, 2, 3, 4,", temperature=0, max_tokens=16, stop=[" 6"])
    assert reply.choices[0].text == text[: text.index(" 6")]
    assert reply.choices[0].finish_reason == "stop"
    streamed = list(client.completions.create(model=MODEL, prompt="1, 2, 3, 4,", temperature=0, max_tokens=16,
                                              stop=[" 6"], stream=True))
    assert "".join(c.choices[0].text for c in streamed) == reply.choices[0].text


def test_max_tokens_ends_with_length(client):
    reply = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Tell me a long story."}],
                                           temperature=0, max_completion_tokens=5)
    assert reply.choices[0].finish_reason == "length"
    assert reply.usage.completion_tokens == 5


def test_chat_logprobs(client):
    reply = client.chat.completions.create(model=MODEL, messages=QUESTION, temperature=0, max_tokens=6,
                                           logprobs=True, top_logprobs=3)
    content = reply.choices[0].logprobs.content
    assert len(content) == reply.usage.completion_tokens
    assert "".join(t.token for t in content).startswith(reply.choices[0].message.content[:10])
    for token in content:
        assert token.logprob <= 0 and len(token.top_logprobs) == 3
        assert token.top_logprobs[0].logprob >= token.top_logprobs[1].logprob >= token.top_logprobs[2].logprob
        assert token.token == token.top_logprobs[0].token  # greedy: the sampled token is the top one


def test_completion_logprobs(client):
    reply = client.completions.create(model=MODEL, prompt="The sky is", temperature=0, max_tokens=4, logprobs=2)
    lp = reply.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == 4
    assert "".join(lp.tokens) == reply.choices[0].text
    assert all(len(top) == 2 for top in lp.top_logprobs)


def test_seed_reproduces_sampling(client):
    def sample(seed):
        return client.completions.create(model=MODEL, prompt="My favourite animal is", temperature=1.0, seed=seed,
                                         max_tokens=16).choices[0].text

    first = sample(1234)
    assert sample(1234) == first
    assert any(sample(s) != first for s in (1, 2, 3))


def test_echo_prepends_the_prompt(client):
    reply = client.completions.create(model=MODEL, prompt="Hello there", temperature=0, max_tokens=4, echo=True)
    assert reply.choices[0].text.startswith("Hello there")


def test_token_id_prompts_and_a_list_of_prompts(client, offline_llm):
    tokenizer = offline_llm.get_tokenizer()
    texts = ["The weather today is", "Paris is"]
    params = SamplingParams(temperature=0, max_tokens=5)
    offline = offline_llm.generate(texts, params, use_tqdm=False)
    expected = [o.outputs[0].text for o in offline]
    for prompt in (texts, [tokenizer.encode(t) for t in texts]):
        reply = client.completions.create(model=MODEL, prompt=prompt, temperature=0, max_tokens=5)
        by_index = {c.index: c.text for c in reply.choices}
        assert [by_index[0], by_index[1]] == expected
        assert reply.usage.completion_tokens == sum(len(o.outputs[0].token_ids) for o in offline)


def test_unknown_fields_are_ignored(client):
    reply = client.chat.completions.create(model=MODEL, messages=QUESTION, temperature=0, max_tokens=4, user="me",
                                           extra_body={"some_vendor_field": {"x": 1}})
    assert reply.choices[0].message.content
