"""The quantizers: ``int8`` and ``fp8`` (online, or HF's block-wise FP8 checkpoints), ``compressed-tensors``.

``INFER_QUANTIZATION=int8`` / ``fp8`` quantizes an unquantized checkpoint while it loads. A checkpoint whose
config.json has a ``quantization_config`` selects its own quantizer by ``quant_method`` (the core's rule), and
its layers get the schemes it declares (``checkpoint.py``). The embedding and the LM head are not linear
layers of the quantizer: they stay in the model dtype.
"""

from __future__ import annotations

import logging

from infer_core.interfaces import LinearMethod, MoEMethod, PluginError, Quantizer, RuntimeContext
from infer_core.layers.unquantized import UnquantizedLinearMethod

from infer_quant_w8a8.checkpoint import CheckpointScheme, read_checkpoint_scheme
from infer_quant_w8a8.linear_method import W8A8LinearMethod
from infer_quant_w8a8.moe_method import W8ExpertsMethod
from infer_quant_w8a8.schemes import QuantDtype, online_scheme

logger = logging.getLogger(__name__)

FP8_CAPABILITY = (8, 9)  # Ada and Hopper: e4m3 conversions and FP8 tensor cores


class W8A8Quantizer(Quantizer):
    """The shared rules; a subclass names its online dtype (None: none) and the quant_method it reads."""

    online: QuantDtype | None = None
    reads: str | None = None  # the checkpoints' quantization_config.quant_method it loads

    @classmethod
    def validate(cls, ctx: RuntimeContext) -> list[str]:
        reasons = super().validate(ctx)
        try:
            checkpoint = read_checkpoint_scheme(ctx.model.raw)
        except PluginError as e:
            return [*reasons, str(e)]
        method = (ctx.model.raw.get("quantization_config") or {}).get("quant_method")
        if checkpoint is None and cls.online is None:
            reasons.append(f"it loads checkpoints quantized with {cls.reads!r}, and this one has no quantization_config")
        if checkpoint is not None and checkpoint.method != cls.reads:
            reasons.append(f"the checkpoint is already quantized with {method!r} (config.json's quantization_config); "
                           f"unset INFER_QUANTIZATION to use the checkpoint's own")
        if checkpoint is not None and ctx.settings.tensor_parallel_size > 1:
            reasons.append("pre-quantized checkpoints load on one rank for now (their per-tensor and block scales are "
                           f"not split over ranks); set INFER_TENSOR_PARALLEL_SIZE=1, or quantize online with "
                           f"INFER_QUANTIZATION=int8 or fp8 from the unquantized checkpoint")
        if checkpoint is not None and ctx.model.moe is not None:
            reasons.append(f"the experts of a pre-quantized mixture-of-experts checkpoint ({method!r}) do not load "
                           "yet; load the unquantized checkpoint with INFER_QUANTIZATION=int8 or fp8 (its experts "
                           "are quantized while loading)")
        uses_fp8 = cls.online is QuantDtype.FP8 or (checkpoint is not None and any(
            scheme.weight.dtype is QuantDtype.FP8 for _, scheme, _ in checkpoint.groups))
        if uses_fp8 and ctx.is_cuda and (ctx.cuda_capability or (0, 0)) < FP8_CAPABILITY:
            reasons.append(f"FP8 needs a GPU of compute capability {FP8_CAPABILITY[0]}.{FP8_CAPABILITY[1]} or newer "
                           f"(this one: {ctx.cuda_capability}); use int8")
        return reasons

    def __init__(self, ctx: RuntimeContext) -> None:
        super().__init__(ctx)
        self.checkpoint: CheckpointScheme | None = read_checkpoint_scheme(ctx.model.raw)
        self._logged_experts = False

    def get_linear_method(self, prefix: str) -> LinearMethod:
        if self.checkpoint is None:
            assert self.online is not None, "validate refuses a checkpoint without a quantization_config"
            return W8A8LinearMethod(online_scheme(self.online))
        found = self.checkpoint.for_layer(prefix)
        if found is None:
            return UnquantizedLinearMethod()
        scheme, block_n = found
        return W8A8LinearMethod(scheme, self.checkpoint.scale_name, block_n)

    def get_moe_method(self, prefix: str) -> MoEMethod | None:
        """Online: the experts' weights in the online dtype (``moe_method.py``). A pre-quantized checkpoint's
        experts: none yet (the model is refused, naming the layer)."""
        if self.checkpoint is not None:
            return None
        if not self._logged_experts:
            logger.info("experts: %s weights quantized while loading (one scale a row), activations in the model "
                        "dtype; the routers stay dense", self.online.value)
            self._logged_experts = True
        return W8ExpertsMethod(self.online)


class Int8Quantizer(W8A8Quantizer):
    """int8 W8A8 quantized while loading: per-channel weights, per-token dynamic activations."""

    online = QuantDtype.INT8


class FP8Quantizer(W8A8Quantizer):
    """FP8 (e4m3) W8A8 quantized while loading (per-channel weights, per-token activations), or HF's
    block-wise FP8 checkpoints (``quant_method: fp8``)."""

    online = QuantDtype.FP8
    reads = "fp8"


class CompressedTensorsQuantizer(W8A8Quantizer):
    """compressed-tensors checkpoints (llm-compressor's W8A8 int8, FP8, FP8_DYNAMIC, FP8_BLOCK)."""

    reads = "compressed-tensors"
