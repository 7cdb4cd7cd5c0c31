"""Test helpers every suite may use (the core's and the plugins'): tiny real checkpoints, recorded logits.

``make_tiny_checkpoint`` writes a random model of a supported architecture as a real HF
checkpoint (config.json + safetensors + a small tokenizer-free folder), so tests exercise the
same loading path as a downloaded model and can compare with transformers (testing_tokenizer.py adds a
small real tokenizer beside one). Kernels compiled for sm_90 without a GPU: ``testing_sm90.py``.
"""

from __future__ import annotations

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


def default_model_tokenizer():
    """The embedded default model's tokenizer, as an engine on that model loads it: from the
    model's dequantized cache (written on first use), so a test does not rebuild it from the GGUF."""
    from infer_core.models.gguf_cache import locate_model
    from infer_core.models.tokenizer import load_tokenizer

    return load_tokenizer(locate_model(None))
