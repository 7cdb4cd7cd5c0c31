"""Garbage-collector passes during the step loop walk what the work created, not the whole heap.

A full (generation-2) pass walks every object the collector tracks; after start-up that is the
whole of torch, transformers and the model, a quarter of a second per pass on the host. While an
engine has requests in progress the heap it started them on is frozen and young passes wait for
more objects (``runner/gc_policy.py``), and a final-only sequence (``LLM.generate``) keeps where
each step ended as ints, not a list per step.

- ``StepLoopGC``: the first holder freezes and raises the young threshold, the last release undoes
  both; garbage cycles from before are collected once released; a heap the program froze is frozen
  further (and unfrozen with ours); a disabled collector or threshold 0 is left alone; a threshold
  the program changed meanwhile stays.
- The engine: during the step loop the objects a full pass would walk exclude a 200,000-object
  start-up heap; an idle, aborted, dead or shut-down engine holds no freeze; with two busy
  engines the heap stays frozen until both are idle.
- The output processor: a final-only sequence's retained objects do not grow with its steps.
"""

from __future__ import annotations

import gc
import weakref

import pytest

from infer_core import LLM, SamplingParams
from infer_core.runner.gc_policy import STEP_LOOP_GC, YOUNG_THRESHOLD, StepLoopGC
from infer_core.engine.output_processor import OutputProcessor
from infer_core.interfaces import Request, RequestStatus, RequestUpdate

STARTUP_HEAP = 200_000  # tracked objects made before any request, standing in for torch & co


@pytest.fixture(autouse=True)
def collector_as_found():
    """Every test starts and ends with no frozen heap, the collector on and its thresholds as they
    were (nothing here leaks a hold)."""
    threshold = gc.get_threshold()
    assert gc.get_freeze_count() == 0 and gc.isenabled(), "a frozen heap leaked in from an earlier test"
    yield
    frozen, left = gc.get_freeze_count(), gc.get_threshold()
    gc.unfreeze()
    gc.enable()
    gc.set_threshold(*threshold)
    assert frozen == 0 and left == threshold and STEP_LOOP_GC.num_holders == 0, "a test left the collector set up"


def _walked(obj) -> bool:
    """Whether a full collection pass would walk ``obj`` (frozen objects are in no generation)."""
    return any(o is obj for o in gc.get_objects())


# ---------------------------------------------------------------------------------------------
# StepLoopGC


def test_the_first_hold_sets_the_collector_up_and_the_last_release_undoes_it():
    threshold = gc.get_threshold()
    policy = StepLoopGC(young_threshold=threshold[0] + 5000)
    before = [1, 2]
    policy.hold()
    assert gc.get_freeze_count() > 0 and not _walked(before) and policy.is_managing
    assert gc.get_threshold() == (threshold[0] + 5000, *threshold[1:])
    during = [3, 4]
    policy.hold()  # a second busy engine: what came since the first hold is frozen too
    assert not _walked(during)
    policy.release()
    assert gc.get_freeze_count() > 0 and not _walked(before) and gc.get_threshold()[0] == threshold[0] + 5000
    policy.release()
    assert gc.get_freeze_count() == 0 and _walked(before) and _walked(during) and not policy.is_managing
    assert gc.get_threshold() == threshold
    with pytest.raises(RuntimeError, match="without a matching hold"):
        policy.release()


def test_thresholds_the_program_chose_are_kept():
    threshold = gc.get_threshold()
    gc.set_threshold(50_000, *threshold[1:])  # higher than ours: kept while busy
    policy = StepLoopGC(young_threshold=10_000)
    policy.hold()
    assert gc.get_threshold()[0] == 50_000
    policy.release()
    gc.set_threshold(*threshold)
    policy.hold()
    gc.set_threshold(123, 4, 5)  # changed by the program while busy: not undone
    policy.release()
    assert gc.get_threshold() == (123, 4, 5)
    gc.set_threshold(*threshold)


def test_garbage_cycles_from_before_are_collected_once_released():
    class Node:
        pass

    node = Node()
    node.self = node
    alive = weakref.ref(node)
    del node
    policy = StepLoopGC()
    policy.hold()
    gc.collect()
    assert alive() is not None  # frozen: no pass looks at it
    policy.release()
    gc.collect()
    assert alive() is None


def test_a_heap_the_program_froze_is_frozen_further_while_busy():
    gc.freeze()
    threshold = gc.get_threshold()
    policy = StepLoopGC()
    during = [object()]
    policy.hold()
    assert policy.is_managing and not _walked(during) and gc.get_threshold()[0] == max(threshold[0], 10_000)
    policy.release()
    # one permanent generation: ours and the program's are unfrozen together, the thresholds restored
    assert gc.get_freeze_count() == 0 and _walked(during) and gc.get_threshold() == threshold


