import sys, time, json, statistics
sys.path.insert(0, "/work/main")
from transformers import AutoTokenizer
from infer_core.builtin.grammar_xgrammar import XGrammarBackend
from infer_core.sampling_params import StructuredOutputs
from benchmarks.grammar_overhead import schema
streams = json.load(open("benchmarks/results/grammar-stop-token-cpu-2026-11-27/streams06.json"))
tok = AutoTokenizer.from_pretrained(sys.argv[1] if len(sys.argv) > 1 else "/tmp/g29/tok")
spec = StructuredOutputs(json=schema(32))
for stops in ([2], [151645], [2, 151645]):
    c = XGrammarBackend(None, tok, 151936, stops).compile(spec)
    costs = []
    for s in streams[:16]:
        m = c.matcher()
        for t in s:
            t0 = time.perf_counter(); m.accept(t); costs.append(time.perf_counter() - t0)
    print(stops, c.vocab_size, round(statistics.median(costs)*1e6, 2))
