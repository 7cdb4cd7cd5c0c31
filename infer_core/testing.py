"""Test helpers every suite may use (the core's and the plugins'): tiny real checkpoints, kernels compiled for sm_90.

``make_tiny_checkpoint`` writes a random model of a supported architecture as a real HF
checkpoint (config.json + safetensors + a small tokenizer-free folder), so tests exercise the
same loading path as a downloaded model and can compare with transformers (testing_tokenizer.py adds a
small real tokenizer beside one). ``compile_for_sm90``
compiles a Triton kernel for an H100 without a GPU (Triton's own ptxas), and ``float_ops`` lists
its PTX's float instructions, so tests can check what two kernels compute alike.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from infer_core.interfaces import PendingOutput
from infer_core.real_configs import REAL_CONFIGS, write_config_checkpoint  # noqa: F401  (re-exported)

# Shapes small enough for the CPU, with GQA (4 query heads per KV head pair) and 2 layers.
_BASE: dict[str, Any] = dict(
    vocab_size=384, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, max_position_embeddings=1024, rms_norm_eps=1e-6, initializer_range=0.08,
    bos_token_id=1, eos_token_id=2, pad_token_id=0,
)

TINY_ARCHITECTURES: dict[str, dict[str, Any]] = {
    # Llama 3.x: llama3 rope scaling, untied embeddings
    "llama": dict(model_type="llama", tie_word_embeddings=False, rope_theta=500000.0,
                  rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                    original_max_position_embeddings=128)),
    # Mistral: head_dim from hidden/heads, untied
    "mistral": dict(model_type="mistral", tie_word_embeddings=False, sliding_window=None, rope_theta=10000.0),
    # Qwen2: q/k/v biases, untied embeddings
    "qwen2": dict(model_type="qwen2", tie_word_embeddings=False, rope_theta=10000.0, use_sliding_window=False),
    # Qwen3: q/k RMSNorm, explicit head_dim, tied embeddings
    "qwen3": dict(model_type="qwen3", tie_word_embeddings=True, head_dim=32, rope_theta=1000000.0,
                  use_sliding_window=False),
    # Mixtral: 8 experts of intermediate_size, top-2, weights renormalised
    "mixtral": dict(model_type="mixtral", tie_word_embeddings=False, sliding_window=None, rope_theta=1000000.0,
                    intermediate_size=64, num_local_experts=8, num_experts_per_tok=2),
    # Qwen2-MoE: q/k/v biases, softmax weights not renormalised, a shared expert with its sigmoid gate, and a
    # dense MLP of intermediate_size in the second layer (mlp_only_layers)
    "qwen2_moe": dict(model_type="qwen2_moe", tie_word_embeddings=False, rope_theta=1000000.0, use_sliding_window=False,
                      num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
                      shared_expert_intermediate_size=96, norm_topk_prob=False, mlp_only_layers=[1]),
    # Qwen3-MoE: q/k RMSNorm, explicit head_dim, top-4 of 16 experts, weights renormalised (norm_topk_prob)
    "qwen3_moe": dict(model_type="qwen3_moe", tie_word_embeddings=False, head_dim=32, rope_theta=1000000.0,
                      use_sliding_window=False, num_experts=16, num_experts_per_tok=4, moe_intermediate_size=32,
                      norm_topk_prob=True),
}
# The mixtures of experts among them
TINY_MOE_ARCHITECTURES = ("mixtral", "qwen2_moe", "qwen3_moe")


def make_tiny_checkpoint(kind: str, folder: str | Path, seed: int = 0, **overrides: Any) -> Path:
    """Write a random ``kind`` model (a key of ``TINY_ARCHITECTURES``: "llama", "mistral", "qwen2", "qwen3", and the
    mixtures of experts "mixtral", "qwen2_moe", "qwen3_moe") to ``folder``."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    if kind not in TINY_ARCHITECTURES:
        raise ValueError(f"unknown tiny architecture {kind!r}; choose from {', '.join(TINY_ARCHITECTURES)}")
    values = {**_BASE, **TINY_ARCHITECTURES[kind], **overrides}
    model_type = values.pop("model_type")
    config = AutoConfig.for_model(model_type, **values)
    with torch.random.fork_rng(devices=[]):  # the caller's global RNG state is left as it was
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        with torch.no_grad():  # non-trivial norm weights and biases, so a wrong mapping cannot hide
            for name, param in model.named_parameters():
                if name.endswith("norm.weight") or name.endswith(".bias"):
                    param.add_(torch.randn_like(param) * 0.1)
    folder = Path(folder)
    model.save_pretrained(folder, safe_serialization=True)
    return folder


