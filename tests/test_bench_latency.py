"""``infer bench latency``: the bandwidth floor's arithmetic, and the command end to end on the CPU
(infer, HF ``generate`` with a static cache, and the floor, with a profile of the decode steps)."""

from __future__ import annotations

import json

import pytest

from infer_core.bench.roofline import ModelDims, latency_floor
from infer_core.bench.step_profile import profile_steps
from infer_core.cli import main
from infer_core.testing import REAL_CONFIGS, make_tiny_checkpoint

FIGURES = {"output_tok_s", "ms_per_token", "decode_tok_s", "ttft_ms"}


def test_latency_floor_reads_weights_and_the_growing_context_per_token():
    dims = ModelDims.from_config(REAL_CONFIGS["Qwen3-8B"], "bfloat16")
    bandwidth = 3e12
    floor = latency_floor(dims, prompt_len=128, new_tokens=256, bandwidth=bandwidth, matmul_rate=1e15)
    assert floor.num_decode_steps == 255
    contexts = sum(128 + k for k in range(1, 256))
    assert floor.decode_bytes == 255 * dims.weight_bytes + dims.kv_bytes_per_token * contexts
    assert floor.decode_s == pytest.approx(floor.decode_bytes / bandwidth)
    # Qwen3-8B: 8.19 B parameters less the 0.62 B embedding; 15.1 GB of bf16 weights per token
    assert dims.weight_bytes == pytest.approx(15.14e9, rel=1e-3)


def test_profile_window_counts_only_its_own_steps():
    from torch.profiler import record_function

    calls = []

    def step():
        with record_function("infer.schedule"):
            calls.append(1)
        with record_function("infer.forward"):
            sum(range(20000))

    breakdown = profile_steps(step, 4)
    assert len(calls) == 4 and breakdown["num_steps"] == 4
    assert breakdown["host_ranges"]["infer.schedule"]["count"] == 4
    assert breakdown["host_ranges"]["infer.forward"]["ms_per_step"] > 0
    assert breakdown["missing_ranges"] == ["infer.prepare_inputs", "infer.sample", "infer.process_outputs",
                                          "infer.detokenize"]
    named = sum(r["ms_per_step"] for r in breakdown["host_ranges"].values())
    assert named + breakdown["host_other_ms_per_step"] == pytest.approx(breakdown["wall_ms_per_step"], abs=1e-3)


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    return make_tiny_checkpoint("llama", tmp_path_factory.mktemp("tiny-llama"))


@pytest.mark.slow
def test_latency_command_writes_one_record_with_every_system(tiny_folder, tmp_path, capsys):
    code = main(["bench", "latency", "--model", str(tiny_folder), "--device", "cpu", "--dtype", "float32",
                 "--prompt-len", "16", "--new-tokens", "32", "--repeats", "2", "--attention", "torch",
                 "--peers", "hf-generate-static", "floor", "--profile", "--profile-steps", "3", "--profile-skip", "1",
                 "--out", str(tmp_path)])
    assert code == 0, capsys.readouterr().out
    [path] = tmp_path.glob("decode-latency-*.json")
    assert path.name.startswith(f"decode-latency-{tiny_folder.name}-")  # not the default model: named in the file
    record = json.loads(path.read_text())
    assert record["benchmark"] == "decode-latency"
    assert record["settings"]["prompt_len"] == 16 and record["settings"]["new_tokens"] == 32
    assert record["settings"]["max_model_len"] == 1024  # the tiny model's limit, under the 4096 default
    infer, hf, floor = record["results"]
    assert (infer["system"], hf["system"], floor["system"]) == ("infer", "hf-generate-static", "floor")
    for row in (infer, hf, floor):
        assert FIGURES <= set(row), row["system"]
        assert row["output_tok_s"] > 0 and row["ms_per_token"] > 0
    assert infer["repeats"] == hf["repeats"] == 2 and len(infer["ms_per_token_runs"]) == 2
    assert hf["compiled"] is False  # no compile on the CPU
    assert infer["fraction_of_floor"] == pytest.approx(floor["ms_per_token"] / infer["ms_per_token"], rel=1e-3)
    breakdown = infer["step_breakdown"]
    assert breakdown["host_ranges"]["infer.schedule"]["count"] == 3
    assert "step breakdown, infer attention=torch" in capsys.readouterr().out


@pytest.mark.slow
def test_a_failing_system_is_an_error_row_and_the_others_still_run(tiny_folder, tmp_path, capsys, monkeypatch):
    """triton cannot run on a CPU: its row says why, the floor row is still measured, the exit code is 1."""
    # Suites collected in the same process (tests/fused, the triton plugin's) turn the Triton
    # interpreter on process-wide, under which triton *can* run on the CPU.
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    code = main(["bench", "latency", "--model", str(tiny_folder), "--device", "cpu", "--dtype", "float32",
                 "--prompt-len", "8", "--new-tokens", "4", "--repeats", "1", "--attention", "triton",
                 "--peers", "floor", "--out", str(tmp_path)])
    assert code == 1
    [path] = tmp_path.glob("decode-latency-*.json")
    failed, floor = json.loads(path.read_text())["results"]
    assert failed["system"] == "infer" and failed["attention"] == "triton"
    assert "cannot run here" in failed["error"]
    assert floor["system"] == "floor" and floor["ms_per_token"] > 0
    assert "error: infer triton" in capsys.readouterr().out


