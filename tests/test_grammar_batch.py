"""The runner's batched grammar masks (runner/grammar_masks.py) against the row-at-a-time loop they replace.

Two copies of the same requests step side by side for many steps: one through ``GrammarMasks.build``
(xgrammar's batch accept and fill, into buffers kept across steps and refilled with garbage before
every step, so a word the fill leaves unwritten shows), one through a plain loop (each matcher accepts its token, a fresh bitmask
of ones, each live row filled). Among the requests: a free one, a choice that ends
(its grammar terminated: every token allowed), one handed a token its grammar refuses (dropped, with the
warning), and one that joins with output tokens its new matcher must catch up on (as after preemption).
"""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch

from infer_core.builtin.grammar_xgrammar import XGrammarBackend, XGrammarMatcher, grammar_vocab_size
from infer_core.interfaces import ConstraintMatcher, NewRequestData, SchedulerOutput
from infer_core.layers.sampler import SamplerOutput
from infer_core.runner.grammar_masks import GrammarMasks
from infer_core.runner.state import RequestState, RequestTable
from infer_core.runner.step_output import SampledStep
from infer_core.sampling_params import SamplingParams, StructuredOutputs
from infer_core.testing_tokenizer import write_tiny_tokenizer

pytest.importorskip("xgrammar")

VOCAB = 400  # logit columns: past the tokenizer's ids, as a model's LM head often is
TOKENIZER = 360  # the tiny tokenizer's ids: those the masks cover (the head's padding past them is never allowed)
EOS = 2
PERSON = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                                           "tags": {"type": "array", "items": {"enum": ["x", "y"]}}},
          "required": ["name", "age", "tags"], "additionalProperties": False}
SPECS = [StructuredOutputs(json=PERSON), StructuredOutputs(json=PERSON), None,
         StructuredOutputs(choice=["yes", "no"]), StructuredOutputs(regex=r"[a-c]{2}-\d{3}"),
         StructuredOutputs(json_object=True), StructuredOutputs(json=PERSON)]
TERMINATES, DROPPED, RESUMED = 3, 4, 6  # rows: the choice ends, the regex is handed a refused token, one joins late
DROP_STEP, JOIN_STEP, STEPS = 3, 5, 40


class OneAtATime(XGrammarMatcher):
    """xgrammar's matcher through the interface's one-at-a-time ``accept_each`` and ``fill_bitmasks``."""

    accept_each = classmethod(ConstraintMatcher.accept_each.__func__)
    fill_bitmasks = classmethod(ConstraintMatcher.fill_bitmasks.__func__)


@pytest.fixture(scope="module")
def backend(tmp_path_factory):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(write_tiny_tokenizer(tmp_path_factory.mktemp("tok")))
    return XGrammarBackend(None, tokenizer, VOCAB, [EOS])


@pytest.fixture()
def two_threads():
    XGrammarMatcher.threads = 2
    yield
    XGrammarMatcher.threads = None


