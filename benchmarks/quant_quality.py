"""W8A8's quality on a real model (CPU): teacher-forced top-1 agreement with the unquantized model, and perplexity.

The model is the embedded default (SmolLM2-135M-Instruct, its dequantized checkpoint in float32), run by HF
transformers with every linear layer but the LM head computed as the plugin computes it on the CPU
(``infer_quant_w8a8.quantize``: per-channel weights quantized as the online path does, per-token activations,
``reference_linear``). The text is real English prose (``--text``; default: the GNU GPL v3, as Debian ships it),
cut into ``--window``-token windows, at least ``--min-tokens`` scored tokens in all. For each scheme: the share of
positions whose argmax equals the unquantized model's, and the perplexity of the text's next tokens. The
``-weights`` schemes leave the activations unquantized: what the GPU's decode GEMV computes (W8A16). Beside
them, what the same figures are for the unquantized model in bfloat16 (``bf16``, the floor of any bfloat16
serving), for compressed-tensors' own fake quantization of its ``W8A8`` and ``FP8_DYNAMIC`` presets
(``ct-*``: what llm-compressor's round-to-nearest checkpoint of these weights computes), and for int8 W8A8 of
one layer type at a time (``int8:q_proj,k_proj,v_proj``), and with the LM head quantized too (``int8+head``).

    python -m benchmarks.quant_quality --out benchmarks/results
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import torch
from torch import nn

from benchmarks.common import write_result

DEFAULT_TEXT = Path("/usr/share/common-licenses/GPL-3")


class W8A8Linear(nn.Module):
    """An ``nn.Linear`` as the plugin computes it: its rows quantized per channel; its input quantized per token
    (W8A8: the CPU's path and the GPU's above 8 rows) or not (``weight_only``: the GPU's decode GEMV)."""

    def __init__(self, linear: nn.Linear, scheme, weight_only: bool) -> None:
        super().__init__()
        from infer_quant_w8a8.quantize import quantize_weight

        self.scheme, self.weight_only = scheme, weight_only
        self.wq, self.scale = quantize_weight(linear.weight.data, scheme.weight)
        self.bias = linear.bias

    def forward(self, x):
        from infer_quant_w8a8.quantize import dequantize_weight, reference_linear

        if self.weight_only:
            return nn.functional.linear(x, dequantize_weight(self.wq, self.scale).to(x.dtype), self.bias)
        return reference_linear(x, self.wq, self.scale, self.scheme, self.bias)


class CompressedTensorsLinear(nn.Module):
    """An ``nn.Linear`` as compressed-tensors (llm-compressor's library) fake-quantizes it under one of its
    presets: its weights by the preset's weight args, its input per call by the dynamic activation args, both
    with compressed-tensors' own ``calculate_qparams`` / ``fake_quantize`` (its conventions: int8 scales of
    ``max / 127.5`` over [-128, 127])."""

    def __init__(self, linear: nn.Linear, preset: str) -> None:
        super().__init__()
        from compressed_tensors.quantization import preset_name_to_scheme
        from compressed_tensors.quantization.lifecycle.forward import fake_quantize
        from compressed_tensors.quantization.utils import calculate_qparams

        scheme = preset_name_to_scheme(preset, ["Linear"])
        self.input_args = scheme.input_activations
        w = linear.weight.data
        scale, zero = calculate_qparams(w.amin(1, keepdim=True), w.amax(1, keepdim=True), scheme.weights)
        self.weight = fake_quantize.__wrapped__(w, scale, zero, scheme.weights)  # its lru_cache would keep tensors
        self.bias = linear.bias

    def forward(self, x):
        from compressed_tensors.quantization.lifecycle.forward import fake_quantize
        from compressed_tensors.quantization.utils import compute_dynamic_scales_and_zp

        scale, zero = compute_dynamic_scales_and_zp(x, self.input_args, self)
        return nn.functional.linear(fake_quantize.__wrapped__(x, scale, zero, self.input_args), self.weight, self.bias)


def quantized_copy(model: nn.Module, scheme_name: str) -> nn.Module:
    """``int8`` / ``fp8``: W8A8; ``int8-weights`` / ``fp8-weights``: the activations left unquantized;
    ``ct-W8A8`` / ``ct-FP8_DYNAMIC``: compressed-tensors' own fake quantization of that preset; ``bf16``: the
    unquantized model in bfloat16. ``SCHEME:q_proj,k_proj``: only the linear layers of those names;
    ``SCHEME+head``: the LM head quantized too (its own copy where the embedding is tied to it)."""
    import copy

    from infer_quant_w8a8.schemes import QuantDtype, online_scheme

    scheme_name, _, only = scheme_name.partition(":")
    scheme_name, head = scheme_name.removesuffix("+head"), scheme_name.endswith("+head")
    model = copy.deepcopy(model)
    if scheme_name == "bf16":
        return model.to(torch.bfloat16)
    names = set(only.split(",")) if only else None
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if not isinstance(child, nn.Linear) or (name == "lm_head" and not head) or (names is not None and name not in names):
                continue
            if scheme_name.startswith("ct-"):
                setattr(module, name, CompressedTensorsLinear(child, scheme_name[3:]))
            else:
                dtype, _, weights = scheme_name.partition("-")
                setattr(module, name, W8A8Linear(child, online_scheme(QuantDtype(dtype)), weight_only=weights == "weights"))
    return model


@torch.no_grad()
def window_logits(model: nn.Module, windows: list[torch.Tensor]) -> list[torch.Tensor]:
    return [model(w.view(1, -1)).logits[0, :-1].float() for w in windows]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--text", type=Path, default=DEFAULT_TEXT)
    parser.add_argument("--window", type=int, default=1024)
    parser.add_argument("--min-tokens", type=int, default=4000)
    parser.add_argument("--schemes", nargs="+", default=[
        "bf16", "int8", "fp8", "int8-weights", "fp8-weights", "ct-W8A8", "ct-FP8_DYNAMIC", "int8+head", "fp8+head",
        "int8:q_proj,k_proj,v_proj", "int8:o_proj", "int8:gate_proj,up_proj", "int8:down_proj"])
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    from transformers import AutoModelForCausalLM

    from infer_core.testing import default_model_tokenizer
    from infer_core.models.gguf_cache import locate_model

    torch.manual_seed(0)
    source = locate_model(None, "auto", None)
    folder = source.path
    tokenizer = default_model_tokenizer()
    ids = torch.tensor(tokenizer.encode(args.text.read_text()))
    windows = [ids[i: i + args.window] for i in range(0, len(ids) - 1, args.window)]
    windows = [w for w in windows if len(w) > 1]
    scored = sum(len(w) - 1 for w in windows)
    if scored < args.min_tokens:
        raise SystemExit(f"{args.text} gives {scored} scored tokens, fewer than --min-tokens {args.min_tokens}")
    targets = torch.cat([w[1:] for w in windows])
    base = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    reference = torch.cat(window_logits(base, windows))
    reference_top1 = reference.argmax(-1)

    def perplexity(logits: torch.Tensor) -> float:
        return math.exp(float(torch.nn.functional.cross_entropy(logits, targets)))

    rows = [{"scheme": "none", "tokens": scored, "top1_agreement": 1.0, "perplexity": round(perplexity(reference), 4)}]
    print(rows[0], flush=True)
    for name in args.schemes:
        logits = torch.cat(window_logits(quantized_copy(base, name), windows))
        agree = float((logits.argmax(-1) == reference_top1).float().mean())
        ppl = perplexity(logits)
        rows.append({"scheme": name, "tokens": scored, "top1_agreement": round(agree, 5), "perplexity": round(ppl, 4),
                     "perplexity_vs_none": round(ppl / rows[0]["perplexity"], 5)})
        print(rows[-1], flush=True)
    if args.out is not None:
        settings = {"model": "SmolLM2-135M-Instruct (the embedded default, dequantized, float32)",
                    "text": str(args.text), "window": args.window, "path": "HF transformers + the plugin's CPU W8A8"}
        print("wrote", write_result("quant-quality-cpu", settings, rows, args.out), flush=True)


if __name__ == "__main__":
    main()
