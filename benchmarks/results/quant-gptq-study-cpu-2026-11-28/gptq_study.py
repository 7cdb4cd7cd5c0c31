"""Study (issue 26's 98% agreement bar): llm-compressor's GPTQ, alone and after SmoothQuant, on SmolLM2's W8A8.

Run in a venv with llmcompressor (it pins transformers <= 5.17, so not the project's venv):
    /work/research/llmc/bin/python gptq_study.py
The embedded default's dequantized float32 checkpoint (safetensors), HF transformers. Calibration: the Apache-2.0,
MPL-2.0 and Artistic texts in 512-token sequences; evaluation: the GPL-3 text in 1,024-token windows (the windows of
``benchmarks.quant_quality``), teacher-forced top-1 agreement with the unquantized float32 model and the perplexity
ratio. After ``oneshot`` the model computes W8A8 as compressed-tensors simulates it (weights GPTQ-rounded to int8 per
channel, activations quantized per token in the forward), what its saved checkpoint gives.
"""

from __future__ import annotations

import math
import sys

import torch
from datasets import Dataset
from llmcompressor import oneshot
from llmcompressor.modifiers.quantization import GPTQModifier
from llmcompressor.modifiers.smoothquant import SmoothQuantModifier
from transformers import AutoModelForCausalLM, AutoTokenizer

FOLDER = "/work/research/smollm2-st"
LICENSES = "/usr/share/common-licenses/"


@torch.no_grad()
def logits_of(model, windows):
    return torch.cat([model(w.view(1, -1)).logits[0, :-1].float() for w in windows])


def main() -> None:
    torch.manual_seed(0)
    tok = AutoTokenizer.from_pretrained(FOLDER)
    ids = torch.tensor(tok(open(LICENSES + "GPL-3").read(), add_special_tokens=False).input_ids)
    windows = [w for w in (ids[i: i + 1024] for i in range(0, len(ids) - 1, 1024)) if len(w) > 1]
    targets = torch.cat([w[1:] for w in windows])
    base = AutoModelForCausalLM.from_pretrained(FOLDER, dtype=torch.float32).eval()
    ref = logits_of(base, windows)
    ref_top1 = ref.argmax(-1)
    ppl0 = math.exp(float(torch.nn.functional.cross_entropy(ref, targets)))
    print(f"eval tokens {len(targets)}, ppl {ppl0:.4f}", flush=True)
    calib = []
    for name in ("Apache-2.0", "MPL-2.0", "Artistic"):
        t = tok(open(LICENSES + name).read(), add_special_tokens=False).input_ids
        calib += [t[i: i + 512] for i in range(0, len(t) - 511, 512)]
    ds = Dataset.from_dict({"input_ids": calib, "attention_mask": [[1] * len(c) for c in calib]})
    print(f"calibration: {len(calib)} x 512 tokens", flush=True)
    configs = sys.argv[1:] or ["gptq", "sq0.5+gptq", "sq0.8+gptq"]
    for config in configs:
        model = AutoModelForCausalLM.from_pretrained(FOLDER, dtype=torch.float32)
        recipe = []
        if config.startswith("sq"):
            recipe.append(SmoothQuantModifier(smoothing_strength=float(config[2:].split("+")[0])))
        recipe.append(GPTQModifier(targets="Linear", scheme="W8A8", ignore=["lm_head"]))
        oneshot(model=model, dataset=ds, recipe=recipe, max_seq_length=512, num_calibration_samples=len(calib))
        model.eval()
        got = logits_of(model, windows)
        agree = float((got.argmax(-1) == ref_top1).float().mean())
        ppl = math.exp(float(torch.nn.functional.cross_entropy(got, targets)))
        print(f"RESULT {config}: int8 W8A8 top-1 agreement {agree:.5f}, perplexity {ppl:.4f} (x{ppl / ppl0:.4f})",
              flush=True)


if __name__ == "__main__":
    main()
