"""Requests that can never be served are refused with the numbers; the rest of the engine carries on."""

from __future__ import annotations

import pytest

from infer_core import SamplingParams
from infer_core.engine.engine import Engine

GREEDY = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)


@pytest.fixture
def engine(tiny_checkpoint):
    # 24 blocks of 16 tokens = 384 tokens of KV, max_model_len 256.
    engine = Engine.from_settings(model=str(tiny_checkpoint("qwen2")), num_kv_blocks=24, block_size=16,
                                  max_model_len=256)
    yield engine
    engine.shutdown()


def _drain(engine: Engine) -> dict[str, list[int]]:
    done = {}
    for _ in range(1000):
        if not engine.has_unfinished_requests():
            break
        for output in engine.step():
            if output.finished:
                done[output.request_id] = output.outputs[0].token_ids
    return done


def test_bad_requests_are_refused_and_others_finish(engine, tiny_checkpoint):
    good = {"a": list(range(3, 40)), "b": list(range(5, 100))}
    for rid, prompt in good.items():
        engine.add_request(rid, prompt, GREEDY)
    engine.step()  # the good requests are running when the bad ones arrive

    with pytest.raises(ValueError, match=r"prompt has 300 tokens but max_model_len is 256"):
        engine.add_request("too-long", [7] * 300, GREEDY)
    with pytest.raises(ValueError, match=r"prompt is empty"):
        engine.add_request("empty", [], GREEDY)
    with pytest.raises(ValueError, match=r"token ids must be in \[0, 384\)"):
        engine.add_request("bad-id", [1, 2, 384], GREEDY)
    with pytest.raises(ValueError, match=r"a prompt is a string or a list of token ids"):
        engine.add_request("bad-type", [1.5, 2], GREEDY)
    with pytest.raises(ValueError, match=r"this model has no tokenizer"):
        engine.add_request("text", "hello", GREEDY)
    with pytest.raises(ValueError, match=r"stop strings need a tokenizer and this model has none"):
        engine.add_request("stop-text", [5, 6], SamplingParams(stop=["x"]))

    results = _drain(engine)
    assert set(results) == {"a", "b"}
    assert all(len(tokens) == 12 for tokens in results.values())
    assert engine.scheduler.kv_allocator.num_free_blocks == 24  # nothing leaked by the refusals

    alone = Engine.from_settings(model=str(tiny_checkpoint("qwen2")), num_kv_blocks=24, block_size=16,
                                 max_model_len=256)
    for rid, prompt in good.items():
        alone.add_request(rid, prompt, GREEDY)
    assert _drain(alone) == results


def test_request_larger_than_the_pool_gives_the_arithmetic(tiny_checkpoint):
    engine = Engine.from_settings(model=str(tiny_checkpoint("qwen2")), num_kv_blocks=4, block_size=16,
                                  max_model_len=256)
    # 40 prompt + 100 max_tokens = 140 tokens = 9 blocks of 16 > 4 blocks in the pool
    with pytest.raises(ValueError, match=r"needs 9 KV blocks \(40 prompt \+ 100 max_tokens tokens at 16 tokens per "
                                         r"block\) but the KV pool holds only 4 blocks"):
        engine.add_request("big", list(range(3, 43)), SamplingParams(max_tokens=100))
    engine.add_request("fits", list(range(3, 43)), SamplingParams(max_tokens=20, ignore_eos=True))
    assert len(_drain(engine)["fits"]) == 20


def test_abort_frees_blocks_at_once(engine):
    engine.add_request("x", list(range(3, 60)), SamplingParams(max_tokens=100, ignore_eos=True))
    engine.add_request("y", list(range(3, 30)), GREEDY)
    engine.step()
    allocator = engine.scheduler.kv_allocator
    used = allocator.num_blocks - allocator.num_free_blocks
    final = engine.abort("x")
    assert final.finished and final.outputs[0].finish_reason == "abort"
    assert allocator.num_blocks - allocator.num_free_blocks < used
    assert engine.abort("x") is None  # already gone
    assert set(_drain(engine)) == {"y"}


def test_runner_bans_every_end_token_while_min_tokens_holds(tmp_path):
    # a model whose config names EOS 7 while its tokenizer's EOS is <|im_end|> (2): both count
    from infer_core.testing import default_model_tokenizer, make_tiny_checkpoint

    folder = make_tiny_checkpoint("llama", tmp_path / "m", vocab_size=49152, eos_token_id=7)
    default_model_tokenizer().save_pretrained(folder)
    engine = Engine.from_settings(model=str(folder), num_kv_blocks=8)
    assert engine.eos_token_ids == {2, 7}
    assert set(engine.executor.worker.runner.config.eos_token_ids) == {2, 7}


def test_duplicate_request_id_is_refused(engine):
    engine.add_request("same", [3, 4, 5], GREEDY)
    with pytest.raises(ValueError, match="already in use"):
        engine.add_request("same", [3, 4, 5], GREEDY)


def test_completion_ids_of_n_do_not_collide(engine):
    engine.add_request("a", [3, 4, 5], SamplingParams(n=2, max_tokens=30, ignore_eos=True, temperature=1.0, seed=1))
    with pytest.raises(ValueError, match=r"request id '0_a' is already in use"):
        engine.add_request("0_a", [3, 4, 5], GREEDY)
    engine.add_request("1_b", [3, 4, 5], GREEDY)
    with pytest.raises(ValueError, match=r"completion id of request 'b' '1_b' is already in use"):
        engine.add_request("b", [3, 4, 5], SamplingParams(n=2))
    results = _drain(engine)
    assert set(results) == {"a", "1_b"}


def test_a_failed_step_stops_the_engine(engine):
    """Ctrl-C (or any error) inside a step leaves its state half-updated: the engine refuses to go on."""
    engine.add_request("x", list(range(3, 40)), GREEDY)
    execute = engine.executor.execute_async  # what the engine's step calls

    def interrupted(scheduler_output):
        execute(scheduler_output)
        raise KeyboardInterrupt

    engine.executor.execute_async = interrupted
    with pytest.raises(KeyboardInterrupt):
        engine.step()
    engine.executor.execute_async = execute
    from infer_core.errors import EngineDeadError

    with pytest.raises(EngineDeadError, match="restart it"):
        engine.step()
    with pytest.raises(EngineDeadError):
        engine.add_request("y", [3, 4], GREEDY)
    assert engine.abort("x").finished  # aborting (and freeing) still works
