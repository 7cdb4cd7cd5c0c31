"""EngineSettings: every knob of the engine and server, from arguments, INFER_* variables or .env.

Precedence: explicit arguments (CLI flags, ``LLM(...)`` keywords) > environment > ``.env`` >
defaults. A misspelled ``INFER_*`` variable is an error, not silently ignored.

Plugins declare settings of their own (``PluginSettings``, the ``register_settings`` hook):
``load_settings`` reads them the same way, into sections an EngineSettings carries (pickled with
it to worker processes) and a plugin reads as ``ItsSettings.of(settings)``. ``INFER_PLUGINS``
is read first and alone, since it decides which plugins, and so which settings, exist.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

from pydantic import Field, PrivateAttr, ValidationError, field_validator
from pydantic_settings import BaseSettings, NoDecode

from infer_core.errors import SettingsError
from infer_core.interfaces.settings import ENV_PREFIX, SETTINGS_CONFIG, PluginSettings
from infer_core.plugin_settings import SettingsSection, declare_settings

S = TypeVar("S", bound=PluginSettings)
KV_CACHE_DTYPES = ("auto", "fp8")  # fp8: float8 e4m3 with a per-layer scale
_KV_CACHE_DTYPE_ALIASES = {"fp8_e4m3": "fp8", "float8_e4m3fn": "fp8"}
_DTYPE_ALIASES = {"bf16": "bfloat16", "fp16": "float16", "half": "float16", "fp32": "float32", "float": "float32"}


class EngineSettings(BaseSettings):
    """The engine's configuration. Field names are the setting names (``INFER_<NAME>`` in env)."""

    model_config = SETTINGS_CONFIG

    # what to run
    model: str | None = Field(None, description="model folder, HF-style checkpoint or .gguf file; unset = embedded SmolLM2")
    tokenizer: str | None = Field(None, description="tokenizer folder when it differs from the model's")
    chat_template: str | None = Field(None, description="Jinja chat template (text or file) overriding the model's")
    load_format: Literal["auto", "safetensors", "gguf", "dummy"] = Field("auto", description="how weights are read (gguf: the embedded model from its GGUF, not from the cache)")
    cache_dir: str | None = Field(None, description="folder keeping the embedded model dequantized between starts; unset = $XDG_CACHE_HOME/infer, else ~/.cache/infer")
    dtype: Literal["auto", "bfloat16", "float16", "float32"] = Field("auto", description="activation and weight dtype")
    device: Literal["auto", "cuda", "cpu"] = Field("auto", description="where the model runs")
    seed: int = Field(0, description="seed of unseeded sampling and dummy weights")

    # which implementation of each extension point
    attention: str | None = Field(None, description="attention backend; unset = best that can run here")
    kv_allocator: str = Field("paged", description="KV block allocator")
    scheduler: str = Field("fcfs", description="request scheduler")
    quantization: str | None = Field(None, description="quantizer; unset = the checkpoint's, else none")
    parallel: str | None = Field(None, description="parallel strategy; unset = single on one device, else the one a plugin offers (tp)")
    decoding: str = Field("standard", description="decoding policy")
    grammar: str = Field("xgrammar", description="grammar backend of structured outputs (JSON schema, regex, choice, EBNF)")
    plugins: Annotated[list[str] | None, NoDecode] = Field(
        None, description="comma-separated entry-point names to load (unset = all installed; empty = none)"
    )

    # memory and batching
    block_size: int | None = Field(None, ge=1, description="tokens per KV block; unset = the attention backend's default")
    gpu_memory_utilization: float = Field(0.9, gt=0, le=1, description="share of GPU memory the engine may use")
    num_kv_blocks: int | None = Field(None, ge=1, description="KV blocks to allocate, overriding sizing")
    kv_cache_gb: float | None = Field(None, gt=0, description="GiB for the KV cache (default: profiled on CUDA, 2 on CPU)")
    kv_cache_dtype: str = Field("auto", description="KV cache element type: auto (the model's dtype) or fp8 (e4m3: twice the tokens in the same memory; per-layer scales from the checkpoint, else 1.0); the attention backend must support it")
    max_model_len: int | None = Field(None, ge=1, description="context length limit; unset = the model's")
    max_num_seqs: int = Field(256, ge=1, description="most requests in one step")
    max_num_batched_tokens: int | None = Field(None, ge=1, description="most tokens in one step (prefill chunk budget); unset = 8192 on a GPU, 2048 on the CPU (as vLLM's CPU server: a step of several prompts ends sooner, and so do their first tokens)")
    enable_prefix_caching: bool = Field(True, description="reuse KV blocks of shared prompt prefixes")
    enforce_eager: bool = Field(False, description="never capture CUDA graphs: every decode step runs eagerly")
    prefill_graph_max_tokens: int = Field(512, ge=0, description="a step of one request's prompt chunk of up to this many tokens replays a CUDA graph (sizes 16, 32, ... up to it) where the attention backend supports it; 0 = such steps run eagerly")
    piecewise_cuda_graphs: bool = Field(True, description="a step no whole-step CUDA graph holds (several prompts, prompts beside decodes) replays the layers between its attentions as CUDA graphs, captured per token count up to max_num_batched_tokens (one rank, or ranks whose parallel strategy supports them); off = such steps run eagerly")
    async_scheduling: bool | None = Field(None, description="plan step N+1 while step N runs on the device (built-in scheduler, one rank or tensor parallelism; with speculative decoding: n-gram drafts for greedy requests without penalties); off = each step waits for the previous one's tokens; unset = on with a GPU, off on the CPU (whose steps run as they are launched: overlap would only hand each step's tokens out a step later)")
    pdl: bool = Field(True, description="launch the decode-path Triton kernels with programmatic dependent launch (Hopper and newer GPUs): each starts while the one before it drains")
    tensor_parallel_size: int = Field(1, ge=1, description="GPUs the model is split over")

    # server
    host: str = Field("127.0.0.1", description="address the server binds (for the HTTP server)")
    port: int = Field(8000, ge=0, le=65535, description="port the server binds (for the HTTP server)")
    served_model_name: str | None = Field(None, description="model name clients use (for the HTTP server; default: the model's)")
    max_queued_requests: int = Field(1024, ge=1, description="waiting requests beyond which the server answers 503 (for the HTTP server)")
    api_key: str | None = Field(None, description="when set, /v1 requests need 'Authorization: Bearer <key>' (for the HTTP server)")
    max_request_bytes: int = Field(16 * 1024 * 1024, ge=1, description="largest request body the server reads; larger gets 413 (for the HTTP server)")
    tool_call_parser: Literal["hermes", "llama3_json"] | None = Field(None, description="how tool calls are read from chat outputs: hermes (<tool_call> JSON: Qwen, Hermes) or llama3_json; unset = the one the chat template implies (for the HTTP server)")
    shutdown_timeout: float = Field(30.0, ge=0, description="seconds SIGTERM waits for running requests before aborting them (for the HTTP server)")

    @field_validator("dtype", mode="before")
    @classmethod
    def _dtype_alias(cls, value: Any) -> Any:
        if isinstance(value, str):
            value = value.lower().removeprefix("torch.")
            return _DTYPE_ALIASES.get(value, value)
        return value

    @field_validator("kv_cache_dtype", mode="before")
    @classmethod
    def _kv_cache_dtype(cls, value: Any) -> Any:
        return kv_cache_dtype_name(value) if isinstance(value, str) else value

    # the plugins' settings: section class -> its values; and who declared each (set by load_settings)
    _sections: dict[type[PluginSettings], PluginSettings] = PrivateAttr(default_factory=dict)
    _declared: tuple[SettingsSection, ...] = PrivateAttr(default=())

    @field_validator("plugins", mode="before")
    @classmethod
    def _split_plugins(cls, value: Any) -> Any:
        return split_plugin_names(value)

    @field_validator("attention", "quantization", "parallel", "kv_allocator", "scheduler", "decoding", "grammar",
                     mode="before")
    @classmethod
    def _blank_is_unset(cls, value: Any) -> Any:
        return None if isinstance(value, str) and not value.strip() else value

    def plugin(self, section: type[S]) -> S:
        """The values of a plugin's settings class (``section.of(settings)`` reads this).

        ``load_settings`` fills in every loaded plugin's section; settings made directly
        (``EngineSettings(...)``) read a section from the environment on first use, as they read
        their own fields.
        """
        values = self._sections.get(section)
        if values is None:
            values = self._sections[section] = _validated(section, {})
        return values  # type: ignore[return-value]

    @property
    def declared_sections(self) -> tuple[SettingsSection, ...]:
        """The plugins' settings classes ``load_settings`` read, with the plugin that declared each."""
        return self._declared