def test_a_disabled_collector_is_left_alone():
    threshold = gc.get_threshold()
    zero_threshold = (lambda: gc.set_threshold(0), lambda: gc.set_threshold(*threshold))
    for disable, enable in ((gc.disable, gc.enable), zero_threshold):
        disable()
        policy = StepLoopGC()
        policy.hold()
        assert gc.get_freeze_count() == 0 and not policy.is_managing and gc.get_threshold()[0] in (0, threshold[0])
        policy.release()
        enable()


# ---------------------------------------------------------------------------------------------
# the engine


@pytest.fixture(scope="module")
def tiny_path(tiny_checkpoint) -> str:
    return str(tiny_checkpoint("qwen3"))


@pytest.fixture(scope="module")
def llm(tiny_path):
    llm = LLM(tiny_path, device="cpu", num_kv_blocks=256)
    yield llm
    llm.shutdown()


PARAMS = SamplingParams(temperature=0.6, max_tokens=24, ignore_eos=True)


def _prompts(num: int) -> list[list[int]]:
    return [[(7 * i + 13 * j) % 300 + 3 for j in range(10 + 3 * i)] for i in range(num)]


def test_full_passes_in_the_step_loop_skip_the_startup_heap(llm):
    engine = llm.engine
    threshold = gc.get_threshold()
    startup = [[i] for i in range(STARTUP_HEAP)]
    for prompt in _prompts(4):
        engine.add_request(None, prompt, PARAMS)
    walked, young = [], []
    while engine.has_unfinished_requests():
        engine.step()
        if engine.has_unfinished_requests():
            walked.append(len(gc.get_objects()))
            young.append(gc.get_threshold()[0])
    assert len(walked) > 10
    assert max(walked) < STARTUP_HEAP // 4, walked  # before: the whole heap, startup included
    assert min(young) >= YOUNG_THRESHOLD
    assert gc.get_freeze_count() == 0 and len(gc.get_objects()) > STARTUP_HEAP  # idle: all walked again
    assert gc.get_threshold() == threshold
    del startup


def test_an_idle_aborted_or_stopped_engine_holds_no_freeze(llm, tiny_path):
    engine = llm.engine
    llm.generate(_prompts(3), PARAMS, use_tqdm=False)
    assert gc.get_freeze_count() == 0
    ids = [engine.add_request(None, p, PARAMS) for p in _prompts(3)]
    for _ in range(3):
        engine.step()
    assert gc.get_freeze_count() > 0
    for request_id in ids:
        engine.abort(request_id)
    while engine.has_unfinished_requests():  # an overlapped step still in flight is read by the next
        engine.step()
    assert gc.get_freeze_count() == 0
    other = LLM(tiny_path, device="cpu", num_kv_blocks=256)
    other.engine.add_request(None, _prompts(1)[0], PARAMS)
    other.engine.step()
    assert gc.get_freeze_count() > 0
    other.shutdown()  # with its request unfinished
    assert gc.get_freeze_count() == 0


def test_a_failed_step_releases_the_freeze(tiny_path):
    failing = LLM(tiny_path, device="cpu", num_kv_blocks=256)
    engine = failing.engine
    engine.add_request(None, _prompts(1)[0], PARAMS)
    engine.step()
    assert gc.get_freeze_count() > 0

    def lost_device(*args, **kwargs):
        raise RuntimeError("device lost")

    engine.executor.execute_async = lost_device
    with pytest.raises(RuntimeError, match="device lost"):
        engine.step()
    assert engine.is_dead and gc.get_freeze_count() == 0
    failing.shutdown()
    assert STEP_LOOP_GC.num_holders == 0


def test_an_engine_dropped_while_busy_gives_its_hold_back(tiny_path):
    dropped = LLM(tiny_path, device="cpu", num_kv_blocks=256)
    dropped.engine.add_request(None, _prompts(1)[0], PARAMS)
    dropped.engine.step()
    assert STEP_LOOP_GC.num_holders == 1 and gc.get_freeze_count() > 0
    del dropped  # with its request unfinished and no shutdown: freed by reference counting
    assert STEP_LOOP_GC.num_holders == 0 and gc.get_freeze_count() == 0


