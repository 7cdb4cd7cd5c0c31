"""The loader: plugins in, one resolved engine configuration out.

Run once per process, the same way in every worker: a fresh pluggy manager (``plugin_manager``:
the built-ins registered as a plugin, then the installed entry points ``INFER_PLUGINS`` allows),
then each kind resolved by name with errors that list what is installed and why a choice cannot
run here. Nothing is looked up by name after the engine starts.
"""

from __future__ import annotations

import difflib
import importlib
import logging
from dataclasses import dataclass, field
from typing import Any, NoReturn

import pluggy

from infer_core.config import KINDS, EngineConfig
from infer_core.errors import PluginError, SettingsError
from infer_core.interfaces import RuntimeContext
from infer_core.platform import make_runtime_context
from infer_core.plugin_manager import CORE_DISTRIBUTION, call_per_plugin, create_plugin_manager
from infer_core.settings import EngineSettings

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class KindInfo:
    hook: str
    label: str  # plural, for messages
    setting: str | None  # the EngineSettings field that selects it


KIND_INFO: dict[str, KindInfo] = {
    "attention": KindInfo("register_attention_backends", "attention backends", "attention"),
    "kv_allocator": KindInfo("register_kv_allocators", "KV allocators", "kv_allocator"),
    "scheduler": KindInfo("register_schedulers", "schedulers", "scheduler"),
    "quantization": KindInfo("register_quantizers", "quantizers", "quantization"),
    "parallel": KindInfo("register_parallel_strategies", "parallel strategies", "parallel"),
    "decoding": KindInfo("register_decoding_policies", "decoding policies", "decoding"),
    "grammar": KindInfo("register_grammar_backends", "grammar backends", "grammar"),
    "model": KindInfo("register_models", "model architectures", None),
}


@dataclass(frozen=True, slots=True)
class Implementation:
    """One registered implementation; its class is imported only by ``load``."""

    kind: str
    name: str
    class_path: str
    aliases: tuple[str, ...]
    plugin: str  # entry-point name ("builtin" for the core's own)
    distribution: str
    version: str

    def describe(self) -> str:
        if self.distribution == CORE_DISTRIBUTION:
            return f"{self.name} ({self.distribution})"
        return f"{self.name} ({self.distribution} {self.version})"

    def load(self) -> type:
        module_name, _, attr = self.class_path.partition(":")
        try:
            return getattr(importlib.import_module(module_name), attr)
        except (ImportError, AttributeError) as e:
            raise PluginError(
                f"{self.kind} {self.name!r} ({self.distribution}) cannot be imported from "
                f"{self.class_path}: {e}"
            ) from e

    def reasons(self, ctx: RuntimeContext) -> list[str]:
        """Why it cannot run for ``ctx`` (import failures included); empty when it can."""
        try:
            cls = self.load()
        except PluginError as e:
            return [str(e.__cause__ or e)]
        validate = getattr(cls, "validate", None)
        return list(validate(ctx)) if validate else []


@dataclass(slots=True)
class Catalog:
    """Every implementation the installed plugins registered, by kind and by name or alias."""

    plugin_manager: pluggy.PluginManager
    plugins: dict[str, tuple[str, str]]  # plugin name -> (distribution, version)
    by_kind: dict[str, dict[str, Implementation]] = field(default_factory=dict)

    def implementations(self, kind: str) -> list[Implementation]:
        unique = {id(i): i for i in self.by_kind.get(kind, {}).values()}
        return sorted(unique.values(), key=lambda i: i.name)

    def get(self, kind: str, name: str) -> Implementation | None:
        return self.by_kind.get(kind, {}).get(_key(kind, name))

    def load_class(self, kind: str, name: str) -> type:
        impl = self.get(kind, name)
        if impl is None:
            raise self.unknown(kind, name)
        return impl.load()

    def unknown(self, kind: str, name: str) -> PluginError:
        info = KIND_INFO[kind]
        impls = self.implementations(kind)
        installed = ", ".join(i.describe() for i in impls) or "none"
        known = sorted(self.by_kind.get(kind, {}))
        match = difflib.get_close_matches(_key(kind, name), known, n=1, cutoff=0.5)
        hint = f" Did you mean {match[0]!r}?" if match else ""
        if info.setting is None:
            return PluginError(f"architecture {name!r} is not supported. Supported {info.label}: {installed}.{hint}")
        var = f"INFER_{info.setting.upper()}"
        return PluginError(f"{var}={name!r} is not installed. Installed {info.label}: {installed}.{hint}")

    def resolve(self, kind: str, name: str, ctx: RuntimeContext) -> Implementation:
        """The implementation called ``name``; PluginError if unknown or unable to run here."""
        impl = self.get(kind, name)
        if impl is None:
            raise self.unknown(kind, name)
        reasons = impl.reasons(ctx)
        if reasons:
            label = "attention" if kind == "attention" else kind.replace("_", " ")
            runnable = [i.name for i in self.implementations(kind) if i is not impl and not i.reasons(ctx)]
            alternatives = f" {KIND_INFO[kind].label.capitalize()} that can run here: {', '.join(runnable)}." if runnable else ""
            raise PluginError(f"{label} {impl.name!r} cannot run here: {'; '.join(reasons)}.{alternatives}")
        return impl


def _key(kind: str, name: str) -> str:
    """Names are case-insensitive, except architectures, which are HF class names."""
    return name if kind == "model" else name.lower()