def kv_cache_dtype_name(value: str) -> str:
    """``value`` as one of KV_CACHE_DTYPES (``fp8_e4m3`` is ``fp8``); ValueError with a did-you-mean otherwise."""
    name = value.strip().lower()
    name = _KV_CACHE_DTYPE_ALIASES.get(name, name)
    if name not in KV_CACHE_DTYPES:
        choices = [*KV_CACHE_DTYPES, *_KV_CACHE_DTYPE_ALIASES]
        raise ValueError(f"{value!r} is not a KV cache dtype{_suggest(name, choices).replace(';', ',')} "
                         f"(choices: {', '.join(choices)}; auto keeps the model's dtype)")
    return name


def split_plugin_names(value: Any) -> Any:
    """``"a, b"`` -> ``["a", "b"]`` (the empty string: no plugin); lists and tuples as lists."""
    if isinstance(value, str):
        return [p.strip() for p in value.split(",") if p.strip()]
    return list(value) if isinstance(value, tuple) else value


def allowed_plugins(given: Any = None, environ: Mapping[str, str] | None = None) -> list[str] | None:
    """The INFER_PLUGINS allow-list (argument > env > .env; None = every installed plugin), read alone
    before any plugin loads: it decides which plugins' settings exist."""
    if given is None:
        var = ENV_PREFIX + "PLUGINS"
        env = {k.upper(): v for k, v in (os.environ if environ is None else environ).items()}
        given = env.get(var, {k.upper(): v for k, v in read_dotenv().items()}.get(var))
    return split_plugin_names(given)


