"""The W8A8 LinearMethod: int8 / FP8 weights with float32 scales, and the kernels chosen when the layer is built.

Parameters on the layer (this rank's rows; fused shards, q/k/v or gate/up, at their offsets):

- ``weight`` [N, K] int8 or float8 e4m3fn.
- the weight scales, float32 [N, groups]: a buffer ``weight_scale`` when the weights are quantized here while
  they load (the checkpoint has none), else a parameter under the checkpoint's name (``weight_scale``,
  HF FP8's ``weight_scale_inv``), each shard's per-tensor, per-channel or block scales expanded to rows.
- ``input_scale`` [1] float32, for a static activation scale: the largest of the fused shards' (one input
  is quantized once for all of them; with the largest every shard's values stay in range).

Online, each checkpoint tensor is quantized as it arrives (``load_weight``), so the model dtype's copy of a
layer never exists beside the quantized one: the host and the device hold one tensor of the checkpoint at a
time. Chosen when the weights are created, from the device they are created on: the GEMV for decode-sized
batches (``gemv.py``, where the layer runs Triton: ``fused.runs_triton``) and the GEMM for the rest
(``gemm.choose_gemm``). A layer built with its input norm computes that norm in the GEMV's launch, or in the
activation quantization's before the GEMM (``apply_with_norm``).
"""

from __future__ import annotations

import torch
from infer_core.interfaces import LinearMethod
from infer_core.layers import fused
from infer_core.layers.fused.gemv_fusion import MAX_FUSED_K
from torch import nn

from infer_quant_w8a8.gemm import PRODUCTS, choose_gemm, reference
from infer_quant_w8a8.quantize import TORCH_DTYPES, expand_block_scales, quantize_weight
from infer_quant_w8a8.schemes import LinearScheme, QuantDtype

GEMV_MAX_ROWS = 8  # gemv.MAX_ROWS (not imported: that module imports triton)


