"""The benchmarks of docs/benchmarks.md as ``infer bench`` commands.

``infer bench serve`` (:mod:`infer_core.bench.serve`) measures a running server from the outside,
as its users meet it: it only speaks the OpenAI API, so infer and its peers (vLLM, SGLang, ...) are
measured by the same client. ``infer bench throughput`` (:mod:`infer_core.bench.throughput`) and
``infer bench latency`` (:mod:`infer_core.bench.latency`) run the offline workloads in-process,
with HF transformers peers and the physical floor as rows of the same record.
"""
