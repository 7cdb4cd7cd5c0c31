"""Registers the built-in implementations. Class paths are imported only when chosen."""

from __future__ import annotations

from infer_core.hookspecs import hookimpl

_B = "infer_core.builtin"


@hookimpl
def register_attention_backends(register):
    register("torch", f"{_B}.attention_torch:TorchAttentionBackend", aliases=("sdpa",))


@hookimpl
def register_kv_allocators(register):
    register("paged", f"{_B}.kv_paged:PagedKVAllocator")


@hookimpl
def register_schedulers(register):
    register("fcfs", f"{_B}.scheduler_fcfs:FCFSScheduler")
    register("priority", f"{_B}.scheduler_priority:PriorityScheduler")


@hookimpl
def register_quantizers(register):
    register("none", f"{_B}.quant_none:NoQuantizer")


@hookimpl
def register_parallel_strategies(register):
    register("single", f"{_B}.parallel_single:SingleDeviceStrategy")


@hookimpl
def register_decoding_policies(register):
    register("standard", f"{_B}.decoding_standard:StandardDecoding")


@hookimpl
def register_grammar_backends(register):
    register("xgrammar", f"{_B}.grammar_xgrammar:XGrammarBackend")


@hookimpl
def register_models(register):
    for arch in ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM"):
        register(arch, "infer_core.models.llama:LlamaForCausalLM")
    for arch in ("Qwen3MoeForCausalLM", "MixtralForCausalLM", "Qwen2MoeForCausalLM"):
        register(arch, "infer_core.models.moe:MoEForCausalLM")


@hookimpl(trylast=True)
def default_attention_backend(ctx):
    return "torch"


@hookimpl(trylast=True)
def default_parallel_strategy(ctx):
    return "single" if ctx.settings.tensor_parallel_size == 1 else None
