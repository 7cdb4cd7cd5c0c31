"""AsyncEngine: the engine-core process the server drives, and its frontend, without HTTP in between."""

from __future__ import annotations

import asyncio
import os
import signal
import textwrap

import pytest

from infer_core import SamplingParams
from infer_core.engine.async_engine import AsyncEngine
from infer_core.engine.engine import Engine
from infer_core.engine.engine_state import EngineState
from infer_core.errors import EngineDeadError, RequestError
from infer_core.settings import load_settings
from infer_core.testing import install_plugin_package

GREEDY = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
SETTINGS = {"device": "cpu", "dtype": "float32", "num_kv_blocks": 64}


async def _started(folder, **extra) -> AsyncEngine:
    engine = AsyncEngine(load_settings(model=str(folder), **{**SETTINGS, **extra}))
    engine.start(asyncio.get_running_loop())
    await asyncio.to_thread(engine.loaded.wait, 240)
    assert engine.state is EngineState.READY, engine.error
    return engine


async def _collect(stream) -> list[int]:
    tokens: list[int] = []
    async for output in stream:
        tokens = output.outputs[0].token_ids
    return tokens


async def _settled(engine: AsyncEngine) -> tuple[int, int, float]:
    """What is left once the core has applied the aborts: (streams, requests in the core, KV usage)."""
    for _ in range(200):
        s = engine.snapshot
        if engine.num_unfinished == 0 and s.num_running + s.num_waiting == 0 and s.kv_usage == 0:
            break
        await asyncio.sleep(0.02)
    s = engine.snapshot
    return engine.num_unfinished, s.num_running + s.num_waiting, s.kv_usage


CUDA_QUERIES = ("is_available", "device_count", "get_device_capability", "init", "current_device")


