"""Prometheus metrics under vLLM's names with the ``infer:`` prefix, labelled ``model_name``.

Gauges and counters are read at scrape time from the last snapshot of the engine core's counters
(a custom collector: nothing to update on the hot path); latency histograms are observed on the
event loop as each step's outputs arrive from the core, into ``LatencyHistogram``s: plain bucket
counts, a bisect per value, where prometheus_client's ``Histogram.observe`` takes a lock and walks
the buckets in Python (every output token of every stream passes here). Each app owns its
registry, so several apps can live in one process (tests).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, disable_created_metrics, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from infer_core.engine.engine_state import EngineSnapshot
from infer_core.engine.step_tally import StepTotals
from infer_core.interfaces import ParallelMetric
from infer_core.outputs import RequestOutput

disable_created_metrics()  # no *_created series, as vLLM: they double the scrape for no use
PREFIX = "infer:"
FINISH_REASONS = ("stop", "length", "abort")
_LATENCY_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                    20.0, 40.0, 80.0, 160.0, 640.0)


class _SnapshotCollector(Collector):
    def __init__(self, model_name: str, snapshot: Callable[[], EngineSnapshot],
                 parallel: Callable[[], list[ParallelMetric]]) -> None:
        self.model_name = model_name
        self.snapshot = snapshot
        self.parallel = parallel

    def collect(self) -> Iterator:
        s = self.snapshot()
        label = [self.model_name]

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            family = GaugeMetricFamily(PREFIX + name, doc, labels=["model_name"])
            family.add_metric(label, value)
            return family

        def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
            family = CounterMetricFamily(PREFIX + name, doc, labels=["model_name"])
            family.add_metric(label, value)
            return family

        yield gauge("num_requests_running", "Requests in the running batch.", s.num_running)
        yield gauge("num_requests_waiting", "Requests waiting to be scheduled.", s.num_waiting)
        yield gauge("kv_cache_usage_perc", "Share of KV-cache blocks in use (1 = full).", s.kv_usage)
        yield counter("prefix_cache_queries", "Prompt tokens looked up in the prefix cache.", s.prefix_queried_tokens)
        yield counter("prefix_cache_hits", "Prompt tokens found in the prefix cache.", s.prefix_hit_tokens)
        yield counter("num_preemptions", "Requests preempted to free KV blocks.", s.num_preemptions)
        yield counter("prompt_tokens", "Prompt tokens admitted.", s.prompt_tokens)
        yield counter("generation_tokens", "Tokens generated.", s.generation_tokens)
        yield from _step_timeline(self.model_name, s.core_steps)
        success = CounterMetricFamily(PREFIX + "request_success", "Completions finished, by finish reason.",
                                      labels=["model_name", "finished_reason"])
        for reason in sorted(set(FINISH_REASONS) | set(s.finished)):
            success.add_metric([self.model_name, reason], s.finished.get(reason, 0))
        yield success
        for metric in self.parallel():  # the parallel strategy's own series (expert parallelism's load)
            kind = CounterMetricFamily if metric.kind == "counter" else GaugeMetricFamily
            family = kind(PREFIX + metric.name, metric.documentation, labels=["model_name", metric.label])
            for label, value in metric.values:
                family.add_metric([self.model_name, label], value)
            yield family
        spec = s.spec_decoding
        if spec is not None:  # a speculative decoding policy: vLLM's spec_decode_* counters
            yield counter("spec_decode_num_drafts", "Verify steps of one request that carried draft tokens.",
                          spec.num_drafts)
            yield counter("spec_decode_num_draft_tokens", "Draft tokens verified.", spec.num_draft_tokens)
            yield counter("spec_decode_num_accepted_tokens", "Draft tokens accepted.", spec.num_accepted_tokens)
            per_position = CounterMetricFamily(PREFIX + "spec_decode_num_accepted_tokens_per_pos",
                                               "Draft tokens accepted, by their position in the draft.",
                                               labels=["model_name", "position"])
            for position, accepted in enumerate(spec.accepted_per_position):
                per_position.add_metric([self.model_name, str(position)], accepted)
            yield per_position


def _step_timeline(model_name: str, t: StepTotals) -> Iterator[CounterMetricFamily]:
    """The engine core's step timeline (engine/step_tally.py), which ``infer bench serve`` reads around a load point."""
    by_kind = (("engine_core_steps", "Engine-core steps, by kind (prefill: some prompt tokens).",
                t.prefill_steps, t.decode_steps),
               ("engine_core_step_tokens", "Tokens the engine core's steps scheduled, by kind.",
                t.prefill_tokens, t.decode_tokens),
               ("engine_core_step_seconds", "Seconds in the engine core's step calls, by the kind of step launched.",
                t.prefill_seconds, t.decode_seconds))
    for name, doc, prefill, decode in by_kind:
        family = CounterMetricFamily(PREFIX + name, doc, labels=["model_name", "kind"])
        family.add_metric([model_name, "prefill"], prefill)
        family.add_metric([model_name, "decode"], decode)
        yield family
    for name, doc, value in (
            ("engine_core_output_send_seconds", "Seconds the engine core spent sending its steps' outputs.",
             t.send_seconds),
            ("engine_core_busy_seconds", "Wall seconds the engine core's loop had work (a window's idle time is "
                                         "its length less these).", t.busy_seconds)):
        family = CounterMetricFamily(PREFIX + name, doc, labels=["model_name"])
        family.add_metric([model_name], value)
        yield family


