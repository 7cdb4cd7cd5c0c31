"""Load generators that measure a running server from the outside, as its users meet it.

``infer bench serve`` (:mod:`infer_core.bench.serve`) drives any OpenAI-compatible endpoint, so
infer and its peers (vLLM, SGLang, ...) are measured by the same client.
"""