class W8A8LinearMethod(LinearMethod):
    """``x @ W^T + b`` with W stored as 8-bit values and scales (``scheme``).

    ``scale_name``: the checkpoint's name of the weight scales (pre-quantized); ``block_n``: rows a checkpoint
    scale covers (128 for 128x128 blocks; None: per tensor or per channel, told apart by their shapes).
    """

    def __init__(self, scheme: LinearScheme, scale_name: str = "weight_scale", block_n: int | None = None) -> None:
        self.scheme = scheme
        self.scale_name = scale_name if scheme.prequantized else "weight_scale"
        self.block_n = block_n
        self.gemv = False
        self.gemm = reference
        self.params_dtype: torch.dtype | None = None  # the model dtype: x's, the bias's and the norms'
        self.norm_in_gemv = self.norm_in_gemm = False  # where apply_with_norm computes the input norm

    def create_weights(self, layer, input_size, output_sizes, params_dtype):
        n, k = sum(output_sizes), input_size
        self.params_dtype = params_dtype
        weight = nn.Parameter(torch.empty(n, k, dtype=TORCH_DTYPES[self.scheme.weight.dtype]), requires_grad=False)
        weight.output_dim, weight.input_dim = 0, 1
        layer.register_parameter("weight", weight)
        scale = torch.ones(n, self.scheme.weight.num_groups(k), dtype=torch.float32)
        if self.scheme.prequantized:
            param = nn.Parameter(scale, requires_grad=False)
            param.output_dim, param.input_dim = 0, None
            layer.register_parameter(self.scale_name, param)
        else:
            layer.register_buffer("weight_scale", scale)
        if self.scheme.activation.static:
            input_scale = nn.Parameter(torch.zeros(1, dtype=torch.float32), requires_grad=False)
            input_scale.output_dim = input_scale.input_dim = None
            layer.register_parameter("input_scale", input_scale)
        device = weight.device
        group_k = self.scheme.weight.group_k  # the GEMV takes groups of a power of two columns
        self.gemv = (fused.runs_triton(fused.GEMV, device) and params_dtype.is_floating_point
                     and (group_k is None or group_k & (group_k - 1) == 0))
        self.gemm = choose_gemm(self.scheme, n, k, device)

    # -- loading ---------------------------------------------------------------------------------------------

    def load_weight(self, layer, param, loaded, output_offset):
        if param is layer.weight:
            self._load_weight(layer, loaded, output_offset)
        elif param is getattr(layer, "input_scale", None):
            param.data.copy_(torch.maximum(param.data, loaded.float().reshape(1).to(param.device)))
        elif param is getattr(layer, self.scale_name, None) and self.scheme.prequantized:
            rows = self._shard_rows(layer, output_offset)
            self._rows(param.data, output_offset, rows).copy_(self._scale_rows(loaded, rows, param.shape[1]))
        else:
            super().load_weight(layer, param, loaded, output_offset)

    def _load_weight(self, layer, loaded: torch.Tensor, offset: int | None) -> None:
        weight = layer.weight.data
        dst = self._rows(weight, offset, loaded.shape[0])
        if dst.shape != loaded.shape:
            raise ValueError(f"{layer.prefix}: weight shape {tuple(loaded.shape)} does not fit the parameter's slice "
                             f"{tuple(dst.shape)}")
        if self.scheme.prequantized:
            if loaded.dtype != weight.dtype:
                raise ValueError(f"{layer.prefix}: the checkpoint's weight is {loaded.dtype}, but its "
                                 f"quantization_config says {self.scheme.describe()} ({weight.dtype}); is config.json "
                                 f"of the same checkpoint?")
            dst.copy_(loaded)
            return
        q, scale = quantize_weight(loaded.to(weight.device), self.scheme.weight)
        dst.copy_(q)
        self._rows(getattr(layer, self.scale_name), offset, loaded.shape[0]).copy_(scale)

    @staticmethod
    def _rows(t: torch.Tensor, offset: int | None, rows: int) -> torch.Tensor:
        return t if offset is None else t.narrow(0, offset, rows)

    @staticmethod
    def _shard_rows(layer, offset: int | None) -> int:
        """Rows of the fused shard that starts at ``offset`` (None: the whole layer)."""
        if offset is None:
            return sum(layer.output_sizes)
        start = 0
        for rows in layer.output_sizes:
            if start == offset:
                return rows
            start += rows
        raise ValueError(f"{layer.prefix}: no shard starts at row {offset} of {layer.output_sizes}")

    def _scale_rows(self, loaded: torch.Tensor, rows: int, groups: int) -> torch.Tensor:
        """A checkpoint's scales of one shard as [rows, groups]: per tensor, per channel or per block."""
        s = loaded.float()
        if s.numel() == 1:
            return s.reshape(1, 1).expand(rows, groups)
        if self.block_n is not None and s.dim() == 2 and s.shape[1] == groups:
            if s.shape[0] != -(-rows // self.block_n):
                raise ValueError(f"block scales {tuple(s.shape)} do not cover {rows} rows in blocks of {self.block_n}")
            return expand_block_scales(s, rows, self.block_n)
        if s.numel() == rows * groups:
            return s.reshape(rows, groups)
        raise ValueError(f"weight scales of shape {tuple(loaded.shape)} fit neither a tensor, {rows} channels nor "
                         f"{rows} rows of {groups} groups")

    # -- computing -------------------------------------------------------------------------------------------

    def uses_gemv(self, layer, x: torch.Tensor) -> bool:
        """Whether ``apply`` runs the W8 GEMV on ``x`` (a layer built for it, a decode-sized batch)."""
        return self.gemv and 0 < x.numel() <= GEMV_MAX_ROWS * x.shape[-1]

    def apply_with_act(self, layer, x, bias):
        """gate_up's SiLU-and-mul in the GEMV's epilogue at decode sizes (``gemv.py``), where the activation was
        built to run our Triton kernel (``fused.SILU_AND_MUL``)."""
        if not (getattr(layer.act, "triton", False) and self.uses_gemv(layer, x)):
            return None
        from infer_quant_w8a8.gemv import w8_gemv

        return w8_gemv(x, layer.weight, getattr(layer, self.scale_name), bias, self.scheme.weight.group_k, silu=True)

    def fuses_input_norm(self, layer, norm) -> bool:
        """Where either of this method's launches can take the norm (decided here, once, for ``apply_with_norm``):
        the GEMV at decode sizes (``_gemv_takes_norm``) or the activation quantization before the GEMM
        (``_gemm_takes_norm``)."""
        self.norm_in_gemv = self._gemv_takes_norm(layer, norm)
        self.norm_in_gemm = self._gemm_takes_norm(layer, norm)
        return self.norm_in_gemv or self.norm_in_gemm

    def _gemv_takes_norm(self, layer, norm) -> bool:
        """Where the GEMV runs, on rows the norm kernel takes in one pass, in this layer's dtype; with gate_up's
        SiLU-and-mul only where that runs our kernel (as ``apply_with_act``: the fused launch gives its values).
        Per-channel weights only: grouped ones (a checkpoint's 128-column blocks) take K steps no wider than a
        group, and normalising the input's chunk again at each of those many short steps measured slower than
        the norm's own launch (the kernel computes them all the same: ``gemv.w8_rms_norm_gemv``); and not FP8
        gate_up, whose fused launch (two e4m3 tiles a K step besides the norm's chunk) measured slower than the
        norm's launch and the plain one together, where int8's and FP8 qkv's measured faster."""
        act = layer.act
        if act is not None and self.scheme.weight.dtype is QuantDtype.FP8:
            return False
        return (self.gemv and self.scheme.weight.group_k is None and norm.weight.dtype == self.params_dtype
                and 0 < layer.input_size <= MAX_FUSED_K and (act is None or getattr(act, "triton", False)))

    def _gemm_takes_norm(self, layer, norm) -> bool:
        """Activations quantized dynamically per token, rows the norm kernel takes in one pass, in this layer's
        dtype: ``norm_quant.rms_norm_quantize`` hands the GEMM's product its q and scales."""
        act = self.scheme.activation
        return (not act.static and act.group_k is None and norm.weight.dtype == self.params_dtype
                and 0 < layer.input_size <= MAX_FUSED_K)

    def apply_with_norm(self, layer, normed, bias, keep_normed=False):
        """At decode sizes, the input norm (+ residual add) in the GEMV's launch (``gemv.w8_rms_norm_gemv``); at
        the GEMM's, in the activation quantization's (``norm_quant.rms_norm_quantize``), then the GEMM's product
        and the layer's activation. The residual sum into ``residual_out`` and the norm's output (kept with
        ``keep_normed``) the norm kernel's bits either way."""
        x = normed.x
        if x.dim() != 2 or x.shape[0] == 0:
            return None
        norm = normed.norm
        gemv = self.uses_gemv(layer, x)
        if not (self.norm_in_gemv if gemv else self.norm_in_gemm):
            return None
        rows = torch.empty(x.shape, dtype=x.dtype, device=x.device) if keep_normed else None
        scale = getattr(layer, self.scale_name)
        if gemv:
            from infer_quant_w8a8.gemv import w8_rms_norm_gemv

            out = w8_rms_norm_gemv(x, norm.weight, norm.eps, layer.weight, scale, bias, self.scheme.weight.group_k,
                                   normed.residual, silu=layer.act is not None, residual_out=normed.residual_out,
                                   normed_out=rows)
            out = out if normed.residual is None else out[0]
        else:
            from infer_quant_w8a8.norm_quant import rms_norm_quantize

            xq, x_scale = rms_norm_quantize(x, norm.weight, norm.eps, self.scheme.activation, normed.residual,
                                            normed.residual_out, rows)
            out = PRODUCTS[self.gemm](xq, x_scale, layer.weight, scale, self.scheme, bias, x.dtype)
            if layer.act is not None:
                out = layer.act(out)
        return out if rows is None else (out, rows)

    def apply(self, layer, x, bias):
        if self.uses_gemv(layer, x):
            from infer_quant_w8a8.gemv import w8_gemv

            return w8_gemv(x, layer.weight, getattr(layer, self.scale_name), bias, self.scheme.weight.group_k)
        rows = x.reshape(-1, x.shape[-1])
        out = self.gemm(rows, layer.weight, getattr(layer, self.scale_name), self.scheme, bias,
                        getattr(layer, "input_scale", None))
        return out.view(*x.shape[:-1], out.shape[-1])
