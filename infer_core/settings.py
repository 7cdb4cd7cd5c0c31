"""EngineSettings: every knob of the engine and server, from arguments, INFER_* variables or .env.

Precedence: explicit arguments (CLI flags, ``LLM(...)`` keywords) > environment > ``.env`` >
defaults. A misspelled ``INFER_*`` variable is an error, not silently ignored.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, ValidationError, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from infer_core.errors import SettingsError

ENV_PREFIX = "INFER_"
_DTYPE_ALIASES = {"bf16": "bfloat16", "fp16": "float16", "half": "float16", "fp32": "float32", "float": "float32"}


class EngineSettings(BaseSettings):
    """The engine's configuration. Field names are the setting names (``INFER_<NAME>`` in env)."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        env_nested_delimiter="__",
        env_file=".env",
        extra="ignore",  # unknown names are rejected with a suggestion by check_names()
        validate_default=True,
        protected_namespaces=(),
    )

    # what to run
    model: str | None = Field(None, description="model folder, HF-style checkpoint or .gguf file; unset = embedded SmolLM2")
    tokenizer: str | None = Field(None, description="tokenizer folder when it differs from the model's")
    chat_template: str | None = Field(None, description="Jinja chat template (text or file) overriding the model's")
    load_format: Literal["auto", "safetensors", "gguf", "dummy"] = Field("auto", description="how weights are read")
    dtype: Literal["auto", "bfloat16", "float16", "float32"] = Field("auto", description="activation and weight dtype")
    device: Literal["auto", "cuda", "cpu"] = Field("auto", description="where the model runs")
    seed: int = Field(0, description="seed of unseeded sampling and dummy weights")

    # which implementation of each extension point
    attention: str | None = Field(None, description="attention backend; unset = best that can run here")
    kv_allocator: str = Field("paged", description="KV block allocator")
    scheduler: str = Field("fcfs", description="request scheduler")
    quantization: str | None = Field(None, description="quantizer; unset = the checkpoint's, else none")
    parallel: str | None = Field(None, description="parallel strategy; unset = single, or tp when tensor_parallel_size > 1")
    decoding: str = Field("standard", description="decoding policy")
    plugins: Annotated[list[str] | None, NoDecode] = Field(
        None, description="comma-separated entry-point names to load (unset = all installed; empty = none)"
    )

    # memory and batching
    block_size: int | None = Field(None, ge=1, description="tokens per KV block; unset = the attention backend's default")
    gpu_memory_utilization: float = Field(0.9, gt=0, le=1, description="share of GPU memory the engine may use")
    num_kv_blocks: int | None = Field(None, ge=1, description="KV blocks to allocate, overriding sizing")
    kv_cache_gb: float | None = Field(None, gt=0, description="GiB for the KV cache (default: profiled on CUDA, 2 on CPU)")
    max_model_len: int | None = Field(None, ge=1, description="context length limit; unset = the model's")
    max_num_seqs: int = Field(256, ge=1, description="most requests in one step")
    max_num_batched_tokens: int = Field(8192, ge=1, description="most tokens in one step (prefill chunk budget)")
    enable_prefix_caching: bool = Field(True, description="reuse KV blocks of shared prompt prefixes")
    enforce_eager: bool = Field(False, description="never capture CUDA graphs: every decode step runs eagerly")
    prefill_graph_max_tokens: int = Field(512, ge=0, description="a step of one request's prompt chunk of up to this many tokens replays a CUDA graph (sizes 16, 32, ... up to it) where the attention backend supports it; 0 = such steps run eagerly")
    async_scheduling: bool = Field(True, description="plan step N+1 while step N runs on the device (built-in scheduler, one rank or tensor parallelism, no speculative decoding); off = each step waits for the previous one's tokens")
    pdl: bool = Field(True, description="launch the decode-path Triton kernels with programmatic dependent launch (Hopper and newer GPUs): each starts while the one before it drains")
    tensor_parallel_size: int = Field(1, ge=1, description="GPUs the model is split over")
    enable_symm_mem_all_reduce: bool = Field(False, description="tensor parallelism on CUDA: all-reduce small messages (decode steps) with one kernel over symmetric memory (peer loads over NVLink, no multicast) instead of NCCL; off (the default until it is measured on two GPUs) = NCCL for every all-reduce")
    pushed_partial_sums_mode: Literal["gemv", "sum", "fused", "all_reduce"] = Field("gemv", description="with enable_pushed_partial_sums, who adds the pushed values: gemv = the pushing GEMV's own last programs, no launch of its own (on two H200s, Qwen3-8B batch-1 decode 2.78 ms a step, tp2-gemv-mode-experiment log); sum = a small kernel after the pushing GEMV (2.82 ms in the same run; 3.14 at tree 19d16b0); fused = the next norm + GEMV in its prologue (3.68-3.70 ms, earlier trees); all_reduce = the GEMV stores as usual and one small kernel pushes its output to every rank and adds every rank's (3.27 ms at 19d16b0, where the one-shot all-reduce took 3.50)")
    enable_pushed_partial_sums: bool = Field(False, description="with enable_symm_mem_all_reduce, at decode sizes (the GEMV's 1-2 rows): each row-parallel layer's GEMV pushes its partial sums into every rank's memory and pushed_partial_sums_mode's kernel adds them, instead of an all-reduce launch (and the vocabulary-parallel embedding looks up and all-reduces in one launch, and the LM head pushes its logits for the all-gather: no NCCL launch in a batch-1 decode graph); on two H200s (tree 19d16b0) Qwen3-8B batch-1 decode took 3.14 ms a step this way (mode sum) against 3.50 with the one-shot all-reduce; off by default, like enable_symm_mem_all_reduce")

    # server
    host: str = Field("127.0.0.1", description="address the server binds (for the HTTP server)")
    port: int = Field(8000, ge=0, le=65535, description="port the server binds (for the HTTP server)")
    served_model_name: str | None = Field(None, description="model name clients use (for the HTTP server; default: the model's)")
    max_queued_requests: int = Field(1024, ge=1, description="waiting requests beyond which the server answers 503 (for the HTTP server)")
    api_key: str | None = Field(None, description="when set, /v1 requests need 'Authorization: Bearer <key>' (for the HTTP server)")
    max_request_bytes: int = Field(16 * 1024 * 1024, ge=1, description="largest request body the server reads; larger gets 413 (for the HTTP server)")
    shutdown_timeout: float = Field(30.0, ge=0, description="seconds SIGTERM waits for running requests before aborting them (for the HTTP server)")

    @field_validator("dtype", mode="before")
    @classmethod
    def _dtype_alias(cls, value: Any) -> Any:
        if isinstance(value, str):
            value = value.lower().removeprefix("torch.")
            return _DTYPE_ALIASES.get(value, value)
        return value

    @field_validator("plugins", mode="before")
    @classmethod
    def _split_plugins(cls, value: Any) -> Any:
        if isinstance(value, str):
            return [p.strip() for p in value.split(",") if p.strip()]
        return value

    @field_validator("attention", "quantization", "parallel", "kv_allocator", "scheduler", "decoding", mode="before")
    @classmethod
    def _blank_is_unset(cls, value: Any) -> Any:
        return None if isinstance(value, str) and not value.strip() else value


