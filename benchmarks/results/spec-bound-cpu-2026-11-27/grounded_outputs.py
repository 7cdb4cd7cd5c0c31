from infer_core import LLM, SamplingParams
from benchmarks.spec_decode_ngram import workloads
llm = LLM(device="cpu", dtype="float32")
for name, chats in workloads().items():
    for chat in chats:
        o = llm.chat(chat, SamplingParams(temperature=0, max_tokens=256), use_tqdm=False)[0].outputs[0]
        print(name, len(o.token_ids), repr(o.text[:400]))
