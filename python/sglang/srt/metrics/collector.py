"""ServerMetrics: the Prometheus metrics of one server, in a registry of its own.

Names follow SGLang's (`sglang:` prefix, label `model_name`):

| metric | type | source |
|---|---|---|
| `sglang:time_to_first_token_seconds` | histogram | TokenizerManager, first output token of a request |
| `sglang:inter_token_latency_seconds` | histogram | TokenizerManager, gap between a request's tokens |
| `sglang:e2e_request_latency_seconds` | histogram | TokenizerManager, request finished |
| `sglang:prompt_tokens_total`, `sglang:generation_tokens_total`, `sglang:cached_tokens_total` | counter | finished requests |
| `sglang:num_requests_total`, `sglang:num_aborted_requests_total` | counter | finished requests |
| `sglang:cache_hit_rate` | gauge | cached / prompt tokens of finished requests (cumulative) |
| `sglang:num_running_reqs`, `sglang:num_queue_reqs` | gauge | scheduler `internal_state()` at scrape |
| `sglang:num_used_tokens`, `sglang:token_usage`, `sglang:max_total_num_tokens` | gauge | same (KV pool) |

With attention DP (dp_size > 1) these five scheduler gauges carry a `dp_rank` label too: one series
per replica (each replica has its own requests and KV pool).
| `sglang:pp_bubble_ratio{pp_stage}` | gauge | same, `pp_bubble_ratio` list (0 until PP reports it) |

Decode throughput (`sglang:gen_throughput`), retractions, queue time and the PD queue / KV-transfer
gauges: `scheduler_metrics.py`.

TTFT and E2E are measured from the moment the TokenizerManager registered the request (after
tokenization) to the arrival of the detokenized output; ITL is the gap between two output
messages divided evenly over the tokens the later one brought. All three are observed for every
request, streaming or not: the scheduler sends each request's first token on its own
(`scheduler_output.due_for_output`), so a non-streaming request gets an exact TTFT, and the rest
of its tokens, which arrive with its final message, share that message's gap as ITL.
"""

from __future__ import annotations

from typing import Any, Optional

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from sglang.srt.metrics.scheduler_metrics import SchedulerMetrics

CONTENT_TYPE = CONTENT_TYPE_LATEST

TTFT_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    15.0,
    20.0,
    25.0,
    30.0,
    40.0,
    50.0,
    60.0,
    90.0,
    120.0,
    180.0,
    240.0,
    300.0,
    400.0,
)
ITL_BUCKETS = (
    0.002,
    0.004,
    0.006,
    0.008,
    0.01,
    0.015,
    0.02,
    0.025,
    0.03,
    0.035,
    0.04,
    0.05,
    0.06,
    0.08,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.6,
    0.8,
    1.0,
    2.0,
    4.0,
    6.0,
    8.0,
)
E2E_BUCKETS = (
    0.1,
    0.2,
    0.4,
    0.6,
    0.8,
    1.0,
    2.0,
    4.0,
    6.0,
    8.0,
    10.0,
    20.0,
    40.0,
    60.0,
    80.0,
    100.0,
    150.0,
    200.0,
    300.0,
    400.0,
    600.0,
    1200.0,
)


