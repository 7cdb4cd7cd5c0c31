"""AsyncEngine: the engine thread the server drives, without HTTP in between."""

from __future__ import annotations

import asyncio

import pytest

from infer_core import SamplingParams
from infer_core.engine.async_engine import AsyncEngine
from infer_core.engine.engine_state import EngineState
from infer_core.engine.engine import Engine
from infer_core.errors import EngineDeadError, RequestError

GREEDY = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)


def _builder(folder):
    return lambda: Engine.from_settings(model=str(folder), device="cpu", dtype="float32", num_kv_blocks=64)


async def _started(folder) -> AsyncEngine:
    engine = AsyncEngine(_builder(folder))
    engine.start(asyncio.get_running_loop())
    await asyncio.to_thread(engine.loaded.wait, 120)
    assert engine.state is EngineState.READY, engine.error
    return engine


async def _collect(stream) -> list[int]:
    tokens: list[int] = []
    async for output in stream:
        tokens = output.outputs[0].token_ids
    return tokens


def test_concurrent_requests_match_the_offline_engine(tiny_checkpoint):
    folder = tiny_checkpoint("qwen3")
    prompts = [[5, 6, 7], [9, 10, 11, 12, 13], [3] * 20]
    offline = _builder(folder)()
    expected = []
    for i, p in enumerate(prompts):
        offline.add_request(str(i), p, GREEDY)
    done = {}
    while offline.has_unfinished_requests():
        for out in offline.step():
            if out.finished:
                done[out.request_id] = out.outputs[0].token_ids
    expected = [done[str(i)] for i in range(len(prompts))]
    offline.shutdown()

    async def run():
        engine = await _started(folder)
        try:
            streams = [await engine.add_request(f"r{i}", p, GREEDY) for i, p in enumerate(prompts)]
            return await asyncio.gather(*(_collect(s) for s in streams))
        finally:
            await asyncio.to_thread(engine.shutdown)

    assert asyncio.run(run()) == expected


def test_abort_ends_the_stream_and_frees_the_blocks(tiny_checkpoint):
    async def run():
        engine = await _started(tiny_checkpoint("llama"))
        try:
            stream = await engine.add_request("long", [4, 5, 6], SamplingParams(max_tokens=500, ignore_eos=True))
            first = await stream.__aiter__().__anext__()
            assert not first.finished
            engine.abort("long")
            reasons = [o.outputs[0].finish_reason async for o in stream]
            for _ in range(100):
                if engine.snapshot.kv_usage == 0 and engine.num_unfinished == 0:
                    break
                await asyncio.sleep(0.01)
            return reasons[-1], engine.snapshot.kv_usage, engine.num_unfinished
        finally:
            await asyncio.to_thread(engine.shutdown)

    assert asyncio.run(run()) == ("abort", 0.0, 0)


def test_a_refused_request_raises_to_its_caller_and_the_engine_lives(tiny_checkpoint):
    async def run():
        engine = await _started(tiny_checkpoint("llama"))
        try:
            with pytest.raises(RequestError):
                await engine.add_request("bad", [10**6], GREEDY)  # token id outside the vocabulary
            ok = await engine.add_request("good", [5, 6], GREEDY)
            return len(await _collect(ok)), engine.state
        finally:
            await asyncio.to_thread(engine.shutdown)

    assert asyncio.run(run()) == (12, EngineState.READY)


def test_a_cancelled_add_leaves_nothing_behind(tiny_checkpoint):
    async def run():
        engine = await _started(tiny_checkpoint("llama"))
        try:
            busy = await engine.add_request("busy", [4, 5], SamplingParams(max_tokens=200, ignore_eos=True))
            long = SamplingParams(max_tokens=1000, ignore_eos=True)  # a leaked one would still run below
            adds = [asyncio.ensure_future(engine.add_request(f"c{i}", [7, 8, 9], long)) for i in range(8)]
            await asyncio.sleep(0)
            for task in adds:
                task.cancel()
            await asyncio.gather(*adds, return_exceptions=True)
            engine.abort("busy")
            await _collect(busy)
            for _ in range(50):
                if engine.num_unfinished == 0 and engine.snapshot.num_running + engine.snapshot.num_waiting == 0:
                    break
                await asyncio.sleep(0.01)
            return engine.state, engine.num_unfinished, engine.snapshot.num_running, engine.snapshot.num_waiting
        finally:
            await asyncio.to_thread(engine.shutdown)

    assert asyncio.run(run()) == (EngineState.READY, 0, 0, 0)


def test_a_failed_step_fails_every_stream_and_marks_the_engine_dead(tiny_checkpoint):
    async def run():
        engine = await _started(tiny_checkpoint("llama"))
        try:
            stream = await engine.add_request("a", [4, 5, 6], SamplingParams(max_tokens=300, ignore_eos=True))
            await stream.__aiter__().__anext__()

            def broken(_):  # a device fault in the middle of serving
                raise RuntimeError("simulated device fault")

            engine.engine.executor.execute_async = broken  # what the engine's step calls
            with pytest.raises(EngineDeadError, match="simulated device fault"):
                async for _ in stream:
                    pass
            with pytest.raises(EngineDeadError):
                await engine.add_request("b", [4], GREEDY)
            return engine.state, engine.is_healthy
        finally:
            await asyncio.to_thread(engine.shutdown)

    assert asyncio.run(run()) == (EngineState.DEAD, False)
