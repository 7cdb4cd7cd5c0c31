"""Text output with the real default model: stop strings, streamed deltas, UTF-8-safe detokenization.

The model (SmolLM2-135M-Instruct) is loaded once for the module. Stop strings are taken from
the model's own unstopped greedy answers, so the expectations do not depend on what it says.
"""

from __future__ import annotations

import pytest

from infer_core import LLM, SamplingParams
from infer_core.engine.detokenizer import IncrementalDetokenizer
from infer_core.engine.output_processor import OutputProcessor
from infer_core.interfaces import Request, RequestStatus, RequestUpdate

BROKEN = "\ufffd"  # what a decoder shows for an incomplete UTF-8 character
MAX_TOKENS = 24

CHATS = {
    "france": "What is the capital of France?",
    "japanese": "Write a sentence in Japanese.",
    "emoji": "Write three emoji that describe happiness.",
    "repeat": "Repeat exactly: 😀 café 日本語 naïve 🎉 Привет",
}

# Multilingual text whose byte-level BPE tokens split characters (CJK and emoji take 3-4 bytes).
STRINGS = [
    "héllo wörld, naïve café — “quotes” … ½ €",
    "日本語のテキストです。漢字とひらがな。",
    "中文字符测试：你好，世界！",
    "한국어 텍스트와 띄어쓰기",
    "Привет, мир! Ελληνικά, עברית, العربية",
    "हिन्दी और ไทย ภาษา",
    "emoji 😀🎉🚀 👍🏽 family 👨‍👩‍👧 flags 🇫🇷🇯🇵",
    "math 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 ∑ ∫ √ 𝛼 and e\u0301 combining",
    "plain ASCII: def f(x):\n    return x + 1\n",
    " 😀",
    "語",
]


@pytest.fixture(scope="module")
def llm():
    engine = LLM(kv_cache_gb=0.5)
    yield engine
    engine.shutdown()


@pytest.fixture(scope="module")
def tokenizer(llm):
    return llm.get_tokenizer()


def _chat_prompt(llm: LLM, question: str) -> str:
    return llm.engine.render_chat([{"role": "user", "content": question}])


def stream(llm: LLM, requests: list[tuple[str, str, SamplingParams]]):
    """Run (request id, prompt text, params) to the end through ``Engine.step``; returns every
    RequestOutput each step gave, per request (kept as returned, read only afterwards)."""
    engine = llm.engine
    for request_id, prompt, params in requests:
        engine.add_request(request_id, prompt, params, add_special_tokens=False)
    steps: dict[str, list] = {request_id: [] for request_id, _, _ in requests}
    while engine.has_unfinished_requests():
        for output in engine.step():
            steps[output.request_id].append(output)
    return steps


@pytest.fixture(scope="module")
def reference(llm):
    """Greedy answers to CHATS without stop strings, streamed."""
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS)
    return stream(llm, [(name, _chat_prompt(llm, question), params) for name, question in CHATS.items()])


def _assert_clean_stream(steps, expected_text: str) -> None:
    """Deltas add up to the final text, each step only extends what was shown, none is broken."""
    shown = ""
    for output in steps:
        delta = output.outputs[0].delta_text
        assert BROKEN not in delta, f"delta {delta!r} holds a broken character"
        shown += delta
        assert expected_text.startswith(shown), f"streamed {shown!r}, but the final text is {expected_text!r}"
    assert shown == expected_text == steps[-1].outputs[0].text
    assert steps[-1].finished and not any(o.finished for o in steps[:-1])


def test_streamed_deltas_add_up_to_the_text(reference, tokenizer):
    num_split_tokens = 0
    for name, steps in reference.items():
        final = steps[-1].outputs[0]
        _assert_clean_stream(steps, final.text)
        shown = ""
        for output in steps:  # without stop strings nothing is held back: each step's text is what was shown
            shown += output.outputs[0].delta_text
            assert output.outputs[0].text == shown
        assert [t for o in steps for t in o.outputs[0].delta_token_ids] == final.token_ids
        full = tokenizer.decode(final.token_ids, skip_special_tokens=True)
        # the whole decode, less a character the last token left incomplete
        assert full.startswith(final.text) and set(full[len(final.text):]) <= {BROKEN}, (name, full, final.text)
        num_split_tokens += sum(BROKEN in tokenizer.decode([t]) for t in final.token_ids)
    assert any(ord(c) > 0x7FF for c in reference["japanese"][-1].outputs[0].text)
    assert num_split_tokens >= 10  # characters split across tokens were exercised


