"""Study: SmoothQuant-style smoothing before int8 / FP8 W8A8 of SmolLM2 (issue 26's 98% agreement bar)."""
import copy, math, sys
from pathlib import Path
import torch
from torch import nn
from benchmarks.quant_quality import quantized_copy, window_logits, DEFAULT_TEXT
from infer_core.testing import default_model_tokenizer
from infer_core.models.gguf_cache import locate_model
from transformers import AutoModelForCausalLM

torch.manual_seed(0)
torch.set_num_threads(2)
folder = locate_model(None, "auto", None).path
tok = default_model_tokenizer()
def windows_of(path, window=1024):
    ids = torch.tensor(tok.encode(Path(path).read_text()))
    w = [ids[i:i + window] for i in range(0, len(ids) - 1, window)]
    return [x for x in w if len(x) > 1]
evalw = windows_of(DEFAULT_TEXT)
calw = windows_of("/usr/share/common-licenses/Apache-2.0")[:3]
base = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
ref = torch.cat(window_logits(base, evalw)).argmax(-1)

# per-input-channel max |x| of each linear, on the calibration text
amax = {}
def hook(name):
    def f(mod, inp):
        x = inp[0].detach().reshape(-1, inp[0].shape[-1]).abs().amax(0)
        amax[name] = torch.maximum(amax[name], x) if name in amax else x
    return f
hs = [m.register_forward_pre_hook(hook(n)) for n, m in base.named_modules() if isinstance(m, nn.Linear)]
with torch.no_grad():
    for w in calw:
        base(w.view(1, -1))
for h in hs: h.remove()

def smoothed(alpha, down=True):
    m = copy.deepcopy(base)
    for i, layer in enumerate(m.model.layers):
        p = f"model.layers.{i}"
        a, mlp = layer.self_attn, layer.mlp
        groups = [(layer.input_layernorm, [a.q_proj, a.k_proj, a.v_proj], f"{p}.self_attn.q_proj"),
                  (layer.post_attention_layernorm, [mlp.gate_proj, mlp.up_proj], f"{p}.mlp.gate_proj")]
        for norm, lins, key in groups:
            wmax = torch.cat([l.weight.data for l in lins]).abs().amax(0).clamp(min=1e-5)
            s = (amax[key].clamp(min=1e-5) ** alpha / wmax ** (1 - alpha)).clamp(min=1e-5)
            norm.weight.data /= s
            for l in lins: l.weight.data *= s
        if down:
            key = f"{p}.mlp.down_proj"
            wmax = mlp.down_proj.weight.data.abs().amax(0).clamp(min=1e-5)
            s = (amax[key].clamp(min=1e-5) ** alpha / wmax ** (1 - alpha)).clamp(min=1e-5)
            mlp.up_proj.weight.data /= s[:, None]
            mlp.down_proj.weight.data *= s
    return m

def agree(model):
    return float((torch.cat(window_logits(model, evalw)).argmax(-1) == ref).float().mean())

print("tokens", len(ref), flush=True)
for alpha in [float(a) for a in sys.argv[1:]] or [0.5]:
    sm = smoothed(alpha)
    print(f"alpha {alpha}: smoothed fp32 {agree(sm):.5f}", flush=True)
    for scheme in ("int8", "fp8"):
        print(f"alpha {alpha}: {scheme} {agree(quantized_copy(sm, scheme)):.5f}", flush=True)