class TinyCheckpoints:
    """A test session's tiny checkpoints: ``tiny_checkpoint("qwen3", num_key_value_heads=1)`` -> the folder of
    that random model, written once per kind and overrides (the suites' ``tiny_checkpoint`` fixture)."""

    def __init__(self, tmp_path_factory: Any) -> None:
        self.tmp_path_factory = tmp_path_factory
        self.folders: dict[tuple, Path] = {}

    def __call__(self, kind: str, **overrides: Any) -> Path:
        key = (kind, tuple(sorted(overrides.items())))
        if key not in self.folders:
            self.folders[key] = make_tiny_checkpoint(kind, self.tmp_path_factory.mktemp(f"tiny-{kind}"), **overrides)
        return self.folders[key]


def skip_gpu_tests_without_cuda(items: list) -> None:
    """Mark the collected tests marked ``gpu`` skipped where torch sees no CUDA device (a suite's conftest)."""
    import pytest
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def write_word_tokenizer(folder: str | Path, vocab_size: int = 384) -> Path:
    """A tokenizer of ``vocab_size`` words ``w0 w1 ...`` in ``folder`` (beside a tiny checkpoint, so every
    token it generates has text): id N is the word ``wN``; text is split on whitespace, an unknown word is
    ``w0``. It has no end token and no chat template."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.WordLevel({f"w{i}": i for i in range(vocab_size)}, unk_token="w0"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=backend).save_pretrained(str(folder))
    return Path(folder)


class _RecordedOutput(PendingOutput):
    """A step's pending output that hands its logits to a LogitsRecorder when first read."""

    def __init__(self, pending: PendingOutput, logits: dict[str, list]) -> None:
        self.pending, self.logits, self.seen = pending, logits, False

    def result(self):
        output = self.pending.result()
        if not self.seen:
            self.seen = True
            for request_id, rows in zip(output.request_ids, output.logits or []):
                if rows is not None:
                    self.logits.setdefault(request_id, []).extend(rows)
        return output


class LogitsRecorder:
    """Collects, per request id, the logits of every sampled position while an engine runs.

    Turns on the workers' ``return_logits`` and observes each step's RunnerOutput; the engine
    itself runs unchanged. Use as a context manager around ``generate``.
    """

    def __init__(self, engine) -> None:
        self.engine = engine
        self.logits: dict[str, list] = {}
        self._execute = None

    def __enter__(self) -> LogitsRecorder:
        executor = self.engine.executor
        executor.collective_rpc("set_return_logits", True)
        self._execute = launch = executor.execute_async
        executor.execute_async = lambda scheduler_output: _RecordedOutput(launch(scheduler_output), self.logits)
        return self

    def __exit__(self, *exc) -> None:
        executor = self.engine.executor
        # the class's method again; not the bound method stored on the instance, a reference cycle that
        # would keep the executor (and a tensor-parallel engine's workers) alive past ``del llm``
        del executor.execute_async
        if executor.execute_async != self._execute:  # it was an attribute of the instance before
            executor.execute_async = self._execute
        self._execute = None
        executor.collective_rpc("set_return_logits", False)


def install_plugin_package(root: str | Path, distribution: str, entry_point: str, package: str,
                           files: dict[str, str], version: str = "0.1.0") -> Path:
    """Write an installed plugin distribution into ``root``: a package and its ``.dist-info``.

    ``files`` maps module file names to their source; the entry point names ``package.plugin``.
    Put ``root`` on ``sys.path`` (or PYTHONPATH) and importlib.metadata finds it like a
    pip-installed one.
    """
    root = Path(root)
    folder = root / package
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "__init__.py").write_text("")
    for name, source in files.items():
        (folder / name).write_text(source)
    dist = root / f"{distribution.replace('-', '_')}-{version}.dist-info"
    dist.mkdir(exist_ok=True)
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {distribution}\nVersion: {version}\n")
    (dist / "entry_points.txt").write_text(f"[infer_core.plugins]\n{entry_point} = {package}.plugin\n")
    return root


class CannotCompile(Exception):
    """No NVIDIA backend or ptxas in this Triton install."""


def print_compiled(collect) -> None:
    """A compile script's ``__main__``: print ``collect()`` as JSON, or the reason and exit 3 where nothing compiles."""
    import json
    import sys

    try:
        print(json.dumps(collect()))
    except CannotCompile as exc:
        print(exc)
        sys.exit(3)


