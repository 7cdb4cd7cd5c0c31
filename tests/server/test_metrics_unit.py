"""ServerMetrics' bookkeeping, fed RequestOutputs directly (the end-to-end check is in test_load)."""

from __future__ import annotations

from infer_core.engine.engine_state import EngineSnapshot
from infer_core.interfaces import SpecDecodingStats
from infer_core.outputs import CompletionOutput, RequestMetrics, RequestOutput
from infer_core.server.metrics import ServerMetrics


def _sample(metrics: ServerMetrics, name: str) -> float:
    return metrics.registry.get_sample_value(f"infer:{name}", {"model_name": "m"}) or 0.0


def _output(step: int, finished: bool, metrics: RequestMetrics) -> RequestOutput:
    completions = [CompletionOutput(i, token_ids=list(range(step + 1)), delta_token_ids=[step],
                                    finish_reason="length" if finished else None) for i in range(2)]
    return RequestOutput("r", None, [1, 2], completions, finished=finished, metrics=metrics)


def test_each_of_n_completions_is_its_own_token_stream():
    metrics = ServerMetrics("m", EngineSnapshot)
    timing = RequestMetrics(arrival_time=10.0, first_scheduled_time=10.5, first_token_time=11.0)
    for step, now in enumerate((11.0, 11.25, 11.5)):
        metrics.observe([_output(step, step == 2, timing)], now)
    assert _sample(metrics, "time_to_first_token_seconds_count") == 1
    assert _sample(metrics, "time_to_first_token_seconds_sum") == 1.0
    assert _sample(metrics, "request_queue_time_seconds_sum") == 0.5
    assert _sample(metrics, "inter_token_latency_seconds_count") == 4  # 2 completions x 2 gaps
    assert _sample(metrics, "inter_token_latency_seconds_sum") == 1.0
    assert _sample(metrics, "e2e_request_latency_seconds_sum") == 1.5
    assert metrics._last_token_time == {} and metrics._first_token_seen == set()  # nothing kept after the end


def test_gauges_and_counters_come_from_the_snapshot():
    snapshot = EngineSnapshot(num_running=3, num_waiting=2, kv_usage=0.25, num_preemptions=1, prefix_queried_tokens=40,
                              prefix_hit_tokens=16, prompt_tokens=100, generation_tokens=50, finished={"stop": 4})
    metrics = ServerMetrics("m", lambda: snapshot)
    assert _sample(metrics, "num_requests_running") == 3 and _sample(metrics, "num_requests_waiting") == 2
    assert _sample(metrics, "kv_cache_usage_perc") == 0.25
    assert _sample(metrics, "prefix_cache_hits_total") == 16 and _sample(metrics, "prefix_cache_queries_total") == 40
    assert _sample(metrics, "num_preemptions_total") == 1
    assert _sample(metrics, "prompt_tokens_total") == 100 and _sample(metrics, "generation_tokens_total") == 50
    value = metrics.registry.get_sample_value("infer:request_success_total",
                                              {"model_name": "m", "finished_reason": "stop"})
    assert value == 4
    assert b"_created" not in metrics.render()


def test_speculative_decoding_counters_appear_with_a_speculative_policy():
    assert b"spec_decode" not in ServerMetrics("m", EngineSnapshot).render()  # standard decoding: none
    stats = SpecDecodingStats(num_drafts=10, num_draft_tokens=30, num_accepted_tokens=12, accepted_per_position=(7, 4, 1))
    metrics = ServerMetrics("m", lambda: EngineSnapshot(spec_decoding=stats))
    assert _sample(metrics, "spec_decode_num_drafts_total") == 10
    assert _sample(metrics, "spec_decode_num_draft_tokens_total") == 30
    assert _sample(metrics, "spec_decode_num_accepted_tokens_total") == 12
    per_position = [metrics.registry.get_sample_value("infer:spec_decode_num_accepted_tokens_per_pos_total",
                                                      {"model_name": "m", "position": str(p)}) for p in range(3)]
    assert per_position == [7, 4, 1]
    assert stats.acceptance_rate == 0.4 and stats.mean_acceptance_length == 2.2


def test_latency_buckets_count_a_value_on_a_bound_in_that_bucket_and_are_cumulative():
    metrics = ServerMetrics("m", EngineSnapshot)
    for value in (0.001, 0.0011, 0.3, 1000.0):
        metrics.inter_token_latency.observe(value)

    def bucket(le: str) -> float:
        return metrics.registry.get_sample_value("infer:inter_token_latency_seconds_bucket",
                                                 {"model_name": "m", "le": le})

    assert (bucket("0.001"), bucket("0.005"), bucket("0.25"), bucket("0.5"), bucket("640.0"), bucket("+Inf")) == (
        1, 2, 2, 3, 3, 4)
    assert _sample(metrics, "inter_token_latency_seconds_count") == 4
    assert abs(_sample(metrics, "inter_token_latency_seconds_sum") - 1000.3021) < 1e-9