def setting_names(sections: tuple[SettingsSection, ...] = ()) -> list[str]:
    """The core's setting names, then each section's."""
    return [*EngineSettings.model_fields, *(name for section in sections for name in section.names)]


def _suggest(name: str, candidates: list[str]) -> str:
    match = difflib.get_close_matches(name, candidates, n=1, cutoff=0.6)
    return f"; did you mean {match[0]}?" if match else ""


def check_names(explicit: Mapping[str, Any], environ: Mapping[str, str], dotenv: Mapping[str, str],
                sections: tuple[SettingsSection, ...] = (), allowed: list[str] | None = None) -> None:
    """Reject unknown setting names (the core's and the plugins' ``sections``): keywords, INFER_* variables
    and .env entries. ``allowed`` (INFER_PLUGINS) is named in the message: a left-out plugin declares nothing."""
    names = setting_names(sections)
    left_out = "" if allowed is None else \
        f"; INFER_PLUGINS is {','.join(allowed)!r}: a plugin it leaves out declares no settings"
    for key in explicit:
        if key not in names:
            raise SettingsError(
                f"{key!r} is not a setting{_suggest(key, names)} (settings: {', '.join(names)}){left_out}")
    env_names = [ENV_PREFIX + n.upper() for n in names]
    for source, mapping in (("environment", environ), (".env", dotenv)):
        for key in mapping:
            upper = key.upper()
            if upper.startswith(ENV_PREFIX) and upper not in env_names:
                raise SettingsError(f"{key} is not a setting{_suggest(upper, env_names)} (from the {source}){left_out}")


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
    """Build EngineSettings, with the allowed plugins' sections, from keywords + os.environ + .env,
    rejecting unknown names."""
    allowed = allowed_plugins(explicit.get("plugins"))
    sections = declare_settings(allowed, EngineSettings.model_fields)
    check_names(explicit, os.environ, read_dotenv(), sections, allowed)
    explicit = {k: v for k, v in explicit.items() if v is not None}
    problems: list[str] = []
    settings = _validated(EngineSettings, explicit, problems)
    values = {s.settings_class: _validated(s.settings_class, explicit, problems) for s in sections}
    if problems:
        raise SettingsError(f"invalid settings: {'; '.join(problems)}")
    settings._sections.update(values)
    settings._declared = sections
    return settings


def _validated(cls: type[Any], explicit: Mapping[str, Any], problems: list[str] | None = None) -> Any:
    """``cls`` built from the keywords it declares (the rest of its values from env, .env, defaults);
    its validation errors, named by variable and field, are appended to ``problems`` (raised if None)."""
    try:
        return cls(**{k: v for k, v in explicit.items() if k in cls.model_fields})
    except ValidationError as e:
        found = [
            f"{ENV_PREFIX}{'.'.join(map(str, err['loc'])).upper()} / {'.'.join(map(str, err['loc']))}: {err['msg']}"
            f" (got {err.get('input')!r})"
            for err in e.errors()
        ]
    if problems is None:
        raise SettingsError(f"invalid settings: {'; '.join(found)}")
    problems.extend(found)
    return None


def describe_sources(settings: EngineSettings, explicit: Mapping[str, Any], environ: Mapping[str, str] | None = None):
    """(name, value, source) for every setting, source being argument, env, .env or default; a plugin's
    settings, after the core's, name the plugin that declared them."""
    environ = os.environ if environ is None else environ
    dotenv = {k.upper(): v for k, v in read_dotenv().items()}
    env_upper = {k.upper() for k in environ}
    owners = [(settings, None, list(EngineSettings.model_fields))]
    owners += [(settings.plugin(s.settings_class), s, s.names) for s in settings.declared_sections]
    rows = []
    for values, section, names in owners:
        for name in names:
            var = ENV_PREFIX + name.upper()
            if explicit.get(name) is not None:
                source = "argument"
            elif var in env_upper:
                source = f"env {var}"
            elif var in dotenv:
                source = f".env {var}"
            else:
                source = "default"
            value = getattr(values, name)
            if name == "api_key" and value:
                value = "***"
            rows.append((name, value, source if section is None else f"{source}; declared by {section.describe()}"))
    return rows
