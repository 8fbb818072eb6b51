"""Parts of the benchmark tools (`python -m sglang.bench_serving`, `bench_offline_throughput`,
`bench_one_batch`): datasets, HTTP backends, metrics and their SGLang-format summaries."""