@pytest.mark.parametrize("argv, message", [
    (["--new-tokens", "1"], "--new-tokens must be at least 2"),
    (["--repeats", "0"], "--repeats must be at least 1"),
    (["--prompt-len", "0"], "--prompt-len must be at least 1"),
    (["--prompt-len", "4000", "--max-model-len", "4096"], "exceed --max-model-len 4096"),
    (["--profile-steps", "0"], "--profile-steps must be at least 1"),
    (["--timeout", "0"], "--timeout must be positive"),
])
def test_bad_arguments_say_what_to_change(argv, message, capsys):
    assert main(["bench", "latency", "--device", "cpu", *argv]) == 2
    assert message in capsys.readouterr().err


def test_throughput_peer_is_not_a_latency_peer(capsys):
    with pytest.raises(SystemExit):
        main(["bench", "latency", "--peers", "hf-generate-batch"])
    assert "hf-generate-static" in capsys.readouterr().err


def test_gpu_busy_is_the_union_of_device_activity_inside_the_window():
    """Overlapping kernels count once, work outside the window is clipped, GPU-side ranges are no work."""
    from infer_core.bench.step_profile import summarize_trace

    events = [
        {"cat": "user_annotation", "name": "infer.bench.window", "ts": 1000.0, "dur": 100.0},
        {"cat": "user_annotation", "name": "infer.forward", "ts": 1001.0, "dur": 30.0},
        {"cat": "user_annotation", "name": "infer.forward", "ts": 1051.0, "dur": 30.0},
        {"cat": "kernel", "name": "gemm", "ts": 1010.0, "dur": 20.0},
        {"cat": "kernel", "name": "rmsnorm", "ts": 1025.0, "dur": 10.0},  # overlaps gemm by 5
        {"cat": "gpu_memcpy", "name": "DtoH", "ts": 1095.0, "dur": 10.0},  # half outside the window
        {"cat": "gpu_user_annotation", "name": "infer.forward", "ts": 1000.0, "dur": 100.0},
        {"cat": "kernel", "name": "before", "ts": 900.0, "dur": 50.0},
    ]
    breakdown = summarize_trace(events, num_steps=2)
    assert breakdown["wall_ms_per_step"] == pytest.approx(0.05)
    assert breakdown["host_ranges"]["infer.forward"] == {"count": 2, "ms_per_step": 0.03}
    assert breakdown["gpu_busy_ms_per_step"] == pytest.approx((25 + 5) / 2e3)
    # the window opens drained: the 10 us before the first kernel are the lead-in, not idle time
    assert breakdown["gpu_lead_in_ms"] == pytest.approx(0.010)
    assert breakdown["gpu_idle_ms_per_step"] == pytest.approx((90 - 30) / 2e3)
    assert breakdown["gpu_busy_fraction"] == pytest.approx(30 / 90, abs=1e-4)  # rounded to 4 places
    assert breakdown["top_kernels"] == [  # GPU time per step, clipped to the window, most first
        {"name": "gemm", "calls_per_step": 0.5, "us_per_step": 10.0},
        {"name": "rmsnorm", "calls_per_step": 0.5, "us_per_step": 5.0},
        {"name": "DtoH", "calls_per_step": 0.5, "us_per_step": 2.5},
    ]


def test_summarize_trace_splits_idle_into_kernel_gaps_and_host_waits():
    from infer_core.bench.step_profile import summarize_trace

    events = [
        {"cat": "user_annotation", "name": "infer.bench.window", "ts": 0.0, "dur": 200.0},
        {"cat": "kernel", "name": "a", "ts": 30.0, "dur": 20.0},  # 30 us after the window opens: the lead-in
        {"cat": "kernel", "name": "b", "ts": 53.0, "dur": 20.0},  # 3 us after a: short
        {"cat": "kernel", "name": "c", "ts": 145.0, "dur": 50.0},  # 72 us after b: the host was late
    ]  # and 5 us idle before the window closes: short
    breakdown = summarize_trace(events, num_steps=1)
    assert breakdown["gpu_lead_in_ms"] == pytest.approx(0.030)
    assert breakdown["gpu_idle_ms_per_step"] == pytest.approx(0.080)
    assert breakdown["gpu_idle_short_gaps_ms_per_step"] == pytest.approx(0.008)
    assert breakdown["gpu_idle_long_gaps_ms_per_step"] == pytest.approx(0.072)
