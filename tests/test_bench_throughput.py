"""``infer bench throughput``: the workload bit-exact, the real configs, the floor's arithmetic, and
the command end to end on the CPU (infer, HF continuous batching and the floor, with a profile)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from infer_core.bench.roofline import ModelDims, throughput_floor
from infer_core.bench.workload import WORKLOAD_OUTPUT_TOKENS, offline_workload
from infer_core.cli import main
from infer_core.testing import REAL_CONFIGS, make_tiny_checkpoint

CONFIGS = Path(__file__).resolve().parents[1] / "benchmarks" / "configs"
STEP_RANGES = ("infer.schedule", "infer.prepare_inputs", "infer.forward", "infer.sample", "infer.process_outputs",
               "infer.detokenize")


def test_workload_is_the_nano_vllm_one_bit_exact():
    state = random.getstate()
    workload = offline_workload()
    assert random.getstate() == state  # the caller's global random state is left alone
    assert workload.num_output_tokens == WORKLOAD_OUTPUT_TOKENS == 133_966
    assert len(workload.prompts) == len(workload.output_lens) == 256
    assert len(workload.prompts[0]) == 964
    assert workload.prompts[0][:5] == [6311, 6890, 663, 4242, 8376]
    assert workload.output_lens[:4] == offline_workload(4).output_lens
    # nano-vllm's own recipe, on the module's global generator
    random.seed(0)
    prompts = [[random.randint(0, 10000) for _ in range(random.randint(100, 1024))] for _ in range(256)]
    lengths = [random.randint(100, 1024) for _ in range(256)]
    assert (workload.prompts, workload.output_lens) == (prompts, lengths)


def test_benchmark_configs_are_the_real_configs():
    folders = sorted(p.name for p in CONFIGS.iterdir() if p.is_dir())
    assert folders == sorted(REAL_CONFIGS)
    for name in folders:
        assert json.loads((CONFIGS / name / "config.json").read_text()) == REAL_CONFIGS[name], name
    llama = REAL_CONFIGS["Llama-3.1-8B"]
    assert (llama["hidden_size"], llama["intermediate_size"], llama["num_hidden_layers"]) == (4096, 14336, 32)
    assert llama["rope_scaling"]["rope_type"] == "llama3" and llama["rope_scaling"]["factor"] == 8.0


@pytest.mark.parametrize("name", sorted(REAL_CONFIGS))
def test_floor_counts_the_parameters_transformers_builds(name):
    """Every parameter but the embedding (read one row per token) is read once per decode step; of a mixture of
    experts, only the experts one token routes to (num_experts_per_tok of each layer's)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from infer_core.models.config import model_config_from_dict

    model_config_from_dict(REAL_CONFIGS[name])  # the engine reads it too
    config = AutoConfig.for_model(**{k: v for k, v in REAL_CONFIGS[name].items() if k != "architectures"})
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    total = sum(p.numel() for p in model.parameters())
    embedding = 0 if config.tie_word_embeddings else config.vocab_size * config.hidden_size
    experts = getattr(config, "num_experts", None) or getattr(config, "num_local_experts", None)
    if experts:  # the experts a token does not route to, counted from the modules transformers builds
        expert_params = [p.numel() for name, p in model.named_parameters() if ".experts." in name]
        total -= sum(expert_params) * (experts - config.num_experts_per_tok) // experts
    dims = ModelDims.from_config(REAL_CONFIGS[name], "bfloat16")
    assert dims.step_params == total - embedding
    assert dims.weight_bytes == 2 * dims.step_params
    assert dims.kv_bytes_per_token == 2 * config.num_hidden_layers * config.num_key_value_heads * 128 * 2


def test_throughput_floor_simulates_every_decode_step():
    dims = ModelDims(num_layers=1, hidden_size=4, num_heads=1, num_kv_heads=1, head_dim=4, vocab_size=8,
                     layer_params=100, dtype_bytes=1)
    weights, kv = dims.weight_bytes, dims.kv_bytes_per_token
    assert (weights, kv) == (100 + 4 + 32, 8)
    # Two requests at once: prompts 3 and 5 tokens, 3 and 2 outputs -> 2 decode steps, then 1.
    floor = throughput_floor(dims, [3, 5], [3, 2], max_num_seqs=8, bandwidth=1.0, matmul_rate=1e30)
    assert floor.num_decode_steps == 2
    assert floor.decode_bytes == (weights + kv * (4 + 6)) + (weights + kv * 5)
    assert floor.decode_s == pytest.approx(floor.decode_bytes)
    # One at a time: every decode step reads the weights for one request only.
    serial = throughput_floor(dims, [3, 5], [3, 2], max_num_seqs=1, bandwidth=1.0, matmul_rate=1e30)
    assert serial.num_decode_steps == 3
    assert serial.decode_bytes == 3 * weights + kv * (4 + 5 + 6)
    assert floor.output_tokens == serial.output_tokens == 5
    assert floor.prefill_flops == dims.prefill_flops(3) + dims.prefill_flops(5)


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    # token ids of the workload go up to 10000
    return make_tiny_checkpoint("qwen3", tmp_path_factory.mktemp("tiny-qwen3"), vocab_size=10240)


CPU_ARGS = ["--device", "cpu", "--dtype", "float32", "--max-len", "100", "--max-model-len", "256"]


@pytest.mark.slow
def test_throughput_command_writes_one_record_with_every_system(tiny_folder, tmp_path, capsys):
    code = main(["bench", "throughput", "--model", str(tiny_folder), *CPU_ARGS, "--num-prompts", "3",
                 "--peers", "hf-generate-batch", "floor", "--peer-num-prompts", "2", "--profile", "--profile-steps",
                 "3", "--profile-skip", "2", "--trace", str(tmp_path / "traces"), "--out", str(tmp_path)])
    assert code == 0, capsys.readouterr().out
    [path] = tmp_path.glob("offline-throughput-*.json")
    record = json.loads(path.read_text())
    assert record["benchmark"] == "offline-throughput"
    assert {"device", "date", "commit", "versions", "settings"} <= set(record)
    assert record["settings"]["num_prompts"] == 3 and record["settings"]["model"] == tiny_folder.name
    infer, hf, floor = record["results"]
    expected = offline_workload(3, 100)
    assert infer["system"] == "infer" and infer["attention"] == "torch"
    assert infer["output_tokens"] == expected.num_output_tokens
    assert hf["system"] == "hf-generate-batch" and hf["attention"] == "sdpa"
    assert hf["output_tokens"] == offline_workload(2, 100).num_output_tokens
    assert floor["system"] == "floor" and floor["output_tokens"] == expected.num_output_tokens
    for row in (infer, hf, floor):
        assert row["output_tok_s"] > 0 and row["elapsed_s"] > 0
    assert infer["fraction_of_floor"] == pytest.approx(infer["output_tok_s"] / floor["output_tok_s"], rel=1e-3)
    assert "fraction_of_floor" not in hf  # another number of prompts: not comparable
    breakdown = infer["step_breakdown"]
    assert breakdown["num_steps"] == 3 and set(breakdown["host_ranges"]) == set(STEP_RANGES)
    for name in ("infer.schedule", "infer.process_outputs", "infer.detokenize"):  # the engine's own ranges
        assert breakdown["host_ranges"][name]["count"] == 3
    assert breakdown["gpu_busy_ms_per_step"] is None  # no CUDA here
    assert Path(breakdown["trace"]).is_file()
    out = capsys.readouterr().out
    assert "step breakdown" in out and "infer.forward" in out
    timeline = infer["step_timeline"]  # every step of the timed run, grouped: prefills and decode batch sizes
    assert "prefill" in timeline and any(name.startswith("decode ") for name in timeline)
    decoded = sum(g["tokens"] for name, g in timeline.items() if name.startswith("decode "))
    prefilled = sum(g["tokens"] for name, g in timeline.items() if name == "prefill")
    assert decoded + prefilled == expected.num_prompt_tokens + expected.num_output_tokens - 3  # last tokens: no step
    assert sum(g["seconds"] for g in timeline.values()) == pytest.approx(infer["elapsed_s"], rel=0.05)
    assert "step timeline" in out
    assert 1 <= len(infer["slowest_steps"]) <= 5 and isinstance(infer["compiled_during_run"], list)


@pytest.mark.parametrize("argv, message", [
    (["--num-prompts", "0"], "--num-prompts must be between 1 and 256"),
    (["--workload", "chat", "--num-prompts", "40"], "--num-prompts must be between 1 and 32 for --workload chat"),
    (["--new-tokens", "0"], "--new-tokens must be at least 1"),
    (["--peer-num-prompts", "300"], "--peer-num-prompts must be between 1 and 256"),
    (["--model", "Qwen9-1B"], "known: Qwen3-0.6B, Qwen3-1.7B, Qwen3-8B, Llama-3.1-8B"),
    (["--attention", "trtion"], "Did you mean 'triton'?"),
    (["--attention", "torch", "torch"], "names a backend twice"),
    (["--trace", "/tmp/x"], "--trace needs --profile"),
    (["--dtype", "int3"], "dtype"),
    (["--max-len", "600", "--max-model-len", "1000"], "use at least 1200"),
])
def test_bad_arguments_say_what_to_change(argv, message, capsys):
    assert main(["bench", "throughput", "--device", "cpu", *argv]) == 2
    assert message in capsys.readouterr().err


def test_unknown_peer_is_refused_by_the_parser(capsys):
    with pytest.raises(SystemExit):
        main(["bench", "throughput", "--peers", "sglang"])
    assert "hf-generate-batch" in capsys.readouterr().err


def write_word_tokenizer(folder: Path) -> Path:
    """A word-level tokenizer with a ChatML template in ``folder``: every word of the questions has an id."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from infer_core.bench.chat_workload import QUESTIONS

    specials = ["<unk>", "<|im_start|>", "<|im_end|>", "user", "assistant"]
    words = sorted({w for q in QUESTIONS for w in q.split()})
    vocab = {w: i for i, w in enumerate(specials + words)}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    template = ("{% for m in messages %}<|im_start|> {{ m.role }} {{ m.content }} <|im_end|> {% endfor %}"
                "{% if add_generation_prompt %}<|im_start|> assistant {% endif %}")
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", eos_token="<|im_end|>",
                                        chat_template=template)
    tokenizer.save_pretrained(folder)
    return folder


def test_chat_workload_is_each_question_through_the_chat_template(tmp_path):
    from transformers import AutoTokenizer

    from infer_core.bench.chat_workload import QUESTIONS, chat_workload

    folder = write_word_tokenizer(tmp_path)
    workload = chat_workload(folder, num_prompts=32, new_tokens=7)
    assert len(workload.prompts) == len(QUESTIONS) == 32
    assert workload.output_lens == [7] * 32 and workload.temperature == 0.0
    tokenizer = AutoTokenizer.from_pretrained(folder)
    text = tokenizer.apply_chat_template([{"role": "user", "content": QUESTIONS[3]}], tokenize=False,
                                         add_generation_prompt=True)
    assert tokenizer.decode(workload.prompts[3]) == text.strip()
    assert workload.prompts[3][0] == tokenizer.convert_tokens_to_ids("<|im_start|>")
    assert workload.prompts[3][-1] == tokenizer.convert_tokens_to_ids("assistant")
    assert 0 not in workload.prompts[3]  # no unknown word
    assert chat_workload(folder, num_prompts=2, new_tokens=7).prompts == workload.prompts[:2]
    again = workload.from_json(workload.to_json())
    assert (again.prompts, again.output_lens, again.temperature) == (workload.prompts, [7] * 32, 0.0)


def test_chat_workload_without_a_tokenizer_says_what_to_pass(tiny_folder):
    from infer_core.bench.chat_workload import chat_workload
    from infer_core.bench.config import BenchmarkError

    with pytest.raises(BenchmarkError, match="needs the model.s tokenizer, and .* has none of .* or use --workload nano-vllm"):
        chat_workload(tiny_folder)
    with pytest.raises(BenchmarkError, match="between 1 and 32 for --workload chat"):
        chat_workload(tiny_folder, num_prompts=33)


def test_vllm_peer_where_vllm_does_not_import_is_an_error_row_naming_the_fix(tmp_path):
    """The peer runs under --peer-python; this test environment has no vLLM, so its row says how to get one."""
    import importlib.util
    import sys

    from infer_core.bench.systems import run_system
    from infer_core.bench.workload import OfflineWorkload

    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vLLM imports here")
    spec = {"system": "vllm", "python": sys.executable, "folder": str(tmp_path), "dtype": "float32",
            "num_prompts": 1, "max_model_len": 64, "max_num_seqs": 4, "load_format": "dummy",
            "workload": OfflineWorkload([[1, 2, 3]], [4], 0.0).to_json()}
    row, device = run_system(spec, timeout_s=120)
    assert row["system"] == "vllm" and device is None
    assert "vllm does not import in" in row["error"] and "--peer-python" in row["error"]
    row, _ = run_system({**spec, "python": str(tmp_path / "no-python")}, timeout_s=120)
    assert row["error"].startswith(f"cannot start {tmp_path / 'no-python'}")


@pytest.mark.slow
def test_throughput_command_runs_the_chat_workload_greedy(tiny_folder, tmp_path, capsys):
    import shutil

    folder = tmp_path / "model"
    shutil.copytree(tiny_folder, folder)
    write_word_tokenizer(folder)
    code = main(["bench", "throughput", "--model", str(folder), "--device", "cpu", "--dtype", "float32",
                 "--load-format", "auto", "--workload", "chat", "--num-prompts", "3", "--new-tokens", "5",
                 "--max-model-len", "128", "--out", str(tmp_path)])
    assert code == 0, capsys.readouterr().out
    [path] = tmp_path.glob("offline-throughput-*.json")
    record = json.loads(path.read_text())
    assert record["settings"]["temperature"] == 0.0 and record["settings"]["workload"].startswith("chat:")
    [infer] = record["results"]
    assert infer["output_tokens"] == 15 and infer["num_prompts"] == 3 and infer["output_tok_s"] > 0


def test_peer_python_without_the_vllm_peer_is_refused(capsys):
    assert main(["bench", "throughput", "--device", "cpu", "--peer-python", "/usr/bin/python3"]) == 2
    assert "--peer-python is the interpreter of --peers vllm" in capsys.readouterr().err


def test_compile_watch_names_the_kernels_compiled_after_start(tmp_path, monkeypatch):
    from infer_core.bench.compiles import CompileWatch

    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "_gemv_kernel.json").write_text("{}")
    watch = CompileWatch()
    assert watch.root == tmp_path
    watch.start()
    (tmp_path / "new").mkdir()  # one compile: its metadata, and the group file Triton writes beside it
    (tmp_path / "new" / "_decode_kernel.json").write_text("{}")
    (tmp_path / "new" / "__grp___decode_kernel.json").write_text("{}")
    assert watch.compiled() == ["_decode_kernel"]


def test_model_default_is_the_embedded_models_cached_folder(tmp_path):
    from infer_core.bench.offline_common import resolve_model
    from infer_core.models.gguf_cache import locate_model

    folder, label = resolve_model("default", tmp_path)
    assert folder == str(locate_model(None).path) and label == "SmolLM2-135M-Instruct"
    assert (Path(folder) / "config.json").is_file() and (Path(folder) / "tokenizer.json").is_file()