def compiled_in_a_process(script: str | Path) -> Any:
    """Run ``script`` (whose ``__main__`` is :func:`print_compiled`) in a fresh interpreter without Triton's interpreter,
    and return what it printed; the calling test is skipped where this Triton cannot compile for sm_90."""
    import json
    import os
    import subprocess
    import sys

    import pytest

    env = {name: value for name, value in os.environ.items() if name != "TRITON_INTERPRET"}
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # the runtime's default: set to quiet its warning
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=600, env=env)
    if done.returncode == 3:
        pytest.skip(f"cannot compile for sm_90 here: {done.stdout.strip()}")
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout)


def compile_for_sm90(fn, args: dict, constexprs: dict, num_warps: int, num_stages: int) -> dict:
    """``fn``'s code (``asm``: ttgir, ptx, ...) specialised as the JIT would for these arguments (aligned tensors).

    Run it in a process without ``TRITON_INTERPRET`` (the kernel must be compiled, not interpreted).
    """
    import torch
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    signature, constants, attrs = {}, dict(constexprs), {}
    for i, name in enumerate(fn.arg_names):
        if name in constexprs:
            signature[name] = "constexpr"
        elif isinstance(args[name], torch.Tensor):
            signature[name] = {torch.bfloat16: "*bf16", torch.float32: "*fp32", torch.int32: "*i32",
                               torch.int64: "*i64"}[args[name].dtype]
            attrs[(i,)] = [["tt.divisibility", 16]]
        elif isinstance(args[name], float):
            signature[name] = "fp32"
        elif name != "num_rows" and args[name] == 1:  # the JIT turns ints equal to 1 into constants
            signature[name], constants[name] = "constexpr", 1
        else:
            signature[name] = "i32"
            if name != "num_rows" and args[name] % 16 == 0:  # num_rows: do_not_specialize
                attrs[(i,)] = [["tt.divisibility", 16]]
    try:
        compiled = triton.compile(ASTSource(fn, signature, constants, attrs), target=GPUTarget("cuda", 90, 32),
                                  options={"num_warps": num_warps, "num_stages": num_stages, "launch_pdl": True})
    except Exception as exc:
        raise CannotCompile(f"{type(exc).__name__}: {exc}") from exc
    return compiled.asm


def target_sm90() -> None:
    """Make Triton's active driver one that only names an H100's target (sm_90, 32-lane warps): a launch with
    ``warmup=True`` then compiles for it on a machine without a GPU (CPU tensors as arguments), and runs nothing."""
    from triton.backends.compiler import GPUTarget
    from triton.runtime import driver

    class Sm90Target:
        def get_current_device(self):
            return 0

        def get_current_stream(self, device):
            return 0

        def get_current_target(self):
            return GPUTarget("cuda", 90, 32)

    driver.set_active(Sm90Target())


def cubin_resource_usage(cubin: bytes) -> dict[str, int]:
    """A compiled kernel's registers, stack, local (spilled) and shared bytes, read by the cuobjdump in Triton's
    wheel: ``{"REG": ..., "STACK": ..., "LOCAL": ..., "SHARED": ...}``."""
    import subprocess
    import tempfile

    from triton import knobs

    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        text = subprocess.run(
            [knobs.nvidia.cuobjdump.path, "--dump-resource-usage", f.name], capture_output=True, text=True, check=True
        ).stdout
    return {k: int(v) for k, v in re.findall(r"\b(REG|STACK|LOCAL|SHARED):(\d+)", text)}


# a float instruction of the PTX (arithmetic, conversions, shuffles of the reductions), its registers renamed below
FLOAT_OP = re.compile(r"^(?:@!?%p\d+\s+)?((?:fma|mul|add|sub|div|rsqrt|ex2|max|min|neg|abs)\.\S*f32"
                      r"|cvt\.\S*(?:f32|bf16|f16)\S*|shfl\.\S+|selp\.f32)\s+([^;]*);")


def float_ops(ptx: str) -> list[str]:
    """The PTX's float instructions in order, registers renamed by first appearance (two compiles of one
    computation give the same list, whatever their register numbers)."""
    names, found = {}, []
    for line in ptx.splitlines():
        m = FLOAT_OP.match(line.strip())
        if m:
            operands = re.sub(r"%[a-z]+\d+", lambda r: names.setdefault(r.group(0), f"v{len(names)}"), m.group(2))
            found.append(f"{m.group(1)} {operands}")
    return found


def default_model_tokenizer():
    """The embedded default model's tokenizer, as an engine on that model loads it: from the
    model's dequantized cache (written on first use), so a test does not rebuild it from the GGUF."""
    from infer_core.models.gguf_cache import locate_model
    from infer_core.models.tokenizer import load_tokenizer

    return load_tokenizer(locate_model(None))