@dataclass(frozen=True, slots=True)
class _Registrar:
    """The ``register`` callable one plugin receives for one kind."""

    registry: dict[str, Implementation]
    kind: str
    plugin: str
    distribution: str
    version: str

    def __call__(self, name: str, class_path: str, *, aliases: tuple[str, ...] = ()) -> None:
        impl = Implementation(self.kind, _key(self.kind, name), class_path, tuple(_key(self.kind, a) for a in aliases),
                              self.plugin, self.distribution, self.version)
        for key in (impl.name, *impl.aliases):
            existing = self.registry.get(key)
            if existing is not None and existing.plugin != self.plugin:
                raise PluginError(
                    f"{self.kind} {key!r} is registered twice: by {existing.distribution} and by {self.distribution}; "
                    f"uninstall one or restrict INFER_PLUGINS"
                )
            self.registry[key] = impl


def load_catalog(allowed: list[str] | None = None) -> Catalog:
    """Collect every implementation, remembering which plugin (and distribution) registered it."""
    pm, plugins = create_plugin_manager(allowed)
    catalog = Catalog(pm, plugins)
    for kind, info in KIND_INFO.items():
        registry = catalog.by_kind.setdefault(kind, {})
        call_per_plugin(pm, info.hook, lambda name: _Registrar(registry, kind, name, *plugins.get(name, (name, "?"))))
    return catalog


def choose_names(settings: EngineSettings, catalog: Catalog, ctx: RuntimeContext) -> dict[str, str]:
    """The chosen name of each kind: the setting, or the default rule when unset."""
    names = {kind: getattr(settings, kind) for kind in KINDS}
    if names["attention"] is None:
        names["attention"] = catalog.plugin_manager.hook.default_attention_backend(ctx=ctx) or "torch"
    if names["parallel"] is None:
        names["parallel"] = catalog.plugin_manager.hook.default_parallel_strategy(ctx=ctx) or _no_parallel_default(
            settings, catalog)
    if names["quantization"] is None:
        quant = (ctx.model.raw.get("quantization_config") or {}).get("quant_method")
        if quant and quant != "gguf" and catalog.get("quantization", quant) is None:
            installed = ", ".join(i.describe() for i in catalog.implementations("quantization"))
            raise PluginError(
                f"the checkpoint is quantized with {quant!r} (quantization_config.quant_method) and no installed "
                f"quantizer handles it. Installed quantizers: {installed}. Install a plugin for it, or use an "
                f"unquantized checkpoint"
            )
        names["quantization"] = quant if quant and quant != "gguf" else "none"
    return names


def _no_parallel_default(settings: EngineSettings, catalog: Catalog) -> NoReturn:
    plugins = ", ".join(catalog.plugins)
    raise PluginError(
        f"INFER_TENSOR_PARALLEL_SIZE={settings.tensor_parallel_size} needs a parallel strategy for several devices, "
        f"and no loaded plugin offers one (plugins loaded: {plugins}). Install infer-parallel-tp "
        f"(pip install -e plugins/parallel_tp) and leave 'tp' in INFER_PLUGINS, name a strategy in INFER_PARALLEL, "
        f"or set INFER_TENSOR_PARALLEL_SIZE=1"
    )


def negotiate_block_size(settings: EngineSettings, attention: type, ctx: RuntimeContext, name: str) -> int:
    caps = attention.capabilities(ctx)
    if settings.block_size is None:
        return caps.default_block_size
    if settings.block_size % caps.block_size_multiple:
        raise SettingsError(
            f"INFER_BLOCK_SIZE={settings.block_size} is not supported by attention {name!r}: it needs a "
            f"multiple of {caps.block_size_multiple}; unset INFER_BLOCK_SIZE or pick a multiple"
        )
    return settings.block_size


@dataclass(frozen=True, slots=True)
class EngineSpec:
    """The assembled engine, as ``engine_configured`` observers and ``/v1/plugins`` see it."""

    config: EngineConfig
    catalog: Catalog
    chosen: dict[str, Implementation]

    @property
    def context(self) -> RuntimeContext:
        return self.config.context


def assemble(settings: EngineSettings, catalog: Catalog | None = None) -> EngineSpec:
    """Resolve the model, device, dtype and one implementation of every kind."""
    from infer_core.models.gguf_cache import locate_model
    from infer_core.models.source import read_generation_eos, read_model_config

    catalog = catalog or load_catalog(settings.plugins)
    source = locate_model(settings.model, settings.load_format, settings.cache_dir)
    model = read_model_config(source)
    ctx = make_runtime_context(settings, model)
    catalog.resolve("model", model.architecture, ctx)
    names = choose_names(settings, catalog, ctx)
    chosen = {kind: catalog.resolve(kind, names[kind], ctx) for kind in KINDS}
    chosen["model"] = catalog.get("model", model.architecture)
    block_size = negotiate_block_size(settings, chosen["attention"].load(), ctx, names["attention"])
    max_model_len = settings.max_model_len or model.max_position_embeddings
    if max_model_len > model.max_position_embeddings:
        raise SettingsError(
            f"INFER_MAX_MODEL_LEN={max_model_len} exceeds the model's max_position_embeddings "
            f"({model.max_position_embeddings}); lower it"
        )
    extra_eos = read_generation_eos(source)
    config = EngineConfig(
        context=ctx, source=source, block_size=block_size, max_model_len=max_model_len,
        implementations={k: chosen[k].name for k in KINDS}, load_format=_load_format(settings.load_format, source),
        eos_token_ids=tuple(dict.fromkeys(model.eos_token_ids + extra_eos)),
    )
    spec = EngineSpec(config, catalog, chosen)
    logger.info("engine: %s", ", ".join(f"{k}={chosen[k].name}" for k in KINDS))
    catalog.plugin_manager.hook.engine_configured(spec=spec)
    return spec


def _load_format(requested: str, source: Any) -> str:
    if requested != "auto":
        if requested == "gguf" and source.gguf_file is None:
            raise SettingsError("INFER_LOAD_FORMAT=gguf but the model is not a .gguf file")
        return requested
    return "gguf" if source.gguf_file else "safetensors"