class LatencyHistogram(Collector):
    """One histogram series (seconds, labelled ``model_name``): bucket counts and a sum, exported at scrape time."""

    def __init__(self, name: str, documentation: str, model_name: str,
                 buckets: tuple[float, ...] = _LATENCY_BUCKETS) -> None:
        self.name, self.documentation, self.model_name = PREFIX + name, documentation, model_name
        self.bounds = list(buckets)
        self.counts = [0] * (len(buckets) + 1)  # the last: above every bound (+Inf)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1  # le: a value on a bound counts in its bucket
        self.sum += value

    def collect(self) -> Iterator[HistogramMetricFamily]:
        family = HistogramMetricFamily(self.name, self.documentation, labels=["model_name"])
        cumulative, buckets = 0, []
        for bound, count in zip([*self.bounds, float("inf")], self.counts):
            cumulative += count
            buckets.append((floatToGoString(bound), cumulative))
        family.add_metric([self.model_name], buckets, self.sum)
        yield family


class ServerMetrics:
    """The app's registry; ``observe`` runs on the event loop with every step's outputs."""

    def __init__(self, model_name: str, snapshot: Callable[[], EngineSnapshot],
                 parallel: Callable[[], list[ParallelMetric]] = list) -> None:
        self.registry = CollectorRegistry()
        self.registry.register(_SnapshotCollector(model_name, snapshot, parallel))

        def histogram(name: str, doc: str) -> LatencyHistogram:
            series = LatencyHistogram(name, doc, model_name)
            self.registry.register(series)
            return series

        self.time_to_first_token = histogram("time_to_first_token_seconds", "Arrival to first token.")
        self.inter_token_latency = histogram("inter_token_latency_seconds", "Time between a request's outputs.")
        self.e2e_request_latency = histogram("e2e_request_latency_seconds", "Arrival to finish.")
        self.request_queue_time = histogram("request_queue_time_seconds", "Arrival to first scheduled.")
        self._last_token_time: dict[tuple[str, int], float] = {}  # (request, completion index) -> time
        self._first_token_seen: set[str] = set()

    def observe(self, outputs: list[RequestOutput], now: float) -> None:
        for output in outputs:
            metrics = output.metrics
            if metrics is None:
                continue
            rid = output.request_id
            if rid not in self._first_token_seen and metrics.first_token_time is not None:
                self._first_token_seen.add(rid)
                self.time_to_first_token.observe(metrics.first_token_time - metrics.arrival_time)
                if metrics.first_scheduled_time is not None:
                    self.request_queue_time.observe(max(0.0, metrics.first_scheduled_time - metrics.arrival_time))
            for completion in output.outputs:  # each of n completions is its own token stream
                if not completion.delta_token_ids:
                    continue
                key = (rid, completion.index)
                last = self._last_token_time.get(key)
                if last is not None:
                    self.inter_token_latency.observe(now - last)
                self._last_token_time[key] = now
            if output.finished:
                self._first_token_seen.discard(rid)
                for completion in output.outputs:
                    self._last_token_time.pop((rid, completion.index), None)
                self.e2e_request_latency.observe(now - metrics.arrival_time)

    def render(self) -> bytes:
        return generate_latest(self.registry)
