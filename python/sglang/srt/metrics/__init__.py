"""Prometheus metrics of the server (`--enable-metrics`, served at `/metrics`).

- `collector.ServerMetrics`: every metric of one server in a private registry. Request-level
  histograms and counters (TTFT, ITL, E2E, tokens) are fed by the TokenizerManager as results
  arrive; scheduler gauges (running / queued requests, KV usage, PP bubble ratio) are refreshed
  from the scheduler's `internal_state()` each time `/metrics` is scraped.
- `bubble.BubbleMeter`: idle/busy accounting a pipeline stage uses to report its bubble ratio.
"""
