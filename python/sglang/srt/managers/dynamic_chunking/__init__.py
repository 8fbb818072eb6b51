"""Dynamic chunk sizes for chunked pipeline prefill (pure; no process groups, no torch).

- `ChunkSizePredictor`: upstream-compatible (`--enable-dynamic-chunking`,
  `SGLANG_DYNAMIC_CHUNKING_SMOOTH_FACTOR`).
- `AutoChunkPlanner`: `--dynamic-chunking-mode auto` (online fit, TTFT-minimising plans).
- `run_pipeline` / `uniform_makespan`: the ring timing both the planner and `tools/pp_sim` use.
See docs/dynamic_chunking.md.
"""

from sglang.srt.managers.dynamic_chunking.auto_planner import AutoChunkPlanner
from sglang.srt.managers.dynamic_chunking.config import MODES, build_chunk_policy, resolve_dynamic_chunking
from sglang.srt.managers.dynamic_chunking.latency_model import (
    ChunkSample,
    FitError,
    QuadraticLatencyModel,
    fit_cumulative,
    robust_fit_chunks,
)
from sglang.srt.managers.dynamic_chunking.pipeline import (
    PipelineTimeline,
    TransferModel,
    run_pipeline,
    uniform_makespan,
)
from sglang.srt.managers.dynamic_chunking.profiling import time_prefills
from sglang.srt.managers.dynamic_chunking.predictor import (
    ChunkSizePredictor,
    chunk_alignment,
    merge_stage_latencies,
    profile_lengths,
)

__all__ = [
    "AutoChunkPlanner",
    "ChunkSample",
    "ChunkSizePredictor",
    "FitError",
    "MODES",
    "PipelineTimeline",
    "QuadraticLatencyModel",
    "TransferModel",
    "build_chunk_policy",
    "chunk_alignment",
    "fit_cumulative",
    "merge_stage_latencies",
    "profile_lengths",
    "resolve_dynamic_chunking",
    "robust_fit_chunks",
    "run_pipeline",
    "time_prefills",
    "uniform_makespan",
]