def _reference(matchers: list, pending: list[int] | None, alive: list[bool]) -> torch.Tensor:
    """The row-at-a-time loop: accept (a terminated matcher skips; a refused token drops it), then a fresh
    bitmask of ones with each live matcher's row filled, and the ids past the tokenizer's in its last word
    cleared (xgrammar leaves them set where most tokens are allowed)."""
    for i, matcher in enumerate(matchers):
        if matcher is not None and alive[i] and pending and pending[i] is not None and not matcher.is_terminated():
            alive[i] = matcher.accept_token(pending[i])
    live = [i for i, m in enumerate(matchers) if m is not None and alive[i]]
    bitmask = torch.full((len(live), -(-TOKENIZER // 32)), -1, dtype=torch.int32)
    for j, i in enumerate(live):
        if not matchers[i].is_terminated():
            matchers[i].fill_next_token_bitmask(bitmask, j)
    bitmask[:, -1] &= (1 << TOKENIZER % 32) - 1
    return bitmask


def _allowed(row: torch.Tensor) -> np.ndarray:
    return np.flatnonzero(np.unpackbits(row.numpy().view(np.uint8), bitorder="little"))  # (an id past the
    # tokenizer's, were one allowed, would be refused: the drop count below would show it)


def _run(backend, matcher_class: type, caplog) -> None:
    constraints = [backend.compile(s) if s is not None else None for s in SPECS]
    resumed_prefix = backend.tokenizer.encode('{"name": "A', add_special_tokens=False)
    reference = [c.matcher()._matcher if c is not None else None for c in constraints]  # xgrammar's own
    alive = [True] * len(SPECS)
    table = RequestTable(len(SPECS))
    params = SamplingParams()

    def add(i: int, token_ids: list[int]) -> RequestState:  # as the scheduler sends a new (or resumed) request
        table.apply(SchedulerOutput(new_requests=[NewRequestData(f"r{i}", token_ids, 1, params, [], 1,
                                                                 constraints[i])]))
        state = table[f"r{i}"]
        if state.matcher is not None:
            state.matcher = matcher_class(state.matcher._matcher, state.matcher.vocab_size, frozenset([EOS]))
        return state

    states = [add(i, [1]) if i != RESUMED else None for i in range(len(SPECS))]
    masks = GrammarMasks(VOCAB, torch.device("cpu"))
    rng = np.random.default_rng(0)
    last_step, pending = None, None
    for step in range(STEPS):
        if step == JOIN_STEP:  # its earlier outputs are known tokens; its reference matcher takes them now
            states[RESUMED] = add(RESUMED, [1, *resumed_prefix])
            assert all(reference[RESUMED].accept_token(t) for t in resumed_prefix)
        in_batch = [i for i in range(len(SPECS)) if i != RESUMED or step >= JOIN_STEP]
        expected = _reference([reference[i] if i in in_batch else None for i in range(len(SPECS))],
                              pending, alive)
        batch_states = [states[i] for i in in_batch]
        with caplog.at_level(logging.WARNING, logger="infer_core.runner.constraints"), torch.inference_mode():  # the runner's step
            rows, bitmask = masks.build(table, batch_states, last_step, {states[i].request_id: j
                                                                         for j, i in enumerate(in_batch)}
                                        if last_step is not None else {})
        live = [j for j, i in enumerate(in_batch) if reference[i] is not None and alive[i]]
        assert rows.tolist() == live and torch.equal(bitmask, expected), step
        assert [states[i].matcher is not None for i in in_batch] == [reference[i] is not None and alive[i]
                                                                    for i in in_batch]
        by_row = dict(zip(rows.tolist(), bitmask))
        tokens = []
        for j, i in enumerate(in_batch):
            choices = _allowed(by_row[j]) if j in by_row else np.arange(VOCAB)
            if i == DROPPED and step == DROP_STEP:
                choices = np.setdiff1d(np.arange(TOKENIZER), choices)  # what min_tokens could leave: a refused token
            tokens.append(int(rng.choice(choices)))
        for j, i in enumerate(in_batch):  # the engine has the previous pending token now; this step's is pending
            state = states[i]
            if state.num_pending_tokens:
                state.token_ids.append(int(last_step.token_ids[last_rows[state.request_id]]))
            state.num_pending_tokens = 1
        last_rows = {states[i].request_id: j for j, i in enumerate(in_batch)}
        last_step = SampledStep([states[i].request_id for i in in_batch], list(range(len(in_batch))), batch_states,
                                SamplerOutput(token_ids=torch.tensor(tokens)))
        masks.host_bitmask.fill_(0x5A5A5A5A)  # garbage where this step's masks were
        pending = [tokens[in_batch.index(i)] if i in in_batch else None for i in range(len(SPECS))]
    assert reference[TERMINATES].is_terminated() and states[TERMINATES].matcher.is_terminated
    assert not alive[DROPPED] and states[DROPPED].matcher is None and table.num_constrained == len(SPECS) - 2
    assert any("r4: token" in r.getMessage() and "outside its grammar" in r.getMessage() for r in caplog.records)


def test_batched_masks_equal_the_row_at_a_time_loop(backend, two_threads, caplog):
    _run(backend, XGrammarMatcher, caplog)


def test_the_interfaces_one_at_a_time_fallback_equals_it_too(backend, caplog):
    _run(backend, OneAtATime, caplog)


def test_the_grammar_covers_the_tokenizer_not_the_heads_padding(backend):
    """xgrammar would take the LM head's ids past the tokenizer for special tokens, each one costing time in every
    accept and mask: the grammar's ids are the tokenizer's and the stop tokens', at most the logits'."""
    assert backend.compile(StructuredOutputs(regex="[ab]+")).matcher().vocab_size == TOKENIZER
    assert grammar_vocab_size(backend.tokenizer, VOCAB, (EOS,)) == TOKENIZER
    assert grammar_vocab_size(backend.tokenizer, VOCAB, (EOS, 390)) == 391  # a stop token past the tokenizer
    assert grammar_vocab_size(backend.tokenizer, 300, (EOS,)) == 300  # a tokenizer larger than the head


def test_a_stop_token_past_the_tokenizer_is_warned_about(backend, caplog):
    """A config whose end token the tokenizer lacks makes xgrammar take every id between for a special token (the
    grammar benchmark's first model config did: 119,645 of them, each accept ~36 times slower): said at start."""
    with caplog.at_level(logging.WARNING, logger="infer_core.builtin.grammar_xgrammar"):
        XGrammarBackend(None, backend.tokenizer, VOCAB, [EOS])
        assert not caplog.records
        XGrammarBackend(None, backend.tokenizer, VOCAB, [EOS, 390])
    message = caplog.records[-1].getMessage()
    assert "[390] lie past the tokenizer's 360 ids" in message and "cover 391 ids" in message and "the 30 between" in message