def test_two_busy_engines_keep_the_heap_frozen_until_both_are_idle(llm, tiny_path):
    second = LLM(tiny_path, device="cpu", num_kv_blocks=256)
    short = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True)
    try:
        llm.engine.add_request(None, _prompts(1)[0], PARAMS)
        second.engine.add_request(None, _prompts(2)[1], short)
        llm.engine.step()
        second.engine.step()
        assert STEP_LOOP_GC.num_holders == 2
        while second.engine.has_unfinished_requests():
            second.engine.step()
        assert STEP_LOOP_GC.num_holders == 1 and gc.get_freeze_count() > 0
        while llm.engine.has_unfinished_requests():
            llm.engine.step()
        assert STEP_LOOP_GC.num_holders == 0 and gc.get_freeze_count() == 0
    finally:
        second.shutdown()


# ---------------------------------------------------------------------------------------------
# the output processor


@pytest.fixture(scope="module")
def tokenizer():
    from infer_core.testing import default_model_tokenizer

    return default_model_tokenizer()


def test_a_final_only_sequence_keeps_no_object_per_step(tokenizer):
    processor = OutputProcessor(tokenizer)
    prompt = tokenizer.encode("Count:", add_special_tokens=False)
    output_ids = tokenizer.encode(" one two three four five six seven" * 40, add_special_tokens=False)
    params = SamplingParams(max_tokens=len(output_ids))
    processor.add("p", None, prompt, [("p", params)], arrival_time=0.0, final_only=True)
    assert processor.parents["p"].sequences["p"].pending_step_ends is not None  # text decoded at the end
    request = Request("p", list(prompt), params, max_tokens=len(output_ids), eos_token_ids=frozenset())
    gc.collect()
    tracked = len(gc.get_objects())
    for token in output_ids[:-1]:
        request.all_token_ids.append(token)
        processor.process([RequestUpdate(request, [token], None, False)])
    gc.collect()
    assert len(gc.get_objects()) - tracked < 50, len(output_ids)  # before: one list per step
    request.all_token_ids.append(output_ids[-1])
    request.status = RequestStatus.FINISHED_LENGTH
    outputs, _ = processor.process([RequestUpdate(request, [output_ids[-1]], None, True)])
    assert outputs[0].finished and outputs[0].outputs[0].text == tokenizer.decode(output_ids)


# ---------------------------------------------------------------------------------------------
# the benchmark


def test_the_host_stalls_benchmark_runs_the_workload():
    import argparse

    from benchmarks.host_stalls import PARTS, run

    args = argparse.Namespace(label="test", model=None, load_format="dummy", dtype="bfloat16", attention=None,
                              device="cpu", block_size=None, tokenizer=False, num_prompts=6, max_len=120,
                              max_model_len=512)
    row, settings = run(args)
    assert row["output_tokens"] > 6 * 100 and row["num_steps"] > 100 and settings["num_prompts"] == 6
    for part in ("step", *PARTS):
        figures = row[part]
        if part == "replay":  # CUDA graphs only: on the CPU every step runs eagerly
            assert figures["total_ms"] == 0.0
            continue
        assert 0 < figures["p50_ms"] <= figures["p99_ms"] <= figures["max_ms"] <= figures["total_ms"], part
    assert row["gc_threshold_in_run"][0] >= YOUNG_THRESHOLD and row["frozen_objects_in_run"] > 0


def test_the_step_recorder_puts_a_gc_pass_in_the_step_and_part_it_ran_in(tiny_path):
    from benchmarks.host_stalls import StepRecorder, summarize

    recorded = LLM(tiny_path, device="cpu", num_kv_blocks=256)
    engine = recorded.engine
    schedule = engine.scheduler.schedule
    collect_at = 4

    def schedule_with_a_full_pass():
        if engine.scheduler.num_unfinished and len(recorder.steps) == collect_at:
            gc.collect()
        return schedule()

    engine.scheduler.schedule = schedule_with_a_full_pass
    recorder = StepRecorder(engine)
    try:
        recorded.generate(_prompts(3), PARAMS, use_tqdm=False)
    finally:
        recorder.close()
        recorded.shutdown()
    assert engine.step.__func__ is type(engine).step and engine.scheduler.schedule is schedule_with_a_full_pass
    full = [p for p in recorder.gc_passes if p["generation"] == 2]
    assert [(p["step"], p["part"]) for p in full] == [(collect_at, "schedule")]
    step = recorder.steps[collect_at]
    assert step["schedule"] * 1e3 >= full[0]["ms"] and step["gc"] * 1e3 >= full[0]["ms"]
    summary = summarize(recorder)
    assert summary["num_steps"] == len(recorder.steps) and summary["gc"]["2"]["count"] == 1
    assert summary["slowest"]["schedule"][0]["gc_generations"] == [2] or full[0]["ms"] < 1.0
