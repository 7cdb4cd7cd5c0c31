"""A pre-quantized checkpoint's ``quantization_config`` read into the scheme of each linear layer.

Two formats: compressed-tensors (``quant_method: compressed-tensors``, what llm-compressor writes: config
groups of weight and input-activation arguments, each for ``targets``, and ``ignore``d layers) and HF's FP8
(``quant_method: fp8`` with ``weight_block_size``: e4m3 weights in 128x128 blocks with their scales in
``weight_scale_inv``, activations quantized per token and group of 128 columns). Anything else is an error
that names what the checkpoint has and what this plugin runs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from infer_core.interfaces import PluginError

from infer_quant_w8a8.schemes import ActivationFormat, LinearScheme, QuantDtype, WeightFormat

SUPPORTED = (
    "compressed-tensors with 8-bit symmetric weights and activations of one type: int8 W8A8 (per-channel or "
    "per-tensor weights; dynamic per-token or static per-tensor activations), FP8 (per-tensor, per-channel or "
    "block weights; static per-tensor, dynamic per-token or dynamic per-group activations: the FP8, FP8_DYNAMIC, "
    "FP8_BLOCK presets); HF fp8 with weight_block_size"
)

# our fused layers and the checkpoint's layers they hold
FUSED = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}


def checkpoint_names(prefix: str) -> list[str]:
    """The checkpoint's names of the layers our layer ``prefix`` holds (q, k, v for ``...qkv_proj``)."""
    head, _, last = prefix.rpartition(".")
    parts = FUSED.get(last, (last,))
    return [f"{head}.{p}" if head else p for p in parts]


def _matches(name: str, patterns: list[str]) -> bool:
    """compressed-tensors' targets: a module class (``Linear``), a name, or ``re:<regex>`` of the name."""
    for pattern in patterns:
        if pattern == "Linear" or pattern == name:
            return True
        if pattern.startswith("re:") and re.match(pattern[3:], name):
            return True
    return False


@dataclass(frozen=True, slots=True)
class CheckpointScheme:
    """The scheme of each layer of a pre-quantized checkpoint (None: a layer the checkpoint keeps unquantized)."""

    method: str  # quantization_config.quant_method
    groups: tuple[tuple[tuple[str, ...], LinearScheme, int | None], ...]  # (targets, scheme, block rows)
    ignore: tuple[str, ...]
    scale_name: str  # the checkpoint's name of the weight scales

    def for_layer(self, prefix: str) -> tuple[LinearScheme, int | None] | None:
        """(scheme, rows a block scale covers) of our layer ``prefix``; None: unquantized in the checkpoint."""
        found = []
        for name in checkpoint_names(prefix):
            if _matches(name, list(self.ignore)):
                found.append(None)
                continue
            match = next(((s, b) for targets, s, b in self.groups if _matches(name, list(targets))), None)
            found.append(match)
        if any(f != found[0] for f in found):
            raise PluginError(f"{prefix} fuses {', '.join(checkpoint_names(prefix))}, which the checkpoint quantizes "
                              f"differently ({found}); this plugin needs them alike")
        return found[0]


def _dtype(args: dict[str, Any], what: str) -> QuantDtype:
    if args.get("num_bits") != 8 or not args.get("symmetric", True):
        raise _unsupported(f"{what}: {args.get('num_bits')}-bit, symmetric={args.get('symmetric')}")
    kind = args.get("type", "int")
    if kind not in ("int", "float"):
        raise _unsupported(f"{what} of type {kind!r}")
    return QuantDtype.INT8 if kind == "int" else QuantDtype.FP8


def _weight_format(args: dict[str, Any]) -> tuple[WeightFormat, int | None]:
    dtype = _dtype(args, "weights")
    strategy = args.get("strategy")
    if strategy in ("tensor", "channel"):
        return WeightFormat(dtype), None
    if strategy == "block" and dtype is QuantDtype.FP8:
        block_n, block_k = args.get("block_structure") or (None, None)
        return WeightFormat(dtype, group_k=int(block_k)), int(block_n)
    raise _unsupported(f"{dtype.value} weights of strategy {strategy!r}")