def _first_unique(text: str, start: int, length: int, wanted=lambda s: True) -> int:
    """Where, from ``start`` (else from 1), the first ``length`` characters begin that occur
    nowhere earlier."""
    for i in [*range(start, len(text) - length + 1), *range(1, start)]:
        piece = text[i : i + length]
        if text.find(piece) == i and piece.strip() and wanted(piece):
            return i
    raise AssertionError(f"no suitable stop string in {text!r}")


def test_stop_strings_end_the_stream_without_showing_them(llm, reference, tokenizer):
    cases = []  # (request id, stop strings, the one that must match, where it starts, include it?)
    for name, steps in reference.items():
        text = steps[-1].outputs[0].text
        middle = _first_unique(text, len(text) // 2, 4)
        cases.append((f"{name}-middle", [text[middle : middle + 4]], text[middle : middle + 4], middle, False))
        if any(ord(c) > 0x7F for c in text):
            wide = _first_unique(text, 1, 2, lambda s: ord(s[0]) > 0x7F)
            for include in (False, True):
                cases.append((f"{name}-wide-{include}", [text[wide : wide + 2]], text[wide : wide + 2], wide, include))
    assert sum("-wide-" in c[0] for c in cases) >= 4  # multi-byte stop strings were exercised
    # of several stop strings the earliest in the text ends it (the list order does not matter)
    france = reference["france"][-1].outputs[0].text
    later, earlier = france.index("France"), france.index("capital")
    assert earlier < later
    cases.append(("france-earliest", ["never there", "France", "capital"], "capital", earlier, False))

    requests = [(request_id, _chat_prompt(llm, CHATS[request_id.split("-")[0]]),
                 SamplingParams(temperature=0, max_tokens=MAX_TOKENS, stop=stops, include_stop_str_in_output=include))
                for request_id, stops, _, _, include in cases]
    results = stream(llm, requests)

    for request_id, _, stop, where, include in cases:
        full = reference[request_id.split("-")[0]][-1].outputs[0]
        # generation ends at the first token after which the text (up to a character boundary) holds it
        texts = (tokenizer.decode(full.token_ids[:m], skip_special_tokens=True) for m in range(len(full.token_ids) + 1))
        num_tokens = next(m for m, t in enumerate(texts) if stop in t and not t.endswith(BROKEN))
        steps = results[request_id]
        final = steps[-1].outputs[0]
        expected = full.text[: where + (len(stop) if include else 0)]
        assert final.text == expected, request_id
        assert final.finish_reason == "stop" and final.stop_reason == stop
        assert final.token_ids == full.token_ids[:num_tokens]
        _assert_clean_stream(steps, expected)


def test_llm_chat_stop_strings(llm, reference):
    full = reference["france"][-1].outputs[0]
    question = [{"role": "user", "content": CHATS["france"]}]
    params = [SamplingParams(temperature=0, max_tokens=MAX_TOKENS, stop=["Paris"]),
              SamplingParams(temperature=0, max_tokens=MAX_TOKENS, stop="Paris", include_stop_str_in_output=True),
              SamplingParams(temperature=0, max_tokens=MAX_TOKENS, stop=["Berlin"])]
    excluded, included, absent = (o.outputs[0] for o in llm.chat([question] * 3, params, use_tqdm=False))
    paris = full.text.index("Paris")
    assert excluded.text == full.text[:paris] and "Paris" not in excluded.text
    assert (excluded.finish_reason, excluded.stop_reason) == ("stop", "Paris")
    assert included.text == full.text[: paris + 5] and included.text.endswith("Paris")
    assert (included.finish_reason, included.stop_reason) == ("stop", "Paris")
    # a stop string that never occurs: the answer ends at the model's end token, with no stop_reason
    assert absent.text == full.text and absent.token_ids == full.token_ids
    assert (absent.finish_reason, absent.stop_reason) == ("stop", None)


def test_stop_strings_wait_for_min_tokens(llm, reference):
    full = reference["france"][-1].outputs[0]
    question = [{"role": "user", "content": CHATS["france"]}]
    capital_ends = next(m for m in range(1, len(full.token_ids))
                        if "capital" in llm.get_tokenizer().decode(full.token_ids[:m]))
    early, late = (o.outputs[0] for o in llm.chat(
        [question] * 2,
        [SamplingParams(temperature=0, max_tokens=MAX_TOKENS, stop=["capital"], min_tokens=capital_ends + 1),
         SamplingParams(temperature=0, max_tokens=MAX_TOKENS, stop=["capital"])],
        use_tqdm=False))
    # within min_tokens the stop string is not looked for (as vLLM): the answer runs to its end token
    assert early.text == full.text and early.token_ids == full.token_ids and early.stop_reason is None
    assert late.text == full.text[: full.text.index("capital")] and late.stop_reason == "capital"


def test_stop_token_text_is_left_out_unless_asked_for(llm, reference, tokenizer):
    full = reference["france"][-1].outputs[0]
    question = [{"role": "user", "content": CHATS["france"]}]
    stop_id = full.token_ids[3]  # a word token of the answer
    excluded, included = (o.outputs[0] for o in llm.chat(
        [question] * 2,
        [SamplingParams(temperature=0, max_tokens=MAX_TOKENS, stop_token_ids=[stop_id]),
         SamplingParams(temperature=0, max_tokens=MAX_TOKENS, stop_token_ids=[stop_id],
                        include_stop_str_in_output=True)],
        use_tqdm=False))
    assert excluded.token_ids == included.token_ids == full.token_ids[:4]
    assert excluded.stop_reason == stop_id and excluded.finish_reason == "stop"
    assert excluded.text == tokenizer.decode(full.token_ids[:3], skip_special_tokens=True)
    assert included.text == tokenizer.decode(full.token_ids[:4], skip_special_tokens=True)
    eos_kept = llm.chat(question, SamplingParams(temperature=0, max_tokens=MAX_TOKENS, skip_special_tokens=False),
                        use_tqdm=False)[0].outputs[0]
    assert eos_kept.token_ids[-1] in llm.engine.eos_token_ids and not eos_kept.text.endswith("<|im_end|>")


# ---------------------------------------------------------------------------------------------
# forced tokens: the output processor and the detokenizer on known token sequences


def _feed(tokenizer, prompt_ids: list[int], output_ids: list[int], params: SamplingParams, chunk: int = 1):
    """Drive an OutputProcessor as the engine would, ``chunk`` tokens per step (the last step ends
    the request by length); returns each step's CompletionOutput until it finished."""
    processor = OutputProcessor(tokenizer)
    processor.add("r", None, prompt_ids, [("r", params)], arrival_time=0.0)
    request = Request("r", list(prompt_ids), params, max_tokens=len(output_ids))
    steps = []
    for start in range(0, len(output_ids), chunk):
        new = output_ids[start : start + chunk]
        request.all_token_ids.extend(new)
        is_last = start + chunk >= len(output_ids)
        if is_last:
            request.status = RequestStatus.FINISHED_LENGTH
        outputs, stopped = processor.process([RequestUpdate(request, new, None, is_last)])
        steps.append(outputs[0].outputs[0])
        if stopped or is_last:
            break
    return steps


@pytest.mark.parametrize("text, stops, expected_stop", [
    ("Résumé: 日本語のテキスト 😀 and 🎉 done — ok", ["🎉"], "🎉"),
    ("Résumé: 日本語のテキスト 😀 and 🎉 done — ok", ["語の"], "語の"),
    ("Résumé: 日本語のテキスト 😀 and 🎉 done — ok", ["zzz", "ト 😀 a", "done"], "ト 😀 a"),
    ("Résumé: 日本語のテキスト 😀 and 🎉 done — ok", ["テキスト 😀!"], None),  # a long prefix matches, then not
    ("Résumé: 日本語のテキスト 😀 and 🎉 done — ok", ["ok!"], None),
    ("emoji 😀🎉🚀 👍🏽 family 👨‍👩‍👧 end", ["👍🏽"], "👍🏽"),
])
@pytest.mark.parametrize("chunk", [1, 3])
def test_stop_strings_on_forced_tokens(tokenizer, text, stops, expected_stop, chunk):
    prompt_ids = tokenizer.encode("Say it:", add_special_tokens=False)
    output_ids = tokenizer.encode(text, add_special_tokens=False)
    for include in (False, True):
        params = SamplingParams(stop=stops, include_stop_str_in_output=include)
        steps = _feed(tokenizer, prompt_ids, output_ids, params, chunk)
        final = steps[-1]
        if expected_stop is None:
            expected = text
            assert (final.finish_reason, final.stop_reason) == ("length", None)
        else:
            expected = text[: text.index(expected_stop) + (len(expected_stop) if include else 0)]
            assert (final.finish_reason, final.stop_reason) == ("stop", expected_stop)
        assert final.text == expected
        shown = ""
        for step in steps:
            assert BROKEN not in step.delta_text
            shown += step.delta_text
            assert expected.startswith(shown)
        assert shown == expected


def _detokenize(tokenizer, prompt_ids, output_ids, chunk=1, skip_special_tokens=True) -> list[str]:
    detokenizer = IncrementalDetokenizer(tokenizer, prompt_ids, skip_special_tokens)
    return [detokenizer.update(output_ids[i : i + chunk]) for i in range(0, len(output_ids), chunk)]


def test_detokenizer_deltas_add_up_to_the_decode(tokenizer):
    prompts = [[], tokenizer.encode("Say:", add_special_tokens=False),
               tokenizer.encode("前の文章 😀", add_special_tokens=False)]  # a multi-byte prompt tail
    num_split_tokens = 0
    for text in STRINGS:
        ids = tokenizer.encode(text, add_special_tokens=False)
        decoded = tokenizer.decode(ids)
        assert decoded == text and BROKEN not in decoded
        num_split_tokens += sum(BROKEN in tokenizer.decode([t]) for t in ids)
        for prompt_ids in prompts:
            for chunk in (1, 2, 3):
                deltas = _detokenize(tokenizer, prompt_ids, ids, chunk)
                assert "".join(deltas) == decoded, (text, prompt_ids, chunk, deltas)
                assert not any(BROKEN in d for d in deltas), deltas
    assert num_split_tokens >= 20


def test_detokenizer_never_shows_a_character_cut_at_the_end(tokenizer):
    """Generation may stop inside a character: what was shown is the decode up to the last token
    that ended on a character boundary (a token like " \\xe2" holds back its space too)."""
    prompt_ids = tokenizer.encode("Say:", add_special_tokens=False)
    num_cut = 0
    for text in STRINGS:
        ids = tokenizer.encode(text, add_special_tokens=False)
        complete = ""  # decode of the longest prefix of ids[:m] that ends on a character boundary
        for m in range(1, len(ids) + 1):
            deltas = _detokenize(tokenizer, prompt_ids, ids[:m])
            decoded = tokenizer.decode(ids[:m])
            if not decoded.endswith(BROKEN):
                complete = decoded
            num_cut += decoded.endswith(BROKEN)
            assert not any(BROKEN in d for d in deltas)
            assert "".join(deltas) == complete, (text, m)
    assert num_cut >= 20


def test_detokenizer_completes_a_character_the_prompt_began(tokenizer):
    """Token-id prompts may end inside a character; the output shows it once its last bytes come."""
    num_cut = 0
    for text in STRINGS:
        ids = tokenizer.encode(text, add_special_tokens=False)
        for k in range(1, len(ids)):
            prompt_text = tokenizer.decode(ids[:k])
            deltas = _detokenize(tokenizer, ids[:k], ids[k:])
            assert not any(BROKEN in d for d in deltas)
            assert "".join(deltas) == text[len(prompt_text.rstrip(BROKEN)):], (text, k, deltas)
            num_cut += prompt_text.endswith(BROKEN)
    assert num_cut >= 20


def test_detokenizer_special_tokens(tokenizer):
    eos = tokenizer.eos_token_id
    encode = lambda text: tokenizer.encode(text, add_special_tokens=False)  # noqa: E731
    ids = encode("日本") + [eos] + encode("語 ok")
    assert "".join(_detokenize(tokenizer, [], ids)) == tokenizer.decode(ids, skip_special_tokens=True) == "日本語 ok"
    shown = "".join(_detokenize(tokenizer, [], ids, skip_special_tokens=False))
    assert shown == tokenizer.decode(ids, skip_special_tokens=False) and tokenizer.eos_token in shown