class ServerMetrics:
    """Every metric of one server; `render()` gives the Prometheus text exposition."""

    def __init__(
        self,
        model_name: str,
        pp_size: int = 1,
        registry: Optional[CollectorRegistry] = None,
        dp_size: int = 1,
    ):
        self.registry = registry or CollectorRegistry(auto_describe=True)
        self.model_name = model_name
        self.pp_size = max(1, pp_size)
        self.dp_size = max(1, dp_size)
        labels = ["model_name"]
        reg = self.registry

        def hist(name: str, doc: str, buckets: tuple) -> Any:
            return Histogram(name, doc, labels, buckets=buckets, registry=reg).labels(model_name)

        def counter(name: str, doc: str) -> Any:
            return Counter(name, doc, labels, registry=reg).labels(model_name)

        def gauge(name: str, doc: str) -> Any:
            return Gauge(name, doc, labels, registry=reg).labels(model_name)

        def scheduler_gauge(name: str, doc: str) -> Any:
            """One series, or one per attention-DP replica (label dp_rank)."""
            if self.dp_size == 1:
                return [gauge(name, doc)]
            g = Gauge(name, doc, labels + ["dp_rank"], registry=reg)
            return [g.labels(model_name, str(d)) for d in range(self.dp_size)]

        self.ttft = hist(
            "sglang:time_to_first_token_seconds", "Time to first token in seconds.", TTFT_BUCKETS
        )
        self.itl = hist(
            "sglang:inter_token_latency_seconds", "Latency between output tokens in seconds.", ITL_BUCKETS
        )
        self.e2e = hist(
            "sglang:e2e_request_latency_seconds", "End-to-end request latency in seconds.", E2E_BUCKETS
        )
        self.prompt_tokens = counter("sglang:prompt_tokens", "Number of prompt tokens of finished requests.")
        self.generation_tokens = counter(
            "sglang:generation_tokens", "Number of generated tokens of finished requests."
        )
        self.cached_tokens = counter(
            "sglang:cached_tokens", "Number of prompt tokens served from the prefix cache."
        )
        self.num_requests = counter("sglang:num_requests", "Number of finished requests.")
        self.num_aborted = counter("sglang:num_aborted_requests", "Number of aborted requests.")
        self.cache_hit_rate = gauge(
            "sglang:cache_hit_rate", "Prefix cache hit rate (cached / prompt tokens)."
        )
        self.num_running = scheduler_gauge("sglang:num_running_reqs", "Number of running requests.")
        self.num_queue = scheduler_gauge(
            "sglang:num_queue_reqs", "Number of requests waiting in the scheduler queue."
        )
        self.num_used_tokens = scheduler_gauge(
            "sglang:num_used_tokens", "KV cache tokens held by running requests."
        )
        self.token_usage = scheduler_gauge("sglang:token_usage", "Fraction of the KV cache pool in use.")
        self.max_total_tokens = scheduler_gauge(
            "sglang:max_total_num_tokens", "Size of the KV cache pool in tokens."
        )
        self.bubble = Gauge(
            "sglang:pp_bubble_ratio",
            "Share of wall time a pipeline stage waited instead of computing (recent window).",
            ["model_name", "pp_stage"],
            registry=reg,
        )
        for stage in range(self.pp_size):
            self.bubble.labels(model_name, str(stage)).set(0.0)
        self.scheduler = SchedulerMetrics(model_name, reg, self.dp_size)
        self._prompt_total = 0
        self._cached_total = 0

    # ------------------------------------------------------------------ request events
    def observe_ttft(self, seconds: float) -> None:
        self.ttft.observe(max(seconds, 0.0))

    def observe_itl(self, gap_s: float, num_tokens: int) -> None:
        """One output message brought `num_tokens` tokens `gap_s` after the previous one."""
        if num_tokens <= 0:
            return
        per_token = max(gap_s, 0.0) / num_tokens
        for _ in range(num_tokens):
            self.itl.observe(per_token)

    def observe_finish(
        self, prompt_tokens: int, completion_tokens: int, cached_tokens: int, e2e_s: float, aborted: bool
    ) -> None:
        self.num_requests.inc()
        if aborted:
            self.num_aborted.inc()
        self.e2e.observe(max(e2e_s, 0.0))
        self.prompt_tokens.inc(prompt_tokens)
        self.generation_tokens.inc(completion_tokens)
        self.cached_tokens.inc(cached_tokens)
        self._prompt_total += prompt_tokens
        self._cached_total += cached_tokens
        if self._prompt_total:
            self.cache_hit_rate.set(self._cached_total / self._prompt_total)

    # ------------------------------------------------------------------ scheduler state
    def update_scheduler_state(self, state: dict, replica_states: Optional[list] = None) -> None:
        """Refresh the scheduler gauges from `Scheduler.internal_state()` (missing keys are skipped);
        with attention DP from each replica's state."""
        per_series = replica_states if self.dp_size > 1 and replica_states else [state]
        for i, s in enumerate(per_series[: len(self.num_running)]):
            if "num_running_reqs" in s:
                self.num_running[i].set(s["num_running_reqs"])
            if "num_waiting_reqs" in s:
                self.num_queue[i].set(s["num_waiting_reqs"])
            total = s.get("max_total_num_tokens")
            available = s.get("available_kv_tokens")
            if total and available is not None:
                used = max(total - available, 0)
                self.max_total_tokens[i].set(total)
                self.num_used_tokens[i].set(used)
                self.token_usage[i].set(used / total)
        self.scheduler.update(state, replica_states)
        ratios = state.get("pp_bubble_ratio") or []
        for stage in range(max(self.pp_size, len(ratios))):
            value = ratios[stage] if stage < len(ratios) and ratios[stage] is not None else 0.0
            self.bubble.labels(self.model_name, str(stage)).set(float(value))

    # ------------------------------------------------------------------ exposition
    def render(self) -> bytes:
        return generate_latest(self.registry)