def _activation_format(args: dict[str, Any] | None, weight: WeightFormat) -> ActivationFormat:
    if args is None:
        raise _unsupported(f"{weight.dtype.value} weights with unquantized activations (weight-only, W8A16)")
    dtype = _dtype(args, "input activations")
    strategy, dynamic = args.get("strategy"), args.get("dynamic")
    if strategy == "tensor" and dynamic is False:
        return ActivationFormat(dtype, static=True)
    if strategy == "token" and dynamic is True:
        return ActivationFormat(dtype)
    if strategy == "group" and dynamic is True:
        return ActivationFormat(dtype, group_k=int(args.get("group_size")))
    raise _unsupported(f"{dtype.value} input activations of strategy {strategy!r}, dynamic={dynamic!r}")


def _unsupported(what: str) -> PluginError:
    return PluginError(f"the checkpoint's quantization_config has {what}, which this plugin does not run. "
                       f"Supported: {SUPPORTED}")


def read_compressed_tensors(config: dict[str, Any]) -> CheckpointScheme:
    fmt = config.get("format")
    if fmt not in ("int-quantized", "float-quantized", "naive-quantized", None):
        raise _unsupported(f"format {fmt!r} (e.g. packed 4-bit weights, W4A16)")
    groups = []
    for name, group in (config.get("config_groups") or {}).items():
        if group.get("output_activations"):
            raise _unsupported(f"quantized output activations (config group {name!r})")
        if group.get("weights") is None:
            raise _unsupported(f"a config group {name!r} with unquantized weights")
        weight, block_n = _weight_format(group["weights"])
        activation = _activation_format(group.get("input_activations"), weight)
        try:
            scheme = LinearScheme(weight, activation, prequantized=True)
        except ValueError as e:
            raise _unsupported(f"config group {name!r}: {e}") from e
        groups.append((tuple(group.get("targets") or ()), scheme, block_n))
    if not groups:
        raise _unsupported("no config_groups")
    if config.get("kv_cache_scheme"):
        raise _unsupported("a kv_cache_scheme (quantized KV cache scales)")
    return CheckpointScheme("compressed-tensors", tuple(groups), tuple(config.get("ignore") or ()), "weight_scale")


def read_hf_fp8(config: dict[str, Any]) -> CheckpointScheme:
    block = config.get("weight_block_size")
    if not block or len(block) != 2:
        raise _unsupported(f"HF fp8 without weight_block_size (got {block!r})")
    if config.get("activation_scheme", "dynamic") != "dynamic":
        raise _unsupported(f"HF fp8 with activation_scheme={config.get('activation_scheme')!r}")
    block_n, block_k = (int(b) for b in block)
    scheme = LinearScheme(WeightFormat(QuantDtype.FP8, group_k=block_k),
                          ActivationFormat(QuantDtype.FP8, group_k=block_k), prequantized=True)
    ignore = tuple(config.get("modules_to_not_convert") or ())
    # HF's fp8 keeps a module unquantized where one of these is part of its name ("lm_head", "mlp.gate")
    patterns = tuple(f"re:.*{re.escape(m)}" for m in ignore)
    return CheckpointScheme("fp8", ((("Linear",), scheme, block_n),), patterns, "weight_scale_inv")


def read_checkpoint_scheme(raw_config: dict[str, Any]) -> CheckpointScheme | None:
    """The checkpoint's scheme from its config.json (``raw_config``); None for an unquantized checkpoint."""
    config = raw_config.get("quantization_config") or {}
    method = config.get("quant_method")
    if method in (None, "gguf"):  # a GGUF's tensors reach the engine dequantized
        return None
    if method == "compressed-tensors":
        return read_compressed_tensors(config)
    if method == "fp8":
        return read_hf_fp8(config)
    raise _unsupported(f"quant_method {method!r}")