def setting_names() -> list[str]:
    return list(EngineSettings.model_fields)


def _suggest(name: str, candidates: list[str]) -> str:
    match = difflib.get_close_matches(name, candidates, n=1, cutoff=0.6)
    return f"; did you mean {match[0]}?" if match else ""


def check_names(explicit: Mapping[str, Any], environ: Mapping[str, str], dotenv: Mapping[str, str]) -> None:
    """Reject unknown setting names: keywords, INFER_* variables and .env entries."""
    names = setting_names()
    for key in explicit:
        if key not in names:
            raise SettingsError(f"{key!r} is not a setting{_suggest(key, names)} (settings: {', '.join(names)})")
    env_names = [ENV_PREFIX + n.upper() for n in names]
    for source, mapping in (("environment", environ), (".env", dotenv)):
        for key in mapping:
            upper = key.upper()
            if upper.startswith(ENV_PREFIX) and upper not in env_names:
                raise SettingsError(f"{key} is not a setting{_suggest(upper, env_names)} (from the {source})")


def read_dotenv(path: str | os.PathLike[str] = ".env") -> dict[str, str]:
    """The INFER_* entries of a .env file (KEY=VALUE lines; quotes stripped)."""
    file = Path(path)
    if not file.is_file():
        return {}
    values: dict[str, str] = {}
    for line in file.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        key, _, value = line.removeprefix("export ").partition("=")
        key = key.strip()
        if key.upper().startswith(ENV_PREFIX):
            values[key] = value.strip().strip("'\"")
    return values


def load_settings(**explicit: Any) -> EngineSettings:
    """Build EngineSettings from keywords + os.environ + .env, rejecting unknown names."""
    check_names(explicit, os.environ, read_dotenv())
    explicit = {k: v for k, v in explicit.items() if v is not None}
    try:
        return EngineSettings(**explicit)
    except ValidationError as e:
        problems = "; ".join(
            f"{ENV_PREFIX}{'.'.join(map(str, err['loc'])).upper()} / {'.'.join(map(str, err['loc']))}: {err['msg']}"
            f" (got {err.get('input')!r})"
            for err in e.errors()
        )
        raise SettingsError(f"invalid settings: {problems}") from None


def describe_sources(settings: EngineSettings, explicit: Mapping[str, Any], environ: Mapping[str, str] | None = None):
    """(name, value, source) for every setting, source being argument, env, .env or default."""
    environ = os.environ if environ is None else environ
    dotenv = {k.upper(): v for k, v in read_dotenv().items()}
    env_upper = {k.upper() for k in environ}
    rows = []
    for name in setting_names():
        var = ENV_PREFIX + name.upper()
        if explicit.get(name) is not None:
            source = "argument"
        elif var in env_upper:
            source = f"env {var}"
        elif var in dotenv:
            source = f".env {var}"
        else:
            source = "default"
        value = getattr(settings, name)
        if name == "api_key" and value:
            value = "***"
        rows.append((name, value, source))
    return rows