class CudaQueries:
    """Records every CUDA query made in this process while installed: the frontend's process must make none."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def install(self, patch: pytest.MonkeyPatch) -> None:
        import torch

        for name in CUDA_QUERIES:
            patch.setattr(torch.cuda, name, lambda *args, _name=name, **kwargs: self.calls.append(_name))


@pytest.fixture(scope="module")
def served(tiny_checkpoint):
    """One event loop and one started engine (the tiny llama) for the tests that leave it healthy.

    It is started while every CUDA query of this process is recorded (the core owns the device).
    """
    loop = asyncio.new_event_loop()
    queries = CudaQueries()
    with pytest.MonkeyPatch.context() as patch:
        queries.install(patch)
        engine = loop.run_until_complete(_started(tiny_checkpoint("llama")))
    try:
        yield loop, engine, queries.calls
    finally:
        engine.shutdown()
        loop.close()


def test_concurrent_requests_match_the_offline_engine(served, tiny_checkpoint):
    loop, engine, _ = served
    prompts = [[5, 6, 7], [9, 10, 11, 12, 13], [3] * 20]
    offline = Engine.from_settings(model=str(tiny_checkpoint("llama")), **SETTINGS)
    for i, p in enumerate(prompts):
        offline.add_request(str(i), p, GREEDY)
    done = {}
    while offline.has_unfinished_requests():
        for out in offline.step():
            if out.finished:
                done[out.request_id] = out.outputs[0].token_ids
    offline.shutdown()

    async def run():
        streams = [await engine.add_request(f"r{i}", p, GREEDY) for i, p in enumerate(prompts)]
        return await asyncio.gather(*(_collect(s) for s in streams))

    assert loop.run_until_complete(run()) == [done[str(i)] for i in range(len(prompts))]


def test_n_completions_and_logprobs_cross_the_process_boundary(served):
    loop, engine, _ = served
    params = SamplingParams(temperature=1.0, seed=3, n=3, max_tokens=9, ignore_eos=True, logprobs=2)

    async def run():
        final = None
        async for output in await engine.add_request("n3", [7, 8, 9], params):
            final = output
        return final

    final = loop.run_until_complete(run())
    assert final.finished and [c.index for c in final.outputs] == [0, 1, 2]
    for c in final.outputs:
        assert len(c.token_ids) == 9 and c.finish_reason == "length"
        assert len(c.logprobs) == 9 and all(c.token_ids[i] in c.logprobs[i] for i in range(9))
    assert engine.snapshot.finished.get("length", 0) >= 3


def test_abort_ends_the_stream_and_frees_the_blocks(served):
    loop, engine, _ = served

    async def run():
        stream = await engine.add_request("long", [4, 5, 6], SamplingParams(max_tokens=500, ignore_eos=True))
        first = await stream.__aiter__().__anext__()
        assert not first.finished
        engine.abort("long")
        reasons = [o.outputs[0].finish_reason async for o in stream]
        return reasons[-1], await _settled(engine)

    assert loop.run_until_complete(run()) == ("abort", (0, 0, 0.0))


def test_a_refused_request_raises_to_its_caller_and_the_engine_lives(served):
    loop, engine, _ = served
    max_model_len = engine.config.max_model_len

    async def run():
        with pytest.raises(RequestError, match="token ids must be in"):  # the frontend's check
            await engine.add_request("bad", [10**6], GREEDY)
        with pytest.raises(RequestError, match="max_model_len") as refused:  # the core's admission
            await engine.add_request("long-prompt", [5] * max_model_len, GREEDY)
        assert refused.value.code == "context_length_exceeded"
        ok = await engine.add_request("good", [5, 6], GREEDY)
        return len(await _collect(ok)), engine.state, engine.num_pending_adds

    assert loop.run_until_complete(run()) == (12, EngineState.READY, 0)


def test_a_cancelled_add_leaves_nothing_behind(served):
    loop, engine, _ = served

    async def run():
        busy = await engine.add_request("busy", [4, 5], SamplingParams(max_tokens=200, ignore_eos=True))
        long = SamplingParams(max_tokens=1000, ignore_eos=True)  # a leaked one would still run below
        adds = [asyncio.ensure_future(engine.add_request(f"c{i}", [7, 8, 9], long)) for i in range(8)]
        await asyncio.sleep(0)
        for task in adds:
            task.cancel()
        await asyncio.gather(*adds, return_exceptions=True)
        engine.abort("busy")
        await _collect(busy)
        return engine.state, await _settled(engine)

    assert loop.run_until_complete(run()) == (EngineState.READY, (0, 0, 0.0))


def test_a_killed_core_ends_every_stream_with_an_error(tiny_checkpoint):
    async def run():
        engine = await _started(tiny_checkpoint("llama"))
        try:
            streams = [await engine.add_request(f"k{i}", [4, 5, 6], SamplingParams(max_tokens=5000, ignore_eos=True))
                       for i in range(3)]
            await streams[0].__aiter__().__anext__()
            os.kill(engine.core_pid, signal.SIGKILL)  # out of memory, a device fault that takes the process
            for stream in streams:
                with pytest.raises(EngineDeadError, match="exited with code -9"):
                    async for _ in stream:
                        pass
            with pytest.raises(EngineDeadError):
                await engine.add_request("after", [4], GREEDY)
            return engine.state, engine.is_healthy, engine.load_failed  # it had loaded: a server goes on
        finally:
            await asyncio.to_thread(engine.shutdown)

    assert asyncio.run(asyncio.wait_for(run(), 300)) == (EngineState.DEAD, False, False)


FAULTY_DECODING = textwrap.dedent('''
    from infer_core.builtin.decoding_standard import StandardDecoding

    class FaultyDecoding(StandardDecoding):
        """Standard decoding until its fifth step, which fails as a lost device would."""
        steps = 0

        def accept(self, scheduler_output, runner_output):
            FaultyDecoding.steps += 1
            if FaultyDecoding.steps == 5:
                raise RuntimeError("simulated device fault")
            return super().accept(scheduler_output, runner_output)
''')

FAULTY_PLUGIN = textwrap.dedent('''
    from infer_core.hookspecs import hookimpl

    @hookimpl
    def register_decoding_policies(register):
        register("faulty", "infer_faulty_plugin.decoding:FaultyDecoding")
''')


def test_a_failed_step_in_the_core_fails_every_stream_and_marks_the_engine_dead(tiny_checkpoint, tmp_path,
                                                                                monkeypatch):
    root = install_plugin_package(tmp_path / "site", "infer-faulty-plugin", "faulty", "infer_faulty_plugin",
                                  {"plugin.py": FAULTY_PLUGIN, "decoding.py": FAULTY_DECODING})
    monkeypatch.syspath_prepend(str(root))  # the spawned core starts with this process's sys.path

    async def run():
        engine = await _started(tiny_checkpoint("llama"), decoding="faulty")
        try:
            stream = await engine.add_request("a", [4, 5, 6], SamplingParams(max_tokens=300, ignore_eos=True))
            with pytest.raises(EngineDeadError, match="simulated device fault"):
                async for _ in stream:
                    pass
            with pytest.raises(EngineDeadError, match="simulated device fault"):
                await engine.add_request("b", [4], GREEDY)
            return engine.state, engine.is_healthy, engine.load_failed  # it had loaded: a server goes on
        finally:
            await asyncio.to_thread(engine.shutdown)

    assert asyncio.run(asyncio.wait_for(run(), 300)) == (EngineState.DEAD, False, False)


def test_the_frontend_process_never_asks_cuda(served, monkeypatch):
    """The core owns the device: the server's process asks CUDA nothing, neither while the model loads
    (the module's engine was started with every query recorded) nor while it streams."""
    loop, engine, calls_while_starting = served
    queries = CudaQueries()
    queries.install(monkeypatch)
    tokens = loop.run_until_complete(_collect(loop.run_until_complete(engine.add_request("x", [3, 4], GREEDY))))
    assert (calls_while_starting, queries.calls, len(tokens)) == ([], [], 12)
