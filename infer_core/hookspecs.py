"""The extension points of infer, as pluggy hook specifications.

A plugin is a module (or object) with functions marked ``@hookimpl`` named like the specs below,
exposed through an entry point in the group ``infer_core.plugins``::

    [project.entry-points."infer_core.plugins"]
    triton = "infer_attention_triton.plugin"

Registration hooks receive a ``register`` callable::

    register(name, "package.module:Class", aliases=("other-name",))

The class path is imported only when that implementation is chosen, so registering must not
import heavy dependencies (triton, flash_attn).

A plugin's own settings are a ``PluginSettings`` class (``infer_core.interfaces``) declared by
``register_settings``; its module should import pydantic and ``infer_core.interfaces`` only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

import pluggy

if TYPE_CHECKING:
    from infer_core.interfaces import PluginSettings, RuntimeContext

PROJECT_NAME = "infer_core"
ENTRY_POINT_GROUP = "infer_core.plugins"

hookspec = pluggy.HookspecMarker(PROJECT_NAME)
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)


class Register(Protocol):
    """The callable registration hooks receive."""

    def __call__(self, name: str, class_path: str, *, aliases: tuple[str, ...] = ()) -> None: ...


class RegisterSettings(Protocol):
    """The callable ``register_settings`` receives."""

    def __call__(self, settings_class: type[PluginSettings]) -> None: ...


@hookspec
def register_settings(register: RegisterSettings) -> None:
    """Declare ``PluginSettings`` classes: each field becomes a setting (``INFER_<NAME>``, a flag, a keyword).

    Called before the engine's settings are read, for the plugins ``INFER_PLUGINS`` allows. A name the
    core or another plugin also declares is an error naming both.
    """


@hookspec
def register_attention_backends(register: Register) -> None:
    """Register ``AttentionBackend`` classes (selected by ``INFER_ATTENTION``)."""


@hookspec
def register_kv_allocators(register: Register) -> None:
    """Register ``KVAllocator`` classes (selected by ``INFER_KV_ALLOCATOR``)."""


@hookspec
def register_schedulers(register: Register) -> None:
    """Register ``Scheduler`` classes (selected by ``INFER_SCHEDULER``)."""


@hookspec
def register_quantizers(register: Register) -> None:
    """Register ``Quantizer`` classes (selected by ``INFER_QUANTIZATION``)."""


@hookspec
def register_parallel_strategies(register: Register) -> None:
    """Register ``ParallelStrategy`` classes (selected by ``INFER_PARALLEL``)."""


@hookspec
def register_decoding_policies(register: Register) -> None:
    """Register ``DecodingPolicy`` classes (selected by ``INFER_DECODING``)."""


@hookspec
def register_grammar_backends(register: Register) -> None:
    """Register ``GrammarBackend`` classes for structured outputs (selected by ``INFER_GRAMMAR``)."""


@hookspec
def register_models(register: Register) -> None:
    """Register model classes by the HF ``architectures`` name they implement."""


@hookspec(firstresult=True)
def default_attention_backend(ctx: RuntimeContext) -> str | None:
    """Name of the attention backend to use when ``INFER_ATTENTION`` is unset, or None to pass.

    The first non-None answer wins; order implementations with ``tryfirst`` / ``trylast``.
    """


@hookspec(firstresult=True)
def default_parallel_strategy(ctx: RuntimeContext) -> str | None:
    """Name of the parallel strategy to use when ``INFER_PARALLEL`` is unset, or None to pass.

    The first non-None answer wins; the core answers ``single`` (last) for one device only, so a
    ``tensor_parallel_size`` above 1 needs a plugin that answers for it.
    """


@hookspec
def engine_configured(spec: Any) -> None:
    """Observe the assembled engine (an ``infer_core.loader.EngineSpec``): logs, metrics."""
